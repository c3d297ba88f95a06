#!/usr/bin/env bash
# Real mpirun across emulated nodes (tools/testbed namespaces named node0..node<N-1>, node 1's
# down-link shaped to 100 Mbit/s): Open MPI's rsh agent starts orted inside each node's
# namespace; LBCC's unique id travels by MPI_Bcast (no LBCC_BOOTSTRAP_ADDR), and every rank
# listens on the interface that routes to the root (eth0, not loopback).
#   1. the C API program (lbccCommInitFromEnv, one all-reduce checked exactly) on every node;
#   2. bench/lbcc_perf's all-reduce, its JSON checked (every size, error at float rounding).
# Prints each rank's init time and bytes. Skips without root / network namespaces.
#   multinode_mpirun_test.sh LBCC_PERF C_API_PROGRAM   (NODES: 2 by default)
set -euo pipefail
perf=$(realpath "$1") capi=$(realpath "$2")
nodes=${NODES:-2}
source "$(dirname "$0")/multinode_lib.sh"
mn_skip_unless_testbed
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed (openmpi-bin)"; exit 0; }
MN_TMP=$(mktemp -d "${TEST_TMPDIR:-/tmp}/mn.XXXXXX")
mn_up "$nodes" --rate 100mbit --slow 1

echo "== C API program, mpirun -np $nodes across node0..node$((nodes - 1))"
LBCC_DEBUG=WARN mn_mpirun "$nodes" "$capi" >"$MN_TMP/capi.out"
cat "$MN_TMP/capi.out"
python3 - "$MN_TMP/capi.out" "$nodes" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
n = int(sys.argv[2])
assert sorted(r["rank"] for r in rows) == list(range(n)), rows
assert sorted(r["host"] for r in rows) == [f"node{i}" for i in range(n)], rows
assert all(r["ok"] and r["ranks"] == n for r in rows), rows
assert all(r["fast_sent"] + r["slow_sent"] > 0 for r in rows), rows
print("C API across %d nodes: ok, init %.3f-%.3f s" % (n, min(r["init_s"] for r in rows),
                                                       max(r["init_s"] for r in rows)))
PY

echo "== lbcc_perf all-reduce, mpirun -np $nodes"
LBCC_DEBUG=INFO mn_mpirun "$nodes" "$perf" --op allreduce -b 4K -e 1M -f 4 -n 3 -w 1 \
  --json "$MN_TMP/allreduce.json" >"$MN_TMP/perf.out" 2>"$MN_TMP/perf.err" || {
  cat "$MN_TMP/perf.out" "$MN_TMP/perf.err"
  exit 1
}
cat "$MN_TMP/perf.out"
# The interface choice each rank logged, and no loopback among them.
grep -h "NET/Socket: using" "$MN_TMP/perf.err" | sed 's/^.*NET/NET/' | sort | uniq -c
if grep -h "NET/Socket: using" "$MN_TMP/perf.err" | grep -q " lo "; then
  echo "a rank listens on loopback"
  exit 1
fi
python3 - "$MN_TMP/allreduce.json" "$nodes" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
assert [r["bytes"] for r in rows] == [4096, 16384, 65536, 262144, 1048576], rows
for r in rows:
    assert r["ranks"] == n and r["error"] < 1e-5 and r["seconds"] > 0, r
print("lbcc_perf across %d nodes: %d sizes ok" % (n, len(rows)))
PY
