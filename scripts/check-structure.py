#!/usr/bin/env python3
"""Structure checks CI runs over the sources (no build needed):

1. No import circle inside any crate: the file-level graph of item uses (`use` and paths through
   `crate::`, `super::`, `self::` and child modules), with re-exports followed to the module that defines
   the item and `pub use` facades not counted as uses, has no cycle.
2. No function in the runtime (`piper-burn/src/runtime/`) longer than 100 lines.

Exits 1 naming each circle (with the uses that make it) and each long function; 0 otherwise.
Usage: scripts/check-structure.py [REPO]
"""
import os
import re
import sys

IDENT = re.compile(r'^[A-Za-z_]\w*$')
MAX_RUNTIME_FN_LINES = 100


def crates(root):
    """{crate folder: its src/} for every Cargo package under `root` (target/ and .git/ skipped)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ('target', '.git')]
        if 'Cargo.toml' in files and os.path.isdir(os.path.join(dirpath, 'src')):
            out[dirpath] = os.path.join(dirpath, 'src')
    return out


def module_path(src, path):
    parts = os.path.relpath(path, src)[:-3].split(os.sep)
    return tuple(parts[:-1] if parts[-1] in ('mod', 'lib', 'main') else parts)


def strip(text):
    """Source without its unit-test module and comments."""
    text = re.sub(r'#\[cfg\(test\)\]\s*mod tests\s*\{.*', '', text, flags=re.S)
    return re.sub(r'//[^\n]*', '', text)


def expand(body):
    """A use tree `a::{b::C, D as E}` as segment lists (aliases dropped)."""
    body = re.sub(r'\s+', '', body)

    def rec(prefix, s):
        out, depth, cur, parts = [], 0, '', []
        for ch in s:
            depth += (ch == '{') - (ch == '}')
            if ch == ',' and depth == 0:
                parts.append(cur)
                cur = ''
            else:
                cur += ch
        if cur:
            parts.append(cur)
        for p in parts:
            if '{' in p:
                head, rest = p.split('{', 1)
                out += rec(prefix + [x for x in head.split('::') if x], rest[:rest.rfind('}')])
            else:
                out.append(prefix + [x for x in re.split(r'as(?=[A-Za-z_])', p)[0].split('::') if x])
        return out

    return rec([], body)


def import_graph(src):
    files = {}
    for dirpath, _, names in os.walk(src):
        for n in names:
            path = os.path.join(dirpath, n)
            if n.endswith('.rs') and f'{os.sep}bin{os.sep}' not in path:
                files[module_path(src, path)] = path
    mods = set(files)
    texts = {m: strip(open(p, encoding='utf-8').read()) for m, p in files.items()}

    def absolute(cur, segs):
        if not segs:
            return None
        if segs[0] == 'crate':
            return tuple(segs[1:])
        if segs[0] in ('self', 'super'):
            base, i = cur, 0
            while i < len(segs) and segs[i] in ('self', 'super'):
                base = base[:-1] if segs[i] == 'super' else base
                i += 1
            return base + tuple(segs[i:])
        return cur + tuple(segs) if cur + (segs[0],) in mods else None

    reexports = {}
    for m, t in texts.items():
        for body in re.findall(r'\bpub(?:\([a-z]+\))?\s+use\s+([^;]*);', t, re.S):
            for segs in expand(body):
                a = absolute(m, segs) if segs and segs[-1] != '*' else None
                if a:
                    reexports[(m, a[-1])] = a

    def defining(path, depth=0):
        for i in range(len(path), -1, -1):
            if path[:i] in mods:
                if i < len(path) and (path[:i], path[i]) in reexports and depth < 20:
                    return defining(reexports[(path[:i], path[i])] + path[i + 1:], depth + 1)
                return path[:i]
        return None

    edges = {m: {} for m in mods}
    for m, t in texts.items():
        uses = re.sub(r'\bpub(?:\([a-z]+\))?\s+use\s+[^;]*;', '', t, flags=re.S)
        paths = [segs for body in re.findall(r'\buse\s+([^;]*);', uses, re.S) for segs in expand(body)]
        rest = re.sub(r'\buse\s+[^;]*;', '', uses, flags=re.S)
        for kind, tail in re.findall(r'\b(crate|super|self)((?:::[A-Za-z_]\w*)+)', rest):
            paths.append([kind] + [p for p in tail.split('::') if p])
        for segs in paths:
            segs = [s for s in segs if IDENT.match(s)]
            a = absolute(m, segs)
            d = defining(a) if a is not None else None
            if d is not None and d != m:
                edges[m].setdefault(d, set()).add('::'.join(segs))
    return edges


def cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def long_functions(folder, limit):
    """(lines, file, line, name) of every `fn` body longer than `limit` lines."""
    found = []
    for dirpath, _, names in os.walk(folder):
        for n in sorted(names):
            if not n.endswith('.rs'):
                continue
            path = os.path.join(dirpath, n)
            lines = open(path, encoding='utf-8').read().split('\n')
            for i, line in enumerate(lines):
                m = re.match(r'\s*(pub(\([a-z]+\))?\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)', line)
                if not m:
                    continue
                depth, started, j = 0, False, i
                while j < len(lines):
                    code = re.sub(r'"(\\.|[^"\\])*"', '""', re.sub(r'//.*', '', lines[j]))
                    for ch in code:
                        if ch == '{':
                            depth, started = depth + 1, True
                        elif ch == '}':
                            depth -= 1
                    if (started and depth == 0) or (not started and code.rstrip().endswith(';')):
                        break
                    j += 1
                if started and j - i + 1 > limit:
                    found.append((j - i + 1, path, i + 1, m.group(5)))
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..')
    failures = 0
    name = lambda m: '::'.join(m) or '(crate root)'
    for crate, src in sorted(crates(root).items()):
        edges = import_graph(src)
        for comp in cycles(edges):
            failures += 1
            print(f"import circle in {os.path.relpath(crate, root)}: {sorted(name(m) for m in comp)}")
            for a in comp:
                for b, why in sorted(edges[a].items()):
                    if b in comp:
                        print(f"    {name(a)} uses {name(b)}: {', '.join(sorted(why)[:3])}")
    runtime = os.path.join(root, 'piper-burn', 'src', 'runtime')
    for n, path, line, fn in long_functions(runtime, MAX_RUNTIME_FN_LINES):
        failures += 1
        print(f"{os.path.relpath(path, root)}:{line}: fn {fn} is {n} lines (the runtime's limit is {MAX_RUNTIME_FN_LINES})")
    if failures:
        sys.exit(1)
    print("structure: no import circles; no runtime function over 100 lines")


if __name__ == '__main__':
    main()
