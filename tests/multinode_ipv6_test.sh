#!/usr/bin/env bash
# LBCC across emulated nodes over IPv6 (tools/testbed namespaces node0..node<N-1>), launched as
# torchrun launches C/C++ programs (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; LBCC's root on
# MASTER_PORT+1):
#   1. IPv6 only (testbed --ipv6-only: no IPv4 address anywhere, node1's down-link at 100mbit):
#      MASTER_ADDR is the host name node0, which resolves to fd77::1 only; the C API program
#      (one all-reduce checked exactly) and bench/lbcc_perf's all-reduce on every node. Nothing
#      can fall back to IPv4.
#   2. Dual stack (testbed --ipv6: IPv4 and IPv6 on every eth0), MASTER_ADDR=fd77::1: the ranks
#      choose eth0's IPv6 address and UCX's tcp transport is pinned to IPv6 (UCX_TCP_AF_PRIO),
#      so the data crosses over IPv6: each node's kernel counters (/proc/net/snmp6 against
#      /proc/net/netstat's IpExt) show the all-reduce's bytes on IPv6, next to nothing on IPv4.
#   3. Dual stack with UCX_TCP_AF_PRIO forced: inet,inet6 works (LBCC puts inet6 first; UCX
#      used to abort with a corrupted heap), inet alone is refused on every rank, naming it.
# Prints each rank's interface choice and init time. Skips without root / network namespaces.
#   multinode_ipv6_test.sh LBCC_PERF C_API_PROGRAM   (NODES: 2 by default)
set -euo pipefail
perf=$(realpath "$1") capi=$(realpath "$2")
nodes=${NODES:-2}
source "$(dirname "$0")/multinode_lib.sh"
mn_skip_unless_testbed
MN_TMP=$(mktemp -d "${TEST_TMPDIR:-/tmp}/mn.XXXXXX")

# Runs "$@" on every node as rank i of a torchrun-shaped job rooted at MASTER_ADDR=$1; output in
# $MN_TMP/<label>.<i>.{out,err}.
run_all() {  # LABEL MASTER_ADDR CMD...
  local label=$1 master=$2 i
  shift 2
  local pids=()
  for ((i = 0; i < nodes; i++)); do
    mn_exec "$i" env -u OMPI_COMM_WORLD_RANK -u SLURM_PROCID RANK="$i" WORLD_SIZE="$nodes" \
      LOCAL_RANK=0 MASTER_ADDR="$master" MASTER_PORT=29650 LBCC_TIMEOUT_S=60 LBCC_DEBUG=INFO \
      UCX_MEM_EVENTS=no "$@" >"$MN_TMP/$label.$i.out" 2>"$MN_TMP/$label.$i.err" &
    pids+=($!)
  done
  for ((i = 0; i < nodes; i++)); do
    wait "${pids[$i]}" || { echo "$label: rank $i failed:"; cat "$MN_TMP/$label.$i.err"; exit 1; }
  done
  # Every rank listens on eth0's IPv6 address.
  for ((i = 0; i < nodes; i++)); do
    local line
    line=$(grep -h "NET/Socket: using" "$MN_TMP/$label.$i.err" | tail -1 | sed 's/^.*NET/NET/')
    echo "$label rank $i: $line"
    [[ "$line" == "NET/Socket: using eth0 fd77::$((i + 1)) "* ]] ||
      { echo "$label: rank $i does not listen on eth0 fd77::$((i + 1))"; exit 1; }
  done
}

check_capi() {  # LABEL
  cat "$MN_TMP/$1".*.out
  if grep -h "UCX  WARN" "$MN_TMP/$1".*.out "$MN_TMP/$1".*.err; then
    echo "$1: UCX warned"
    exit 1
  fi
  python3 - "$nodes" "$MN_TMP/$1".*.out <<'PY'
import json, sys
n = int(sys.argv[1])
# UCX logs to stdout too: the program's line is the one starting with "{".
rows = [json.loads(l) for p in sys.argv[2:] for l in open(p) if l.startswith("{")]
assert sorted(r["rank"] for r in rows) == list(range(n)), rows
assert sorted(r["host"] for r in rows) == [f"node{i}" for i in range(n)], rows
assert all(r["ok"] and r["ranks"] == n for r in rows), rows
assert all(r["fast_sent"] + r["slow_sent"] > 0 for r in rows), rows
print("C API over IPv6 across %d nodes: ok, init %.3f-%.3f s" %
      (n, min(r["init_s"] for r in rows), max(r["init_s"] for r in rows)))
PY
}

