#!/usr/bin/env bash
# bench/baselines.py: a baseline in its range passes, one outside is refused (exit 3, the reason
# printed, nothing written), from bash and from Python; load() reads /proc/loadavg.
#   baselines_test.sh BASELINES_PY
set -euo pipefail
baselines=$1
python=/usr/bin/python3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }

# expect STATUS PATTERN ARGS...: bench/baselines.py ARGS exits STATUS, stderr matches PATTERN
# (an empty PATTERN: stderr is empty).
expect() {
  local want=$1 pattern=$2 rc=0
  shift 2
  "$python" "$baselines" "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  ((rc == want)) || fail "baselines.py $*: exit $rc, expected $want: $(cat "$tmp/err")"
  if [[ -z $pattern ]]; then
    [[ ! -s $tmp/err ]] || fail "baselines.py $*: unexpected stderr: $(cat "$tmp/err")"
    return
  fi
  grep -qE -- "$pattern" "$tmp/err" || fail "baselines.py $*: stderr lacks '$pattern': $(cat "$tmp/err")"
}

# The known broken case: ucx_perftest at 126 MB/s on loopback (a starved run).
expect 0 '' check ucx_perftest_loopback 5850
expect 0 '' check ucx_perftest_loopback 1000
expect 3 'refused: 1 baseline.*not writing bench/results/transport.md \(left as it was\); load average' \
  check ucx_perftest_loopback 126.4 --where "BM_LoopbackTcp round 1" --out bench/results/transport.md
grep -q 'BM_LoopbackTcp round 1: ucx_perftest tag_bw.*126.4 MB/s, expected >= 1000 MB/s: .*starved' \
  "$tmp/err" || fail "the refusal does not say why: $(cat "$tmp/err")"
# A shaped link: the shaper works (<= 1.05x), the sender got a core (>= 0.5x).
expect 0 '' check shaped_link_rate 11.6 --reference 12.5
expect 3 'shaper was not in place' check shaped_link_rate 14 --reference 12.5
expect 3 '0.4 x the configured rate' check shaped_link_rate 5 --reference 12.5
expect 3 'no positive reference' check shaped_link_rate 11.6
# Times against a wire limit: nothing beats it; Gloo starved above 2x.
expect 0 '' check wire_limit_time 2.4 --reference 2.013
expect 3 'links were not shaped' check wire_limit_time 1.5 --reference 2.013
expect 0 '' check gloo_wire_limit_time 2.5 --reference 2.013
expect 3 'starved' check gloo_wire_limit_time 2.639 --reference 0.503
# Machine-independent limits.
expect 0 '' check triad 1.09
expect 3 'expected 0.1-50 G elements/s' check triad 0.01
expect 0 '' check sgemm 45
expect 3 'optimised away|skipped' check sgemm 2e6
expect 3 'expected 1-1000 GB/s' check memcpy 0.2
# Flags: an unknown baseline or flag is a usage error (2), --help exits 0.
expect 2 'invalid choice' check no_such_baseline 1
expect 2 'unrecognized arguments' check triad 1 --bogus
"$python" "$baselines" --help >/dev/null || fail "--help exited $?"

# load: three numbers, as /proc/loadavg has them.
"$python" "$baselines" load | grep -qE '^[0-9.]+ [0-9.]+ [0-9.]+$' || fail "load: $("$python" "$baselines" load)"
"$python" "$baselines" table >"$tmp/table"
grep -q '^| `ucx_perftest_loopback` |' "$tmp/table" || fail "table lacks ucx_perftest_loopback"

# From Python: every violation collected, then one refusal; the results file is not touched.
echo "previous results" >"$tmp/results.md"
rc=0
"$python" - "$(dirname "$baselines")" "$tmp/results.md" >"$tmp/out" 2>"$tmp/err" <<'PY' || rc=$?
import sys
sys.path.insert(0, sys.argv[1])
import baselines
check = baselines.Checker(sys.argv[2])
assert check("ucx_perftest_loopback", 5900, where="tree 0 round 1")
assert not check("ucx_perftest_loopback", 132.4, where="tree 0 round 2")
assert not check("wire_limit_time", 0.5, reference=2.013, where="dense 100mbit lbcc")
assert check("shaped_link_measured", 11.5, reference=12.5)
assert baselines.violation("triad", 1.1) is None
check.refuse_if_off()
open(sys.argv[2], "w").write("overwritten\n")
PY
((rc == 3)) || fail "Checker.refuse_if_off: exit $rc, expected 3: $(cat "$tmp/err")"
grep -q '^refused: 2 baseline' "$tmp/err" || fail "Checker: $(cat "$tmp/err")"
grep -q '^  tree 0 round 2: .*132.4 MB/s' "$tmp/err" || fail "Checker: $(cat "$tmp/err")"
grep -q '^  dense 100mbit lbcc: .*0.248 x the wire limit' "$tmp/err" || fail "Checker: $(cat "$tmp/err")"
[[ $(cat "$tmp/results.md") == "previous results" ]] || fail "the results file was written"
echo PASS
