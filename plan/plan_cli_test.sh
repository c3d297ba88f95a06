#!/usr/bin/env bash
# `lbcc plan` end to end: --help touches nothing, bad input names the field (exit 1), a job
# prints the tables and the recommendation, --json is JSON, a collective predicts one op, and
# `lbcc plan ring` predicts the context ring from flags or a document.
set -euo pipefail
lbcc=$(realpath "$1")
job=$(realpath "$2")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
fail() { echo "FAIL: $*" >&2; exit 1; }

grep -q "usage:" <<< "$("$lbcc" plan --help)" || fail "--help"
grep -q "usage:" <<< "$("$lbcc" plan simulate --help)" || fail "simulate --help"
grep -q "plan ring" <<< "$("$lbcc" plan ring --help)" || fail "ring --help"
[[ -z "$(ls -A)" ]] || fail "--help wrote files"

echo '{"topology": {"nranks": 2}, "collective": {"bytes": 64}}' > norates.json
if "$lbcc" plan norates.json 2> err.txt; then fail "no rates accepted"; fi
grep -q "rates" err.txt || fail "no rates: $(cat err.txt)"
echo '{"topology": {"nranks": 2}, "rates": {"default": {"up_mbit": 0, "down_mbit": 5}},
       "collective": {"bytes": 64}}' > zero.json
if "$lbcc" plan zero.json 2> err.txt; then fail "rate 0 accepted"; fi
grep -q "default.up_mbit" err.txt || fail "rate 0: $(cat err.txt)"
# Flags: one style (tools/cli.h). Unknown flags, and other subcommands' flags, exit 2 naming it.
set +e
"$lbcc" plan --bogus x 2> err.txt; rc=$?
[[ $rc == 2 ]] && grep -q -- "--bogus" err.txt || fail "unknown flag: exit $rc: $(cat err.txt)"
"$lbcc" plan --codec=topk_ef "$job" 2> err.txt; rc=$?
[[ $rc == 2 ]] && grep -q -- "--codec" err.txt || fail "codec's flag accepted: $(cat err.txt)"
"$lbcc" plan --target=1.5 "$job" 2> err.txt; rc=$?
[[ $rc == 2 ]] && grep -q -- "--target" err.txt || fail "--target=1.5: exit $rc"
"$lbcc" plan --target=abc "$job" 2> err.txt; rc=$?
[[ $rc == 2 ]] && grep -q -- "--target" err.txt || fail "--target=abc: exit $rc"
"$lbcc" plan simulate --input=x 2> err.txt; rc=$?
[[ $rc == 2 ]] && grep -q -- "--input" err.txt || fail "simulate --input: exit $rc"
"$lbcc" plan simulate --min_mbit=0 2> err.txt; rc=$?
[[ $rc == 2 ]] && grep -q -- "--min_mbit" err.txt || fail "simulate --min_mbit=0: exit $rc"
"$lbcc" plan simulate --participants=1 2> err.txt; rc=$?
[[ $rc == 2 ]] && grep -q -- "--participants" err.txt || fail "simulate --participants=1"
set -e
grep -q -- "--plot" <<< "$("$lbcc" plan --help)" || fail "--help lists no flags"
grep -q -- "--participants" <<< "$("$lbcc" plan simulate --help)" || fail "simulate --help lists no flags"
[[ -z "$(ls -A | grep -v 'json$\|txt$')" ]] || fail "bad flags wrote files: $(ls -A)"

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
# The context ring: flags (or a "ring" document); the prediction follows the ratio's k.
grep -q -- "--attention_gflops" <<< "$("$lbcc" plan ring --help)" || fail "ring --help"
grep -q -- "--codec_gelements_s" <<< "$("$lbcc" plan ring --help)" || fail "ring --help: codec"
set +e
"$lbcc" plan ring --context=256 --dim=64 --attention_gflops=1 2> err.txt; rc=$?
[[ $rc == 2 ]] && grep -q -- "--link_mbit" err.txt || fail "ring without --link_mbit: exit $rc"
"$lbcc" plan ring --context=255 --dim=64 --link_mbit=100 --attention_gflops=1 2> err.txt; rc=$?
[[ $rc == 1 ]] && grep -q "ring.context" err.txt || fail "ring context 255: exit $rc"
for rate in 0 -2; do
  "$lbcc" plan ring --context=256 --dim=64 --link_mbit=100 --attention_gflops=1 \
      --codec_gelements_s=$rate 2> err.txt; rc=$?
  [[ $rc == 1 ]] && grep -q "ring.codec_gelements_s" err.txt || fail "codec rate $rate: exit $rc"
done
"$lbcc" plan ring --context=256 --dim=64 --link_mbit=100 --attention_gflops=1 \
    --codec_gelements_s=fast 2> err.txt; rc=$?
[[ $rc == 2 ]] && grep -q -- "--codec_gelements_s" err.txt || fail "codec rate fast: exit $rc"
"$lbcc" plan ring --participants=16 2> err.txt; rc=$?
[[ $rc == 2 ]] && grep -q -- "--participants" err.txt || fail "ring took simulate's flag"
set -e
ring=(--context=256 --batch=8 --dim=64 --heads=4 --layers=2 --link_mbit=100
      --attention_gflops=0.5 --params=149504 --grad_tensors=30)
"$lbcc" plan ring "${ring[@]}" > out.txt || fail "ring: $(cat out.txt)"
grep -q "context ring: 4 ranks x 64 tokens" out.txt || fail "ring: $(cat out.txt)"
"$lbcc" plan ring "${ring[@]}" --json > bf16.json
"$lbcc" plan ring "${ring[@]}" --json --codec_gelements_s=0.5 > coded.json
"$lbcc" plan ring "${ring[@]}" --json --kv_codec=subspace --compression=0.95 \
    --mixture_block=16 > sub.json
/usr/bin/python3 -c "import json; b=json.load(open('bf16.json')); s=json.load(open('sub.json')); \
assert s['k'] == 3 and s['saved'] >= 0.95, s; \
assert s['ring_wire_s'] < b['ring_wire_s'] and s['ring_compute_s'] == b['ring_compute_s']; \
assert abs(b['step_s'] - b['ring_s'] - b['other_s'] - b['allreduce_s']) < 1e-9" || fail "ring --json"
# The caller's encode/decode: its own term; the given rate codes 2 x 512 x 64 elements a block.
/usr/bin/python3 -c "import json; c=json.load(open('coded.json')); \
assert c['codec_gelements_s'] == 0.5 and abs(c['block_encode_s'] - 65536 / 0.5e9) < 1e-15, c; \
assert c['ring_codec_s'] > 0 and c['ring_compute_s'] == json.load(open('bf16.json'))['ring_compute_s']" \
    || fail "ring --codec_gelements_s"
grep -q "encode/decode" out.txt || fail "ring: no encode/decode term: $(cat out.txt)"
echo '{"topology": {"nranks": 2}, "rates": {"default": {"up_mbit": 10, "down_mbit": 10}},
       "ring": {"context": 64, "d": 8, "attention_gflops": 1}}' > ring.json
"$lbcc" plan ring --input=ring.json | grep -q "context ring: 2 ranks" || fail "ring --input"
"$lbcc" plan ring.json | grep -q "context ring: 2 ranks" || fail "plan with a ring document"
"$lbcc" plan simulate --participants=16 --output=rows.json 2> /dev/null || fail "simulate"
/usr/bin/python3 -c "import json; rows=json.load(open('rows.json')); \
assert {r['participants'] for r in rows} == {16}" || fail "simulate --output"
echo PASS
