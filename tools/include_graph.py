#!/usr/bin/env python3
"""Finds include loops among LBCC's headers; checks the README's Layout block against BUILD files.

    tools/include_graph.py                            # every cycle, its chain; exit 1 if any
    tools/include_graph.py --allow "comm/a.h comm/b.h"  # a known cycle does not fail (see below)
    tools/include_graph.py --check-readme README.md   # each package's deps as BUILD says

Include loops: every `#include "..."` line of every .h/.cc/.cu/.cuh/.c under the source folders
(base codecs kernels transport comm plugin plan python bench tools tests examples) is resolved
against the tree root (then against the including file's folder). A header and the .cc/.cu files
of the same name beside it are one unit (named by the header): foo.cc including bar.h while bar.h
includes foo.h is a loop too, since neither pair builds or reads without the other. The units and
the includes between them form a graph, and every elementary cycle of it is printed as a chain
of files with the line of each include. An include inside #if counts: a loop that one
configuration closes is still a loop. --allow names a cycle (its files in order, any rotation,
space-separated) that is known and does not fail the run; an --allow that matches no cycle fails
the run, so the list only shrinks.

Layout check: the README's "## Layout" block has a line per top-level folder,

    comm/        communicator, collectives, C API         (base, codecs, kernels; tests: tools)

whose parenthesis lists the packages the folder's library targets reference, then after
"tests:" the further ones only its tests, benchmarks and test-only targets reference ("-" for
none); a parenthesis may go on over the indented lines below it. They are compared with the
`//package` labels of every BUILD.bazel under the folder (loads of build macros, visibility,
select() keys and third_party/ not counted; a target is test-side when its rule ends in _test,
its name in _test or _benchmark, or it is testonly). Every folder with a BUILD.bazel must have
its line.

Exit status: 0 clean, 1 a cycle or a Layout difference (each printed), 2 a usage error.
"""
import argparse
import ast
import os
import re
import sys

FOLDERS = ["base", "codecs", "kernels", "transport", "comm", "plugin", "plan", "python", "bench",
           "tools", "tests", "examples"]
SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh", ".c")
HEADER_SUFFIXES = (".h", ".cuh")
MAX_CYCLES = 1000  # a guard against a pathological graph, far above any real tree's count

_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def scan_includes(root, folders):
    """{file: [(line, included file)]} for every source file under `folders` (paths relative to
    root); includes that resolve to no file in the tree (system and third-party headers) are
    left out."""
    graph = {}
    for folder in folders:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "bazel-")))
            for name in sorted(filenames):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                edges = []
                with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                    for number, text in enumerate(f, 1):
                        m = _INCLUDE.match(text)
                        if not m:
                            continue
                        beside = os.path.join(os.path.dirname(path), m.group(1))
                        for candidate in (m.group(1), beside):
                            candidate = os.path.normpath(candidate)
                            if os.path.isfile(os.path.join(root, candidate)):
                                edges.append((number, candidate))
                                break
                graph[path] = edges
    return graph


def unit_graph(includes):
    """{unit: {included unit: (file, line)}}: the include graph among units, where a unit is a
    header together with the .cc/.cu files of the same name beside it (named by the header), and
    a file with no such header is a unit of its own. An edge keeps the first include that makes
    it, in file order."""
    stems = {os.path.splitext(p)[0]: p for p in includes if p.endswith(HEADER_SUFFIXES)}
    unit = lambda path: stems.get(os.path.splitext(path)[0], path)
    graph = {}
    for path in sorted(includes, key=lambda p: (unit(p), not p.endswith(HEADER_SUFFIXES), p)):
        targets = graph.setdefault(unit(path), {})
        for line, target in includes[path]:
            if unit(target) != unit(path) or target == path:
                targets.setdefault(unit(target), (path, line))
    return graph