check_perf() {  # LABEL LARGEST
  python3 - "$nodes" "$2" "$MN_TMP/$1.0.json" <<'PY'
import json, sys
n, largest = int(sys.argv[1]), int(sys.argv[2])
rows = json.load(open(sys.argv[3]))
sizes = [r["bytes"] for r in rows]
assert sizes[0] == 4096 and sizes[-1] == largest, sizes
for r in rows:
    assert r["ranks"] == n and r["error"] < 1e-5 and r["seconds"] > 0, r
print("lbcc_perf over IPv6 across %d nodes: %d sizes ok" % (n, len(rows)))
PY
}

echo "== IPv6 only: MASTER_ADDR=node0 (fd77::1), node1's down-link at 100mbit"
mn_up "$nodes" --ipv6-only --rate 100mbit --slow 1
run_all capi6 node0 "$capi"
check_capi capi6
run_all perf6 node0 "$perf" --op allreduce -b 4K -e 1M -f 4 -n 3 -w 1 --json "$MN_TMP/perf6.0.json"
check_perf perf6 1048576
"$TESTBED" down --name "$MN_NAME"

echo "== dual stack: MASTER_ADDR=fd77::1; the data must cross over IPv6"
mn_up "$nodes" --ipv6
run_all perf46 fd77::1 "$perf" --op allreduce -b 4K -e 4M -f 4 -n 3 -w 1 \
  --json "$MN_TMP/perf46.0.json"
check_perf perf46 4194304
# The all-reduce of 4 MiB alone, 4 times (1 warm-up + 3), moves more than 8 MiB into each node.
for ((i = 0; i < nodes; i++)); do
  v6=$(mn_exec "$i" awk '$1 == "Ip6InOctets" {print $2}' /proc/net/snmp6)
  v4=$(mn_exec "$i" awk '$1 == "IpExt:" && !h {for (k = 1; k <= NF; k++) col[$k] = k; h = 1; next}
                         $1 == "IpExt:" {print $col["InOctets"]}' /proc/net/netstat)
  echo "node$i received: IPv6 $v6 B, IPv4 $v4 B"
  ((v6 > 8 * 1024 * 1024)) || { echo "node$i: the data did not cross over IPv6"; exit 1; }
  ((v4 * 100 < v6)) || { echo "node$i: more than 1% of the bytes crossed over IPv4"; exit 1; }
done

# A forced UCX_TCP_AF_PRIO on these dual-stack nodes. With inet first, UCX's tcp transport
# connected its data from IPv4 toward the peers' IPv6 addresses and aborted ("malloc(): invalid
# size", a corrupted heap); LBCC now puts the listen family first. A list without inet6 is a
# clear InvalidArgument naming the variable on every rank, at once.
echo "== dual stack, UCX_TCP_AF_PRIO=inet,inet6 forced"
run_all forced fd77::1 env UCX_TCP_AF_PRIO=inet,inet6 "$capi"
check_capi forced
grep -q "UCX_TCP_AF_PRIO=inet,inet6 used as inet6,inet" "$MN_TMP/forced.0.err" ||
  { echo "forced: the reordering was not logged"; cat "$MN_TMP/forced.0.err"; exit 1; }
echo "== dual stack, UCX_TCP_AF_PRIO=inet forced: refused"
pids=()
start=$(date +%s%N)
for ((i = 0; i < nodes; i++)); do
  mn_exec "$i" env -u OMPI_COMM_WORLD_RANK -u SLURM_PROCID RANK="$i" WORLD_SIZE="$nodes" \
    LOCAL_RANK=0 MASTER_ADDR=fd77::1 MASTER_PORT=29651 LBCC_TIMEOUT_S=60 UCX_MEM_EVENTS=no \
    UCX_TCP_AF_PRIO=inet "$capi" >"$MN_TMP/refused.$i.out" 2>"$MN_TMP/refused.$i.err" &
  pids+=($!)
done
for ((i = 0; i < nodes; i++)); do
  if wait "${pids[$i]}"; then echo "refused: rank $i succeeded"; exit 1; fi
  grep -q "INVALID_ARGUMENT: UCX_TCP_AF_PRIO='inet' leaves out inet6" "$MN_TMP/refused.$i.err" ||
    { echo "refused: rank $i did not name UCX_TCP_AF_PRIO"; cat "$MN_TMP/refused.$i.err"; exit 1; }
done
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
echo "UCX_TCP_AF_PRIO=inet refused on every rank in $elapsed_ms ms: $(head -1 "$MN_TMP/refused.0.err")"
((elapsed_ms < 30000)) || { echo "refused: took $elapsed_ms ms (LBCC_TIMEOUT_S is 60)"; exit 1; }
echo "IPv6 across $nodes nodes: ok"
