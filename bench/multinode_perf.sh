#!/usr/bin/env bash
# bench/lbcc_perf through real mpirun across 4 emulated nodes (tools/testbed namespaces node0..
# node3 with host names of their own, unshaped links; the unique id by MPI_Bcast, each rank on
# its eth0) against the same 4 ranks through mpirun on one node, alternating, --pairs rounds, for
# UCX's default transports and for UCX_TLS=tcp. Both layouts run with one topology
# (LBCC_TOPO_FILE: the 4 ranks one fast island), so the same algorithm and link class run on both
# and only the hosts differ (by host name, 4 nodes would be 4 islands joined by slow links).
#
# What differs below LBCC, and the layouts that separate it:
#   - UCX default: on one node UCX takes shared memory (posix/sysv, cma) between the 4 processes;
#     across nodes only tcp. Not like for like; UCX_TLS=tcp is.
#   - UCX_TLS=tcp on one node still goes through the kernel's loopback path (the ranks' eth0
#     addresses are local: lo, 64 KiB segments, no bridge); across nodes through veth + bridge
#     at a 1500-byte MTU. "4nodes_mtu64k" runs the same 4 nodes on a second testbed whose links
#     have loopback's MTU (testbed --mtu 65520), so the only difference left is veth + bridge.
#   - UCX_TLS=tcp UCX_RNDV_THRESH=inf (4 nodes and 1 node): every message by UCX's eager
#     protocol, no rendezvous round trip (the "4n mtu64k" column repeats the 1-node figure).
#   - ucx_perftest (tag_bw, tcp, no LBCC) between two namespaces vs inside one, alternating in the
#     same run: the platform's own ratio, to read LBCC's against.
# Every figure is the median of the --pairs alternating runs; "spread" is max/min of one layout's
# runs (the noise on this machine at this load).
# Also the torchrun SparseLoCo test across 3 nodes (init time, bytes, replicas identical).
#
#   bench/multinode_perf.sh [--op allreduce] [--max 16M] [--iters 5] [--pairs 4]
#                           [--results bench/results/multinode.md]
#
# Needs root (network namespaces); builds //bench:lbcc_perf and the tests' programs. Writes the
# summary with date, machine, command and load to --results.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/flags.sh
flags_value op allreduce "lbcc_perf operation"
flags_value max 16M "largest message (lbcc_perf -e)"
flags_value iters 5 "timed iterations per size (lbcc_perf -n)"
flags_value pairs 4 "alternating 4-node / 1-node runs per transport setting"
flags_value results bench/results/multinode.md "where the summary is written (empty: nowhere)"
command_line="bench/multinode_perf.sh $*"
flags_parse "$@"
((${#FLAGS_ARGS[@]} == 0)) || { echo "multinode_perf: unexpected argument ${FLAGS_ARGS[0]}" >&2; exit 2; }
export TESTBED=tools/testbed/testbed
"$TESTBED" check >/dev/null || { "$TESTBED" check; exit 1; }
bazel build --jobs=2 //bench:lbcc_perf //tests:multinode_c_api //python:lbcc >&2
perf=$(realpath bazel-bin/bench/lbcc_perf)
source tests/multinode_lib.sh
MN_TMP=$(mktemp -d /tmp/lbcc_multinode.XXXXXX)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
mn_up 4
# The same 4 nodes with loopback's MTU, side by side (its own testbed and bridge).
MN_JUMBO="${MN_NAME}j"
trap '"$TESTBED" down --name "$MN_NAME"; "$TESTBED" down --name "$MN_JUMBO"' EXIT
"$TESTBED" up --name "$MN_JUMBO" --hosts 4 --hostnames node --owner-pid $$ --mtu 65520
topo="$MN_TMP/one_island.json"
echo '{"nranks": 4, "islands": [[0, 1, 2, 3]]}' >"$topo"

run() {  # LABEL LAYOUT(spread|one|jumbo) TLS [ENV=VALUE...]
  local label=$1 layout=$2 tls=$3 json="$MN_TMP/$1.json" hostfile="$MN_TMP/hostfile.$2"
  shift 3
  local extra=() e
  for e in "$@"; do extra+=(-x "$e"); done
  if [[ $layout == one ]]; then echo "node0 slots=4" >"$hostfile"; else mn_hostfile "$hostfile" 1; fi
  local saved=$MN_NAME
  [[ $layout == jumbo ]] && MN_NAME=$MN_JUMBO
  local agent="$MN_TMP/rsh_agent.$layout"
  mn_rsh_agent "$agent"
  local tls_env=()
  [[ -n "$tls" ]] && tls_env=(-x UCX_TLS="$tls")
  mn_exec 0 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --allow-run-as-root --hostfile "$hostfile" -np 4 --map-by node \
    --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include eth0 --mca btl tcp,self --mca btl_tcp_if_include eth0 --mca pml ob1 \
    -x UCX_MEM_EVENTS=no -x LBCC_TOPO_FILE="$topo" "${tls_env[@]}" "${extra[@]}" \
    "$perf" --op "$FLAG_op" -b 4K -e "$FLAG_max" -f 4 -n "$FLAG_iters" -w 2 --json "$json" \
    >"$MN_TMP/$label.out" 2>"$MN_TMP/$label.err" || { cat "$MN_TMP/$label.err" >&2; exit 1; }
  MN_NAME=$saved
  echo "$label" >>"$MN_TMP/runs"
}

# ucx_perftest tag_bw over tcp, client on node0: to node1 (two namespaces) or to itself (one).
ucx_port=14100
perftest() {  # LABEL SERVER_NODE
  local size out iters
  for size in 262144 1048576 4194304; do
    iters=$((52428800 / size))  # 50 MiB per run: 200, 50 and 12 messages.
    ucx_port=$((ucx_port + 1))
    mn_exec "$2" env UCX_TLS=tcp UCX_NET_DEVICES=eth0 timeout 120 ucx_perftest -p "$ucx_port" \
      >/dev/null 2>&1 &
    local server=$!
    out=""
    for _ in 1 2 3 4 5 6 7 8 9 10; do  # Until the server listens.
      out=$(mn_exec 0 env UCX_TLS=tcp UCX_NET_DEVICES=eth0 timeout 120 ucx_perftest \
        "10.77.0.$(($2 + 1))" -p "$ucx_port" -t tag_bw -s "$size" -n "$iters" -w 5 2>&1 |
        awk '/^Final:/ {print $6}') && [[ -n "$out" ]] && break
      sleep 0.3  # Retry back-off while the server starts.
    done
    wait "$server" || true
    echo "$1 $size ${out:-failed}" >>"$MN_TMP/perftest"
  done
}

for ((p = 0; p < FLAG_pairs; p++)); do
  for tls in "" tcp; do
    run "4nodes${tls:+_$tls}_$p" spread "$tls"
    run "1node${tls:+_$tls}_$p" one "$tls"
    run "4nodesmtu64k${tls:+_$tls}_$p" jumbo "$tls"
  done
  run "4nodes_tcp_eager_$p" spread tcp UCX_RNDV_THRESH=inf
  run "1node_tcp_eager_$p" one tcp UCX_RNDV_THRESH=inf
  perftest two 1
  perftest one 0
done
"$TESTBED" down --name "$MN_JUMBO"

# The torchrun SparseLoCo job across 3 nodes (its own testbed).
"$TESTBED" down --name "$MN_NAME"
trap - EXIT
mkdir -p "$MN_TMP/pkg"
cp -r python/lbcc "$MN_TMP/pkg/"
cp bazel-bin/python/lbcc/_lbcc.so bazel-bin/python/lbcc/_c10d_lbcc.so "$MN_TMP/pkg/lbcc/"
PYTHONPATH="$MN_TMP/pkg" NODES=3 tests/multinode_torchrun_test.sh tests/multinode_sparseloco.py >"$MN_TMP/torchrun.out" 2>&1 ||
  { cat "$MN_TMP/torchrun.out" >&2; exit 1; }

summary=$(python3 - "$MN_TMP" <<'PY'
import collections, json, os, statistics, sys
d = sys.argv[1]
runs = open(os.path.join(d, "runs")).read().split()
by = collections.defaultdict(list)  # (setting, layout) -> list of {bytes: row}
for r in runs:
    rows = json.load(open(os.path.join(d, r + ".json")))
    layout, *rest = r.split("_")
    setting = ("UCX_TLS=tcp UCX_RNDV_THRESH=inf" if "eager" in rest else
               "UCX_TLS=tcp" if "tcp" in rest else "UCX default")
    by[(setting, layout)].append({row["bytes"]: row for row in rows})
print("lbcc_perf %s, 4 ranks through mpirun: 4 nodes (1 rank per namespace, veth MTU 1500) vs"
      " 1 node (4 ranks in one namespace) vs 4 nodes at MTU 65520; one fast island in all"
      " (LBCC_TOPO_FILE); time per operation, median of %d alternating runs; spread = max/min"
      " of one layout's runs (the noise here)" %
      (json.load(open(os.path.join(d, runs[0] + ".json")))[0].get("op", "allreduce"),
       len(by[("UCX default", "1node")])))
for setting in ("UCX default", "UCX_TLS=tcp", "UCX_TLS=tcp UCX_RNDV_THRESH=inf"):
    four, one, jumbo = (by[(setting, k)] for k in ("4nodes", "1node", "4nodesmtu64k"))
    jumbo = jumbo or one  # The eager setting runs no MTU 65520 layout.
    if not four:
        continue
    print("\n%s\n%10s %12s %12s %12s %9s %9s %10s %10s" % (setting, "bytes", "4 nodes (us)",
          "1 node (us)", "4n mtu64k", "4n/1n", "mtu64k/1n", "spread 1n", "spread 4n"))
    for size in sorted(four[0]):
        med = lambda runs: statistics.median(run[size]["seconds"] for run in runs) * 1e6
        t4, t1, tj = med(four), med(one), med(jumbo)
        spread = lambda runs: (max(run[size]["seconds"] for run in runs) /
                               min(run[size]["seconds"] for run in runs))
        print("%10d %12.1f %12.1f %12.1f %9.2f %9.2f %10.2f %10.2f" %
              (size, t4, t1, tj, t4 / t1, tj / t1, spread(one), spread(four)))
rates = collections.defaultdict(list)
for line in open(os.path.join(d, "perftest")):
    label, size, mbps = line.split()
    rates[(label, int(size))].append(None if mbps == "failed" else float(mbps))
print("\nucx_perftest tag_bw over tcp, no LBCC (MB/s, median of the alternating runs that"
      " finished; ok = runs that did)")
print("%10s %16s %16s %10s %8s" % ("bytes", "two namespaces", "one namespace", "one/two", "ok"))
for size in (262144, 1048576, 4194304):
    ok = {k: [r for r in rates[(k, size)] if r] for k in ("two", "one")}
    two, one = (statistics.median(ok[k]) if ok[k] else float("nan") for k in ("two", "one"))
    print("%10d %16.1f %16.1f %10.2f %4d/%-3d" % (size, two, one, one / two, len(ok["two"]),
                                                 len(ok["one"])))
PY
)
torch_summary=$(grep -E "^rank [0-9]+ on|replicas|NET/Socket" "$MN_TMP/torchrun.out")
echo "$summary"
echo
echo "$torch_summary"
if [[ -n "$FLAG_results" ]]; then
  # Before the results file is rewritten (it is tracked: rewriting it is not a change of the tree).
  tree="$(git rev-parse --short HEAD)$(git diff --quiet -- . ":!$FLAG_results" || echo ' (with uncommitted changes)')"
  {
    echo "# Across emulated nodes with the real launchers (bench/multinode_perf.sh)"
    echo
    echo "Written by the script; do not edit. Date: $(date -u '+%Y-%m-%d %H:%M UTC')."
    echo "Machine: $(hostname), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')."
    echo "Load average (1, 5, 15 min) at the start: $load_start; at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
    echo "Tree: $tree."
    echo "Command: \`$command_line\`"
    echo
    echo '```'
    echo "$summary"
    echo
    echo "torchrun --nnodes 3 (tests/multinode_torchrun_test.sh, SparseLoCo, node2's down-link at 100mbit):"
    echo "$torch_summary"
    echo '```'
  } >"$FLAG_results"
  echo "wrote $FLAG_results"
fi
