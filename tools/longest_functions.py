#!/usr/bin/env python3
"""Lists the longest C++ function bodies under the given folders (lines from signature to '}').

    tools/longest_functions.py comm codecs transport          # top 5 per folder
    tools/longest_functions.py --top 20 --min 80 comm

A heuristic, not a parser: comments and string literals are blanked, then every '{' opened
outside a function body whose preceding text has a parameter list and is not a class, struct,
union, enum, namespace or initialiser starts a function; lambdas and local classes count toward
the function that holds them. Good enough to compare before and after.
"""
import argparse
import os
import re
import sys

_NOT_FUNCTION = re.compile(r"^\s*(template\s*<.*>\s*)?(class|struct|union|enum|namespace|extern)\b")


def _blank(text):
    """Comments and string/char literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            if m:
                end = text.find(")" + m.group(1) + '"', i)
                end = n if end < 0 else end + len(m.group(1)) + 2
                out.append(re.sub(r"[^\n]", " ", text[i:end]))
                i = end
            else:
                out.append(c)
                i += 1
        elif c in "\"'":
            if c == "'" and i > 0 and (text[i - 1].isalnum()):  # digit separator 1'000
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    """(lines, first line, signature) of every function body in `path`."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = _blank(f.read())
    found = []
    depth = 0  # brace depth
    function_depth = None  # depth at which the current function body opened
    start_line = 0
    signature = ""
    header_start = 0  # offset just after the last ';', '{' or '}' outside a function
    line = 1
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == "{":
            if function_depth is None:
                head = text[header_start:i]
                flat = " ".join(head.split())
                flat = re.sub(r"^((public|private|protected)\s*:\s*|using [^;]*;\s*)+", "", flat)
                if ("(" in flat and not _NOT_FUNCTION.match(flat) and not flat.rstrip().endswith("=")
                        and not re.search(r"=\s*$", flat) and not flat.startswith("#")):
                    function_depth = depth
                    lead = len(head) - len(head.lstrip())
                    start_line = line - head[lead:].count("\n")
                    signature = flat[:100]
            depth += 1
            if function_depth is None:
                header_start = i + 1
        elif c == "}":
            depth -= 1
            if function_depth is not None and depth == function_depth:
                found.append((line - start_line + 1, start_line, signature))
                function_depth = None
            if function_depth is None:
                header_start = i + 1
        elif c == ";" and function_depth is None:
            header_start = i + 1
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--min", type=int, default=0, help="only functions at least this long")
    args = parser.parse_args()
    for folder in args.folders:
        rows = []
        for root, _, files in os.walk(folder):
            for name in files:
                if name.endswith((".cc", ".h", ".cu")):
                    path = os.path.join(root, name)
                    rows += [(n, path, l, s) for n, l, s in functions(path)]
        rows.sort(reverse=True)
        print(f"{folder}:")
        for n, path, l, s in [r for r in rows if r[0] >= args.min][:args.top]:
            print(f"  {n:5d}  {path}:{l}  {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
