#!/usr/bin/env python3
"""Lists the longest C++ function bodies (lambdas counted inside their function) in packages.

    tools/function_lengths.py [--top N] [--max LINES] DIR...

A function is a top-level `{ ... }` block (at namespace or class scope) whose header ends in
`)`, `) const`, `) override` and the like. Comments and string literals are skipped. With
--max, exits 1 when a function is longer (a check for the house limit of ~120 lines).
"""
import argparse
import pathlib
import re
import sys

HEADER_END = re.compile(r"\)\s*(const|override|final|noexcept|mutable|->[^{;]*|\s)*$")


def strip(text):
    """Blanks comments and string/char literals, keeping newlines."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i)); i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (j + 1 - i)); i = j + 1
        else:
            out.append(c); i += 1
    return "".join(out)


def functions(path):
    text = strip(path.read_text(errors="replace"))
    depth, scope_kinds, start, header = 0, [], None, ""
    i = 0
    results = []
    for i, c in enumerate(text):
        if c == "{":
            before = text[max(0, i - 300):i]
            is_function = start is None and bool(HEADER_END.search(before.rstrip()))
            if is_function:
                start = (i, text.count("\n", 0, i) + 1, before.strip().splitlines()[-1].strip()
                         if before.strip() else "")
                scope_kinds.append("f")
            else:
                scope_kinds.append("f-inner" if start is not None else "scope")
        elif c == "}" and scope_kinds:
            kind = scope_kinds.pop()
            if kind == "f":
                end_line = text.count("\n", 0, i) + 1
                results.append((end_line - start[1] + 1, start[1], start[2]))
                start = None
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--max", type=int, default=0, help="exit 1 if a function is longer")
    ap.add_argument("--no-tests", action="store_true", help="skip *_test.cc, *_benchmark.cc")
    args = ap.parse_args()
    rows = []
    for d in args.dirs:
        for p in sorted(pathlib.Path(d).rglob("*")):
            if p.suffix not in (".cc", ".h", ".cu"):
                continue
            if args.no_tests and re.search(r"_(test|benchmark|fuzz)\.cc$", p.name):
                continue
            for lines, line, head in functions(p):
                rows.append((lines, f"{p}:{line}", head[:90]))
    rows.sort(reverse=True)
    for lines, where, head in rows[: args.top]:
        print(f"{lines:5d}  {where}  {head}")
    if args.max and rows and rows[0][0] > args.max:
        print(f"longest function {rows[0][0]} lines > {args.max}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
