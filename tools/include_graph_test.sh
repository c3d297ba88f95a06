#!/usr/bin/env bash
# No include loop in any package, and the README's Layout block true to the BUILD files, checked
# by tools/include_graph.py over the source tree that README.md lies in (the test reads the
# tree itself, not a copy: a header added anywhere is seen without a BUILD change here).
#   include_graph_test.sh INCLUDE_GRAPH_PY README            every include cycle fails ...
#   include_graph_test.sh --layout INCLUDE_GRAPH_PY README   ... the Layout block's check
set -euo pipefail
source "$(dirname "$0")/flags.sh"
flags_bool layout "check the README's Layout block instead of include cycles"
flags_positional "INCLUDE_GRAPH_PY README" "the checker and the tree's README.md"
flags_parse "$@"
if ((${#FLAGS_ARGS[@]} != 2)); then
  echo "include_graph_test.sh: needs INCLUDE_GRAPH_PY README" >&2
  exit 2
fi
script=${FLAGS_ARGS[0]} readme=$(readlink -f "${FLAGS_ARGS[1]}")
root=$(dirname "$readme")

if ((FLAG_layout)); then
  exec python3 "$script" --root "$root" --check-readme "$readme"
fi

exec python3 "$script" --root "$root"
