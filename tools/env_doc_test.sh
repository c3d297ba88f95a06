#!/usr/bin/env bash
# Every LBCC_* variable declared in base/env.cc is documented in the README's table, and the
# README documents no variable that does not exist.
set -euo pipefail
lbcc=$1 readme=$2
declared=$("$lbcc" env | grep -oE '^\| LBCC_[A-Z0-9_]+' | sed 's/^| //' | sort -u)
documented=$(grep -oE '^\| `LBCC_[A-Z0-9_]+`' "$readme" | tr -d '|` ' | sort -u)
if [[ "$declared" != "$documented" ]]; then
  echo "README env table and base/env.cc disagree:"
  diff <(echo "$declared") <(echo "$documented") || true
  exit 1
fi
echo "$(echo "$declared" | wc -l) variables documented"