def strongly_connected(graph):
    """Tarjan's components of `graph` ({node: iterable of nodes}), iteratively."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def cycles(graph):
    """Every elementary cycle of `graph`, each rotated to start at its smallest file, sorted.

    Within each strongly connected component, the cycles through its smallest node are found by
    depth-first search, then that node is dropped and the rest searched again (Johnson's order,
    without his blocking lists: component sizes here are a handful of files)."""
    found = []
    for component in strongly_connected(graph):
        members = set(component)
        if len(component) == 1 and component[0] not in graph.get(component[0], ()):
            continue
        for start in component:
            path = [start]

            def walk(node):
                for child in sorted(graph.get(node, ())):
                    if child not in members or len(found) >= MAX_CYCLES:
                        continue
                    if child == start:
                        found.append(tuple(path))
                    elif child not in path:
                        path.append(child)
                        walk(child)
                        path.pop()

            walk(start)
            members.discard(start)
    return sorted(found)


def canonical(cycle):
    """The rotation of `cycle` (a sequence of files) that starts at its smallest file."""
    i = cycle.index(min(cycle))
    return tuple(cycle[i:]) + tuple(cycle[:i])


def describe(cycle, graph):
    """'a.h:3 -> b.h, b.cc:7 -> a.h': for each unit, the file and line of its include of the
    next unit."""
    hops = []
    for i, u in enumerate(cycle):
        path, line = graph[u][cycle[(i + 1) % len(cycle)]]
        hops.append(f"{path}:{line} -> {cycle[(i + 1) % len(cycle)]}")
    return ", ".join(hops)


def check_cycles(root, allowed):
    graph = unit_graph(scan_includes(root, FOLDERS))
    found = cycles(graph)
    allowed = {canonical(a.split()) for a in allowed}
    bad = [c for c in found if c not in allowed]
    stale = sorted(allowed - set(found))
    for c in found:
        print(("known (allowed) " if c in allowed else "") + "include cycle: " + describe(c, graph))
    for a in stale:
        print("allowed cycle no longer exists (remove it from the allow-list): " + " ".join(a))
    print(f"{len(graph)} units, {sum(len(t) for t in graph.values())} include edges among them, "
          f"{len(found)} cycle(s), {len(bad)} not allowed")
    if len(found) >= MAX_CYCLES:
        print(f"stopped after {MAX_CYCLES} cycles")
    return 1 if bad or stale else 0


# ---- The README's Layout block ------------------------------------------------------------------

def _labels(node):
    """Every string constant under `node` that looks like a label ('//pkg...'), leaving out
    select() keys."""
    out = []
    if isinstance(node, ast.Dict):
        for value in node.values:
            out += _labels(value)
        return out
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if node.value.startswith("//") else []
    for child in ast.iter_child_nodes(node):
        out += _labels(child)
    return out


def _is_test_side(call):
    rule = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    name = keywords.get("name")
    name = name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else ""
    testonly = keywords.get("testonly")
    return (rule.endswith("_test") or name.endswith(("_test", "_benchmark"))
            or (isinstance(testonly, ast.Constant) and bool(testonly.value)))


def build_dependencies(root, folder):
    """(library packages, test-side packages) that the BUILD files under `folder` reference: the
    top-level folders of their '//pkg' labels, not counting `folder` itself, the root package,
    third_party/ and Bazel's //conditions."""
    library, tests = set(), set()
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "bazel-")))
        for name in filenames:
            if name not in ("BUILD.bazel", "BUILD"):
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), filename=path)
            for statement in tree.body:
                if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)):
                    continue  # assignments of shared lists are counted where a rule uses them
                call = statement.value
                rule = getattr(call.func, "id", "")
                if rule in ("load", "package", "package_group", "exports_files", "licenses"):
                    continue
                found = []
                for keyword in call.keywords:
                    if keyword.arg not in ("visibility", "default_visibility"):
                        found += _labels(keyword.value)
                found += _names_used(call, tree)
                packages = {label[2:].split(":")[0].split("/")[0] for label in found}
                packages -= {"", folder, "third_party", "conditions"}
                (tests if _is_test_side(call) else library).update(packages)
    return library, tests - library


