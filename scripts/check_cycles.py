#!/usr/bin/env python3
"""make check-cycles: lists the circles of calls between the project's .c files.

A file A depends on a file B when A's object refers to a symbol that B's
object defines (read from `nm` over the built objects: the symbol table) and
A includes a header that declares it (the #include lines, so a call through a
function pointer a header never names is not a dependency). Two files that
depend on each other, directly or through others, form a circle: neither can
be read, tested or replaced without the other, which is what module
boundaries are for.

Every strongly connected component of more than one file is printed. A circle
between files of different modules (folders) always fails; one inside a
module fails unless ALLOWED lists exactly its files with the reason it is one
piece. Exit 0 when nothing new is found, 1 otherwise, 2 on a usage error.

usage: scripts/check_cycles.py [--build DIR] [--list]
  --build DIR  where `make` put the objects (default build)
  --list       print every dependency edge as well
"""
import os
import re
import subprocess
import sys

LAYERS = ("core", "proto", "server")

# Circles accepted inside one module, each with why its files are one piece.
# Keys are sorted tuples of paths relative to the repository root.
ALLOWED = {}

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def usage(msg):
    print(f"check-cycles: {msg}\n{__doc__.split('usage: ')[1]}", file=sys.stderr)
    sys.exit(2)


def sources(root):
    out = []
    for layer in LAYERS:
        for d, _, files in os.walk(os.path.join(root, layer)):
            for f in files:
                if f.endswith(".c") and not (layer == "server" and f == "embed.c"):
                    out.append(os.path.relpath(os.path.join(d, f), root))
    return sorted(out)


def symbols(obj):
    """(defined, undefined) global symbol names of one object file."""
    res = subprocess.run(["nm", "-g", "--defined-only", obj], capture_output=True, text=True,
                         check=True)
    defined = {l.split()[-1] for l in res.stdout.splitlines() if len(l.split()) == 3}
    res = subprocess.run(["nm", "-g", "--undefined-only", obj], capture_output=True, text=True,
                         check=True)
    undefined = {l.split()[-1] for l in res.stdout.splitlines() if l.split()}
    return defined, undefined


def header_closure(root, path, cache):
    """Every project header a file includes, directly or through others."""
    if path in cache:
        return cache[path]
    cache[path] = set()
    try:
        with open(os.path.join(root, path), encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return cache[path]
    seen = set()
    for inc in INCLUDE.findall(text):
        if inc.split("/")[0] in LAYERS and os.path.exists(os.path.join(root, inc)):
            seen.add(inc)
            seen |= header_closure(root, inc, cache)
    cache[path] = seen
    return seen


def declares(root, header, name, cache):
    key = (header, name)
    if key not in cache:
        with open(os.path.join(root, header), encoding="utf-8") as fh:
            cache[key] = re.search(r"\b%s\b" % re.escape(name), fh.read()) is not None
    return cache[key]


def strongly_connected(nodes, edges):
    """Tarjan's algorithm, iterative; components of more than one node."""
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(tuple(sorted(comp)))
    return sorted(comps)


def main(argv):
    build, show = "build", False
    i = 0
    while i < len(argv):
        if argv[i] == "--build" and i + 1 < len(argv):
            build, i = argv[i + 1], i + 2
        elif argv[i] == "--list":
            show, i = True, i + 1
        else:
            usage(f"unknown argument '{argv[i]}'")
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    build = os.path.join(root, build) if not os.path.isabs(build) else build
    files = sources(root)
    defs, undefs = {}, {}
    for src in files:
        obj = os.path.join(build, src[:-2] + ".o")
        if not os.path.exists(obj):
            print(f"check-cycles: {obj} is missing: run make first", file=sys.stderr)
            return 2
        defs[src], undefs[src] = symbols(obj)
    owner = {}
    for src, names in defs.items():
        for n in names:
            owner.setdefault(n, src)
    edges, inc_cache, decl_cache = {}, {}, {}
    for src in files:
        headers = header_closure(root, src, inc_cache)
        for n in undefs[src]:
            dst = owner.get(n)
            if dst is None or dst == src:
                continue
            if any(declares(root, h, n, decl_cache) for h in headers):
                edges.setdefault(src, set()).add(dst)
    if show:
        for src in files:
            for dst in sorted(edges.get(src, ())):
                print(f"{src} -> {dst}")
    bad = 0
    comps = strongly_connected(files, edges)
    for comp in comps:
        modules = {os.path.dirname(f) for f in comp}
        why = ALLOWED.get(comp)
        if len(modules) > 1:
            verdict = "FAIL: crosses modules " + ", ".join(sorted(modules))
            bad = 1
        elif why:
            verdict = "allowed: " + why
        else:
            verdict = "FAIL: not in scripts/check_cycles.py's ALLOWED list"
            bad = 1
        print(f"check-cycles: circle {' <-> '.join(comp)}  ({verdict})")
    if bad:
        print("check-cycles: FAILED")
        return 1
    print(f"check-cycles: ok ({len(files)} files, {sum(map(len, edges.values()))} edges, "
          f"{len(comps)} allowed circles)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
