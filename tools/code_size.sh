#!/usr/bin/env bash
# The size goals of the library packages, per package: library files (tests, fuzz targets,
# benchmarks and test helpers left out), the largest, how many are over 800 lines, how many
# functions are over 100 lines (tools/longest_functions.py) and the longest. Run it on two
# checkouts to compare them (e.g. a git worktree of an older commit).
#   tools/code_size.sh [TREE]   (default: this checkout)
set -euo pipefail
source "$(dirname "$0")/flags.sh"
flags_positional "TREE" "the checkout to measure (default: this one)"
flags_parse "$@"
here=$(cd "$(dirname "$0")" && pwd)
tree=${FLAGS_ARGS[0]:-$here/..}
cd "$tree"
not_library='_test|_fuzz|_benchmark|/testing/|testing\.h|test_util|_perf\.cc'
echo "tree: $(pwd) at $(git log -1 --format=%h 2>/dev/null || echo '?')"
echo "| package | library files | largest | files > 800 lines | functions > 100 lines | longest function |"
echo "|---|---|---|---|---|---|"
for d in comm transport codecs kernels plugin python; do
  mapfile -t files < <(git ls-files "$d" | grep -E '\.(cc|h|cu|cuh)$' | grep -vE "$not_library")
  largest=$(for f in "${files[@]}"; do echo "$(wc -l <"$f") $f"; done | sort -n | tail -1)
  over=0
  for f in "${files[@]}"; do (($(wc -l <"$f") > 800)) && over=$((over + 1)); done
  functions=$(python3 "$here/longest_functions.py" --top 100000 --min 0 "$d" |
    grep -E '^ +[0-9]+ ' | grep -vE "$not_library|TEST")
  long=$(echo "$functions" | awk '$1 > 100' | grep -c . || true)
  longest=$(echo "$functions" | head -1 | awk '{print $1 " (" $2 ")"}')
  echo "| $d | ${#files[@]} | ${largest} | $over | $long | $longest |"
done
