"""Oracle for core/chat: the C ChatML renderer against SmolLM2's own Jinja
chat template, read from the model's GGUF metadata and rendered with jinja2 the
way Hugging Face transformers does (sandboxed environment, trim_blocks,
lstrip_blocks).

Needs: the chat_render helper ($DARKSERVE_BUILD/tests/helpers/chat_render),
the default model, and the jinja2 package. None of them is optional: a missing
one fails the test with a message saying what to do.
"""
import os
import functools
import random
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("DARKSERVE_BUILD", ROOT / "build"))
HELPER = BUILD / "tests" / "helpers" / "chat_render"
MODEL = Path(os.environ.get("DARKSERVE_MODEL",
                            ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))


def _jinja_env():
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        pytest.fail("jinja2 is not installed in this Python environment: the ChatML "
                    "oracle renders SmolLM2's Jinja chat template with it. Add "
                    "'jinja2' to tests/requirements.txt and rerun scripts/deps.sh.")
    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)


@functools.lru_cache(maxsize=None)
def _template_text():
    if not MODEL.exists():
        pytest.fail(f"model {MODEL} is missing: run `make model`")
    from gguf import GGUFReader
    field = GGUFReader(str(MODEL)).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def _helper():
    if not HELPER.exists():
        pytest.fail(f"{HELPER} is missing: build it with `make BUILD=<dir> "
                    f"<dir>/tests/helpers/chat_render` and set DARKSERVE_BUILD=<dir>")
    return str(HELPER)


def _render_c(template_file, messages, gen, extra=()):
    payload = b"".join(m["role"].encode() + b"\0" + m["content"].encode() + b"\0"
                       for m in messages)
    args = [_helper(), "--template", str(template_file)] + (["--gen"] if gen else []) + list(extra)
    proc = subprocess.run(args, input=payload, capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout.decode("utf-8")


def _conversations():
    fixed = [
        [],
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
         {"role": "user", "content": "What is 2+2?"}],
        [{"role": "assistant", "content": "I start."}],
        [{"role": "user", "content": "a"}, {"role": "system", "content": "late system"}],
        [{"role": "user", "content": "  spaces and\nnewlines\n\n"},
         {"role": "assistant", "content": "\tunicode: é ü 日本 🙂 {{ not jinja }} {% raw %}"}],
    ]
    rng = random.Random(1234)
    pieces = ["hello", " padded ", "two\nlines", "", "{{ x }}", "<|im_end|>", "é", "\n"]
    for _ in range(60):
        conv = []
        for _ in range(rng.randrange(1, 7)):
            conv.append({"role": rng.choice(["system", "user", "assistant"]),
                         "content": "".join(rng.choice(pieces)
                                            for _ in range(rng.randrange(0, 4)))})
        fixed.append(conv)
    return fixed


def test_smollm2_template_detected(tmp_path):
    text = _template_text()
    tfile = tmp_path / "template.jinja"
    tfile.write_text(text, encoding="utf-8")
    proc = subprocess.run([_helper(), "--template", str(tfile), "--info"],
                          capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    head, default = proc.stdout.decode("utf-8").split("\n", 1)
    assert head.startswith("kind=chatml fallback=0 ")
    # The default system prompt is the one the template writes for a
    # conversation without a system message.
    env = _jinja_env()
    rendered = env.from_string(text).render(messages=[{"role": "user", "content": "x"}],
                                            add_generation_prompt=False)
    expected = rendered.split("<|im_start|>system\n", 1)[1].split("<|im_end|>", 1)[0]
    assert default[:-1] == expected


@pytest.mark.parametrize("gen", [False, True])
def test_chatml_matches_smollm2_jinja(tmp_path, gen):
    text = _template_text()
    tfile = tmp_path / "template.jinja"
    tfile.write_text(text, encoding="utf-8")
    tmpl = _jinja_env().from_string(text)
    for conv in _conversations():
        want = tmpl.render(messages=conv, add_generation_prompt=gen,
                           bos_token="<|im_start|>", eos_token="<|im_end|>")
        got = _render_c(tfile, conv, gen)
        assert got == want, f"conversation {conv!r}"


def test_chatml_continuation_matches_jinja(tmp_path):
    """A session's continuation equals the Jinja render of the longer
    conversation minus the part the session already holds."""
    text = _template_text()
    tfile = tmp_path / "template.jinja"
    tfile.write_text(text, encoding="utf-8")
    tmpl = _jinja_env().from_string(text)
    old = [{"role": "user", "content": "Hi"}]
    answer = "Hello! How can I help?"
    new = [{"role": "user", "content": "Tell me a joke."}]
    held = tmpl.render(messages=old, add_generation_prompt=True) + answer
    full = tmpl.render(messages=old + [{"role": "assistant", "content": answer}] + new,
                       add_generation_prompt=True)
    assert full.startswith(held)
    got = _render_c(tfile, new, True, ["--continue", "--open"])
    assert got == full[len(held):]
