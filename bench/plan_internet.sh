#!/usr/bin/env bash
# Internet scale on paper: `lbcc plan simulate` for 16 to 1,024 participants (full replicas)
# with access links drawn log-uniform 50 Mbit/s - 1 Gbit/s down, asymmetric up (down x
# U(0.2, 1)), models of 1B, 8B and 70B parameters, two layouts (every participant on its own
# links; sites of 8 behind one shared link), each exchange algorithm forced and the table's
# choice. Writes bench/results/plan_internet.md (date, machine, command, assumptions, where
# the time goes, which algorithm wins where) and bench/results/plan_internet.png.
#
#   bench/plan_internet.sh [--seed N] [--participants 16,32,...] [any `lbcc plan simulate` option]
#
# No network or root needed: the planning model only. Builds //tools:lbcc.
set -euo pipefail
cd "$(dirname "$0")/.."
cmdline="bench/plan_internet.sh $*"
args=()
while (($#)); do
  case "$1" in
    -h|--help) sed -n "2,12p" "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --*=*) args+=("$1") ;;
    --*) args+=("$1=$2"); shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
bazel build --jobs=2 //tools:lbcc >/dev/null 2>&1 || bazel build --jobs=2 //tools:lbcc
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bazel-bin/tools/lbcc plan simulate --output="$out/rows.json" "${args[@]}" 2>"$out/progress.log"
bazel-bin/tools/lbcc plan simulate --help > "$out/usage.txt"
"${LBCC_PYTHON:-/usr/bin/python3}" plan/report_internet.py "$out/rows.json" "$cmdline" \
  bench/results/plan_internet.md bench/results/plan_internet.png
