#!/usr/bin/env bash
# `lbcc plan` end to end: --help touches nothing, bad input names the field (exit 1), a job
# prints the tables and the recommendation, --json is JSON, a collective predicts one op.
set -euo pipefail
lbcc=$(realpath "$1")
job=$(realpath "$2")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
fail() { echo "FAIL: $*" >&2; exit 1; }

"$lbcc" plan --help | grep -q "usage:" || fail "--help"
"$lbcc" plan simulate --help | grep -q "usage:" || fail "simulate --help"
[[ -z "$(ls -A)" ]] || fail "--help wrote files"

echo '{"topology": {"nranks": 2}, "collective": {"bytes": 64}}' > norates.json
if "$lbcc" plan norates.json 2> err.txt; then fail "no rates accepted"; fi
grep -q "rates" err.txt || fail "no rates: $(cat err.txt)"
echo '{"topology": {"nranks": 2}, "rates": {"default": {"up_mbit": 0, "down_mbit": 5}},
       "collective": {"bytes": 64}}' > zero.json
if "$lbcc" plan zero.json 2> err.txt; then fail "rate 0 accepted"; fi
grep -q "default.up_mbit" err.txt || fail "rate 0: $(cat err.txt)"
if "$lbcc" plan --bogus x 2> /dev/null; then fail "unknown flag accepted"; fi

"$lbcc" plan "$job" > out.txt || fail "job: $(cat out.txt)"
grep -q "critical path:" out.txt || fail "no critical path"
grep -q "recommendation for 95.0 %" out.txt || fail "no recommendation"
"$lbcc" plan --json --target=0.9 "$job" > out.json
/usr/bin/python3 -c "import json,sys; d=json.load(open('out.json')); \
assert d['recommendation']['target_utilization'] == 0.9; \
assert len(d['prediction']['replicas']) == 4" || fail "--json"

echo '{"topology": {"nranks": 4}, "rates": {"default": {"up_mbit": 1000, "down_mbit": 100}},
       "collective": {"op": "sparse_allreduce", "bytes": 16777216, "tensors": 16}}' > coll.json
"$lbcc" plan coll.json | grep -q "sparse_allreduce (direct)" || fail "collective"
echo PASS
