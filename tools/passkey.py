#!/usr/bin/env python3
"""Passkey retrieval (docs/QUALITY.md): a 5-digit number hidden at a depth of
a filler text of about N tokens, asked for as a chat turn (the model's chat
template); the model, greedy, must say it back (the first 5-digit number of
its answer).

    passkey.py --lengths 1024,4096,16384 --depths 0.1,0.5,0.9 --trials 20 \
               [--bin build/darkserve] [--out results.json] -- [darkserve generate flags]

Flags after `--` go to `darkserve generate` (e.g. `--attn exact`). Filler
lengths are approximate: sentences are added until the prompt has about N
tokens at ~10 tokens a sentence. The passkeys come from a fixed seed, so
runs of different configurations see the same prompts. Prints a table of
accuracy per (length, depth) and writes every trial to --out.
"""
import argparse
import json
import random
import re
import subprocess
import sys

FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
          "There and back again. ")  # 5 sentences, about 25 tokens


def prompt_for(n_tokens, depth, key):
    reps = max(1, n_tokens // 25)
    at = int(reps * depth)
    needle = "The pass key is %d. Remember it. %d is the pass key. " % (key, key)
    body = FILLER * at + needle + FILLER * (reps - at)
    return ("There is an important piece of information hidden inside a lot of irrelevant "
            "text. Find it and memorize it.\n\n" + body + "\n\nWhat is the pass key?")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="1024,4096,16384")
    ap.add_argument("--depths", default="0.1,0.5,0.9")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--bin", default="build/darkserve")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out")
    ap.add_argument("rest", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    extra = a.rest[1:] if a.rest[:1] == ["--"] else a.rest
    rng = random.Random(a.seed)
    rows, table = [], {}
    for n in [int(x) for x in a.lengths.split(",")]:
        for d in [float(x) for x in a.depths.split(",")]:
            ok = 0
            for t in range(a.trials):
                key = rng.randint(10000, 99999)
                cmd = [a.bin, "generate", "--chat", "--prompt", prompt_for(n, d, key),
                       "--max-tokens", "16", "--temperature", "0", "--quiet"] + extra
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    sys.exit("passkey: %s failed: %s" % (a.bin, r.stderr.strip()[-500:]))
                got = re.findall(r"\d{5}", r.stdout)
                hit = bool(got) and int(got[0]) == key
                ok += hit
                rows.append({"tokens": n, "depth": d, "key": key, "output": r.stdout.strip(),
                             "correct": hit})
            table[(n, d)] = ok
            print("length %6d depth %.1f: %d/%d" % (n, d, ok, a.trials), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": extra, "trials": rows}, f, indent=1)


if __name__ == "__main__":
    main()
