#!/usr/bin/env python3
"""Passkey retrieval, now `tools/recall.py --tasks passkey` (docs/QUALITY.md,
"Recall"): a 5-digit key hidden at a depth of a filler from the calibration
corpus, asked as a chat turn of a `darkserve serve` this tool starts.

    passkey.py [--lengths 1024,4096,16384] [--depths 0.1,0.5,0.9] [--trials 20] \\
               [--bin build/darkserve] [--seed 1234] [--out results.json] -- [serve flags]

Every recall.py option works (--url, --max-seconds, --compare, ...). Flags
after `--` go to `darkserve serve` (before recall.py they went to `darkserve
generate`; the attention flags, e.g. `--attn exact`, are the same). The
default lengths stay 1024,4096,16384.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import recall  # noqa: E402


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    # given options come after these defaults, so they win
    return recall.main(["--tasks", "passkey", "--lengths", "1024,4096,16384"] + argv)


if __name__ == "__main__":
    sys.exit(main())