def _names_used(call, tree):
    """Labels of module-level lists (`_PACKAGED = [...]`) that `call` refers to by name."""
    names = {n.id for n in ast.walk(call) if isinstance(n, ast.Name)}
    out = []
    for statement in tree.body:
        if isinstance(statement, ast.Assign):
            targets = {t.id for t in statement.targets if isinstance(t, ast.Name)}
            if targets & names:
                out += _labels(statement.value)
    return out


_LAYOUT_LINE = re.compile(r"^(?P<folders>(?:[a-z_]+/\s+)+)(?P<text>.*?)\s*"
                          r"\((?P<deps>[^()]*)\)\s*$")


def read_layout(readme):
    """{folder: (library set, tests set)} from the first code block after '## Layout'."""
    with open(readme, encoding="utf-8") as f:
        lines = f.read().splitlines()
    try:
        start = next(i for i, l in enumerate(lines) if l.strip() == "## Layout")
        start = next(i for i in range(start, len(lines)) if lines[i].startswith("```"))
        end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
    except StopIteration:
        raise ValueError(f"{readme}: no code block under '## Layout'")
    joined = []  # A parenthesis may go on over indented lines: each line with its continuation.
    for line in lines[start + 1:end]:
        if joined and joined[-1].count("(") > joined[-1].count(")") and line.startswith(" "):
            joined[-1] += " " + line.strip()
        else:
            joined.append(line)
    layout = {}
    for line in joined:
        m = _LAYOUT_LINE.match(line)
        if not m:
            continue
        library, _, tests = m.group("deps").partition(";")
        tests = tests.strip()
        if tests and not tests.startswith("tests:"):
            raise ValueError(f"{readme}: Layout line {line.strip()!r}: after ';' expected 'tests:'")
        split = lambda s: {p.strip() for p in s.split(",") if p.strip() and p.strip() != "-"}
        for folder in m.group("folders").split():
            layout[folder.rstrip("/")] = (split(library), split(tests[len("tests:"):]))
    return layout


def check_readme(root, readme):
    try:
        layout = read_layout(readme)
    except ValueError as e:
        print(e)
        return 1
    show = lambda s: ", ".join(sorted(s)) or "-"
    problems = []
    for folder in FOLDERS:
        if not any("BUILD.bazel" in files or "BUILD" in files
                   for _, _, files in os.walk(os.path.join(root, folder))):
            continue
        library, tests = build_dependencies(root, folder)
        if folder not in layout:
            problems.append(f"{folder}/ has no line in the Layout block; its BUILD files say "
                            f"({show(library)}; tests: {show(tests)})")
            continue
        said_library, said_tests = layout[folder]
        for kind, said, actual in (("library", said_library, library),
                                   ("tests", said_tests, tests)):
            if said != actual:
                problems.append(
                    f"{folder}/: the README's {kind} dependencies ({show(said)}) differ from its "
                    f"BUILD files' ({show(actual)}): missing {show(actual - said)}, "
                    f"not referenced {show(said - actual)}")
    for folder in sorted(set(layout) - set(FOLDERS) - {"third_party"}):
        problems.append(f"{folder}/ is in the Layout block but is not a source folder")
    for p in problems:
        print(p)
    print(f"{readme}: Layout block " + ("matches the BUILD files" if not problems
                                        else f"has {len(problems)} difference(s)"))
    return 1 if problems else 0


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--root", default=os.path.dirname(here),
                        help="the source tree (default: the folder above this script's)")
    parser.add_argument("--allow", action="append", default=[], metavar="CYCLE",
                        help="a known cycle, its files space-separated, that does not fail")
    parser.add_argument("--check-readme", metavar="README",
                        help="check this README's Layout block instead of looking for cycles")
    args = parser.parse_args()
    missing = [f for f in FOLDERS if not os.path.isdir(os.path.join(args.root, f))]
    if missing:
        print(f"include_graph.py: {args.root} is not the source tree: no {', '.join(missing)}",
              file=sys.stderr)
        return 2
    if args.check_readme:
        return check_readme(args.root, args.check_readme)
    return check_cycles(args.root, args.allow)


if __name__ == "__main__":
    sys.exit(main())
