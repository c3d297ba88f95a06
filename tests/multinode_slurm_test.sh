#!/usr/bin/env bash
# A Slurm-shaped launch across emulated nodes (tools/testbed namespaces node0..node<N-1>): the
# driver sets what srun would (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_ID,
# SLURM_STEP_ID, SLURM_STEP_NODELIST=node[0-N]) on each node and starts the C API program; the
# root comes up on the first host of the node list at LBCC_BOOTSTRAP_PORT. Then a node list that
# does not parse fails at once naming it. Skips without root / network namespaces.
#   multinode_slurm_test.sh C_API_PROGRAM   (NODES: 2 by default)
set -euo pipefail
capi=$(realpath "$1")
nodes=${NODES:-2}
source "$(dirname "$0")/multinode_lib.sh"
mn_skip_unless_testbed
MN_TMP=$(mktemp -d "${TEST_TMPDIR:-/tmp}/mn.XXXXXX")
mn_up "$nodes" --rate 100mbit --slow 1

slurm_env() {  # NODE_INDEX NODELIST
  echo SLURM_PROCID="$1" SLURM_NTASKS="$nodes" SLURM_LOCALID=0 SLURM_NODEID="$1" \
    SLURM_JOB_ID=4242 SLURM_STEP_ID=0 SLURM_STEP_NODELIST="$2" LBCC_BOOTSTRAP_PORT=31313
}
pids=()
for ((i = 0; i < nodes; i++)); do
  # shellcheck disable=SC2046
  mn_exec "$i" env -u RANK -u OMPI_COMM_WORLD_RANK $(slurm_env "$i" "node[0-$((nodes - 1))]") \
    LBCC_TIMEOUT_S=60 "$capi" >"$MN_TMP/rank$i.out" 2>"$MN_TMP/rank$i.err" &
  pids+=($!)
done
for ((i = 0; i < nodes; i++)); do
  wait "${pids[$i]}" || { echo "rank $i failed:"; cat "$MN_TMP/rank$i.err"; exit 1; }
done
cat "$MN_TMP"/rank*.out
python3 - "$nodes" "$MN_TMP"/rank*.out <<'PY'
import json, sys
n = int(sys.argv[1])
rows = [json.loads(open(p).read()) for p in sys.argv[2:]]
assert sorted(r["rank"] for r in rows) == list(range(n)), rows
assert sorted(r["host"] for r in rows) == [f"node{i}" for i in range(n)], rows
print("Slurm-shaped launch across %d nodes: ok" % n)
PY

# A node list that does not parse: a clear error naming it (found before any waiting).
start=$SECONDS
# shellcheck disable=SC2046
if mn_exec 1 env $(slurm_env 1 "node[0-") "$capi" >"$MN_TMP/bad.out" 2>"$MN_TMP/bad.err"; then
  echo "a bad node list was accepted"
  exit 1
fi
grep -q "Slurm node list 'node\[0-'" "$MN_TMP/bad.err" || { cat "$MN_TMP/bad.err"; exit 1; }
echo "bad node list, after $((SECONDS - start)) s: $(grep -o "Slurm node list[^;]*" "$MN_TMP/bad.err" | head -1)"

# A rank that advertises loopback while its peers are on other hosts: every rank fails init,
# naming the rank and the fix (not a connect timeout).
pids=()
for ((i = 0; i < nodes; i++)); do
  listen=()
  ((i == nodes - 1)) && listen=(LBCC_LISTEN_ADDR=127.0.0.1)
  # shellcheck disable=SC2046
  mn_exec "$i" env -u RANK -u OMPI_COMM_WORLD_RANK $(slurm_env "$i" "node[0-$((nodes - 1))]") \
    "${listen[@]}" LBCC_TIMEOUT_S=60 "$capi" >"$MN_TMP/lo$i.out" 2>"$MN_TMP/lo$i.err" &
  pids+=($!)
done
for ((i = 0; i < nodes; i++)); do
  if wait "${pids[$i]}"; then echo "rank $i accepted a loopback peer"; exit 1; fi
  grep -q "rank $((nodes - 1)) (host node$((nodes - 1))) advertises the loopback address" \
    "$MN_TMP/lo$i.err" || { echo "rank $i:"; cat "$MN_TMP/lo$i.err"; exit 1; }
done
echo "loopback advertised to remote peers: $(grep -o "rank $((nodes - 1)) (host[^:]*" "$MN_TMP/lo0.err" | head -1)"
