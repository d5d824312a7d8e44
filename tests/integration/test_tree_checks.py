"""The tree's structure checks (docs/DESIGN.md §1): scripts/check_layers.sh
(which module may include which) and scripts/check_cycles.py (no circle of
calls between files of different modules). Each is run on the real tree and
on small made-up trees that break one rule, which it must catch."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("DARKSERVE_BUILD", os.path.join(ROOT, "build"))


def make_tree(tmp_path, files):
    """A scratch repository root with the scripts and the given files."""
    root = tmp_path / "tree"
    (root / "scripts").mkdir(parents=True)
    for s in ("check_layers.sh", "check_cycles.py"):
        shutil.copy(os.path.join(ROOT, "scripts", s), root / "scripts" / s)
    for layer in ("core", "proto", "server"):
        (root / layer).mkdir(exist_ok=True)
    for path, text in files.items():
        p = root / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def compile_tree(root):
    for dirpath, _, names in os.walk(root):
        for n in names:
            if n.endswith(".c"):
                src = os.path.join(dirpath, n)
                rel = os.path.relpath(src, root)
                obj = root / "build" / (rel[:-2] + ".o")
                obj.parent.mkdir(parents=True, exist_ok=True)
                subprocess.run(["cc", "-c", "-I", str(root), "-o", str(obj), src], check=True)


def run(root, *args):
    return subprocess.run(list(args), cwd=root, capture_output=True, text=True)


def test_layers_real_tree_ok():
    p = run(ROOT, "bash", "scripts/check_layers.sh")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "check-layers: ok" in p.stdout


@pytest.mark.parametrize("path,include,why", [
    ("server/http/x.c", "server/api/api.h", "server/http/ builds on server/base/ only"),
    ("server/cli/x.c", "server/engine/engine.h", "never through its modules"),
    ("server/base/x.c", "server/http/http.h", "nothing else of server/"),
    ("core/kernels/x.c", "core/attn/attn.h", "core/kernels/ uses only"),
    ("core/text/x.c", "core/model.h", "knows no attention or kernels"),
    ("core/x.c", "server/base/log.h", "core must not include"),
])
def test_layers_catch_a_wrong_include(tmp_path, path, include, why):
    root = make_tree(tmp_path, {path: f'#include "{include}"\n'})
    p = run(root, "bash", "scripts/check_layers.sh")
    assert p.returncode == 1, p.stdout
    assert f"{path}:1:" in p.stdout and why in p.stdout, p.stdout


def test_cycles_real_tree_ok():
    p = run(ROOT, "python3", "scripts/check_cycles.py", "--build", BUILD)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "check-cycles: ok" in p.stdout


TWO_MODULES = {
    "core/x/a.h": "int a_fn(int);\n",
    "core/y/b.h": "int b_fn(int);\n",
    "core/x/a.c": '#include "core/x/a.h"\n#include "core/y/b.h"\n'
                  "int a_fn(int v) { return v > 0 ? b_fn(v - 1) : 0; }\n",
    "core/y/b.c": '#include "core/y/b.h"\n#include "core/x/a.h"\n'
                  "int b_fn(int v) { return a_fn(v); }\n",
}


def test_cycles_catch_a_circle_across_modules(tmp_path):
    root = make_tree(tmp_path, TWO_MODULES)
    compile_tree(root)
    p = run(root, "python3", "scripts/check_cycles.py")
    assert p.returncode == 1, p.stdout
    assert "core/x/a.c <-> core/y/b.c" in p.stdout
    assert "crosses modules core/x, core/y" in p.stdout


def test_cycles_catch_a_circle_inside_a_module(tmp_path):
    files = {k.replace("core/y/", "core/x/"): v.replace("core/y/", "core/x/")
             for k, v in TWO_MODULES.items()}
    root = make_tree(tmp_path, files)
    compile_tree(root)
    p = run(root, "python3", "scripts/check_cycles.py")
    assert p.returncode == 1, p.stdout
    assert "not in scripts/check_cycles.py's ALLOWED list" in p.stdout


def test_cycles_one_way_is_fine(tmp_path):
    files = dict(TWO_MODULES)
    files["core/y/b.c"] = '#include "core/y/b.h"\nint b_fn(int v) { return v; }\n'
    root = make_tree(tmp_path, files)
    compile_tree(root)
    p = run(root, "python3", "scripts/check_cycles.py", "--list")
    assert p.returncode == 0, p.stdout
    assert "core/x/a.c -> core/y/b.c" in p.stdout
    assert "core/y/b.c -> core/x/a.c" not in p.stdout


def test_cycles_usage_and_missing_objects(tmp_path):
    root = make_tree(tmp_path, TWO_MODULES)
    p = run(root, "python3", "scripts/check_cycles.py", "--bogus")
    assert p.returncode == 2 and "unknown argument" in p.stderr
    p = run(root, "python3", "scripts/check_cycles.py")  # nothing compiled
    assert p.returncode == 2 and "run make first" in p.stderr
