"""The shipped Flexformer adapters (models/adapters/, `make adapter
KIND=flexformer-s|flexformer-n`: learned frequencies on the input sphere,
docs/DESIGN.md "Flexformer: learned Fourier features") improve held-out
perplexity over the untrained kinds (Performer's trigonometric estimator)
on a short slice of tests/data/heldout.txt, at the window and sinks they
were trained with, and the perplexity command reports the sphere's
denominator counters for them.
"""
import os
import re
import subprocess

import pytest

from ds_server import BIN, MODEL, ROOT

DATA = os.environ.get("DARKSERVE_DATA", os.path.join(ROOT, "tests", "data"))
ADAPTERS = os.path.join(ROOT, "models", "adapters")
RUN_S = 600
# the linear branch acts on the positions past W + S = 272 of each chunk
FLAGS = ["--limit", "768", "--chunk", "768", "--threads", "2", "--features", "128",
         "--window", "256", "--sinks", "16", "--prerope", "1"]


def perplexity(*args):
    assert os.access(BIN, os.X_OK), f"{BIN} missing: build it first (make)"
    if not os.path.exists(MODEL):
        pytest.skip(f"{MODEL} missing (make model)")
    p = subprocess.run([BIN, "perplexity", "--model", MODEL, "--file",
                        os.path.join(DATA, "heldout.txt")] + FLAGS + list(args),
                       capture_output=True, text=True, timeout=RUN_S)
    assert p.returncode == 0, p.stderr
    m = re.search(r"^perplexity: ([0-9.]+) tokens: \d+$", p.stdout, re.M)
    assert m, p.stdout
    return float(m.group(1)), p.stderr


@pytest.mark.parametrize("kind", ["flexformer-n", "flexformer-s"])
def test_shipped_adapter_beats_untrained(kind):
    adapter = os.path.join(ADAPTERS, f"SmolLM2-135M-Instruct.Q4_1.{kind}.gguf")
    assert os.path.exists(adapter), f"{adapter} missing"
    untrained, _ = perplexity("--attn", kind)
    trained, err = perplexity("--attn", kind, "--adapter", adapter)
    assert trained < untrained / 100, (kind, trained, untrained)
    # the counters of the signed denominators are printed for these kinds
    assert re.search(r"^signed denominators: \d+ rows with a linear part", err, re.M), err
