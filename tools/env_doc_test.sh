#!/usr/bin/env bash
# Every LBCC_* variable declared in base/env.cc is documented in the README's table, and the
# README documents no variable that does not exist.
set -euo pipefail
source "$(dirname "$0")/flags.sh"
flags_positional "LBCC README" "the lbcc binary, the README.md with the env table"
flags_parse "$@"
((${#FLAGS_ARGS[@]} == 2)) || { echo "env_doc_test.sh: needs LBCC README" >&2; exit 2; }
lbcc=${FLAGS_ARGS[0]} readme=${FLAGS_ARGS[1]}
declared=$("$lbcc" env | grep -oE '^\| LBCC_[A-Z0-9_]+' | sed 's/^| //' | sort -u)
documented=$(grep -oE '^\| `LBCC_[A-Z0-9_]+`' "$readme" | tr -d '|` ' | sort -u)
if [[ "$declared" != "$documented" ]]; then
  echo "README env table and base/env.cc disagree:"
  diff <(echo "$declared") <(echo "$documented") || true
  exit 1
fi
echo "$(echo "$declared" | wc -l) variables documented"
