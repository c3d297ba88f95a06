#!/usr/bin/env bash
# bench/lbcc_perf through real mpirun across 4 emulated nodes (tools/testbed namespaces node0..
# node3 with host names of their own, unshaped links; the unique id by MPI_Bcast, each rank on
# its eth0) against the same 4 ranks through mpirun on one node: --pairs rounds, each running
# both layouts back to back in alternating order (4 nodes first in even rounds, one node first
# in odd ones, so a drift of the load hits both alike), for UCX_TLS=tcp and UCX's default
# transports. Both layouts run with one topology (LBCC_TOPO_FILE: the 4 ranks one fast island),
# so the same algorithm and link class run on both and only the hosts differ.
#
# The comparison, per setting and message size: the ratio of the medians (4 nodes / one node)
# and the one-node runs' own band, [min, max] / median over the rounds. "within noise" when the
# ratio lies inside that band (the 4-node median is no further from the one-node median than one
# of the one-node runs was); "4n slower" / "4n faster" otherwise. Each layout's spread (max/min)
# and the load average at every round are reported next to it. Every round also runs
# ucx_perftest (tag_bw, tcp, no LBCC) between two namespaces and inside one, alternating: the
# platform's own ratio at 256K, 1M and 4M; LBCC's ratio over it, judged by the same band, says
# whether LBCC adds anything of its own to what the platform's two paths differ by.
#
# What differs below LBCC (docs/multihost.md): UCX's default takes shared memory between the 4
# processes of one node and only tcp across nodes (not like for like; UCX_TLS=tcp is); tcp on one
# node goes through loopback (64 KiB segments), across nodes through veth + bridge (MTU 1500).
# --extra adds the layouts that separate these: the 4 nodes at loopback's MTU (testbed --mtu
# 65520) and UCX_TLS=tcp UCX_RNDV_THRESH=inf (eager only) on 4 nodes and one.
# --torchrun also runs the torchrun SparseLoCo test across 3 nodes (init time, bytes, replicas).
#
#   bench/multinode_perf.sh [--op allreduce] [--max 16M] [--iters 5] [--pairs 4] [--extra]
#                           [--torchrun] [--results bench/results/multinode.md]
#
# Needs root (network namespaces); builds //bench:lbcc_perf (and //python:lbcc for --torchrun).
# Writes the summary with date, machine, command, the load at the start, at every round and at
# the end, and how long the run took, to --results; refuses to (exit 3, the reason printed,
# --results left as it was) when a ucx_perftest run, the platform's baseline, is off its
# expected range (bench/baselines.py: a starved run).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/flags.sh
flags_value op allreduce "lbcc_perf operation"
flags_value max 16M "largest message (lbcc_perf -e)"
flags_value iters 5 "timed iterations per size (lbcc_perf -n)"
flags_value pairs 4 "rounds; each runs the 4-node and the one-node layout once per setting"
flags_bool extra "also the MTU 65520 and eager-only layouts (diagnostics)"
flags_bool torchrun "also the torchrun SparseLoCo test across 3 nodes"
flags_value results bench/results/multinode.md "where the summary is written (empty: nowhere)"
command_line="bench/multinode_perf.sh $*"
flags_parse "$@"
((${#FLAGS_ARGS[@]} == 0)) || { echo "multinode_perf: unexpected argument ${FLAGS_ARGS[0]}" >&2; exit 2; }
((FLAG_pairs >= 2)) || { echo "multinode_perf: --pairs must be at least 2 (a band needs two runs)" >&2; exit 2; }
export TESTBED=tools/testbed/testbed
"$TESTBED" check >/dev/null || { "$TESTBED" check; exit 1; }
targets=(//bench:lbcc_perf)
((FLAG_torchrun)) && targets+=(//python:lbcc)
bazel build --jobs=2 "${targets[@]}" >&2
perf=$(realpath bazel-bin/bench/lbcc_perf)
source tests/multinode_lib.sh
MN_TMP=$(mktemp -d /tmp/lbcc_multinode.XXXXXX)
started=$(date +%s)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
mn_up 4
MN_JUMBO="${MN_NAME}j"
if ((FLAG_extra)); then
  # The same 4 nodes with loopback's MTU, side by side (its own testbed and bridge).
  trap '"$TESTBED" down --name "$MN_NAME"; "$TESTBED" down --name "$MN_JUMBO"' EXIT
  "$TESTBED" up --name "$MN_JUMBO" --hosts 4 --hostnames node --owner-pid $$ --mtu 65520
fi
topo="$MN_TMP/one_island.json"
echo '{"nranks": 4, "islands": [[0, 1, 2, 3]]}' >"$topo"
: >"$MN_TMP/runs"
: >"$MN_TMP/perftest"

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

# Round p: both layouts per setting, 4 nodes first when p is even, one node first when odd.
pair() {  # ROUND TLS LABEL_SUFFIX FOUR_LAYOUT [ENV=VALUE...]
  local p=$1 tls=$2 suffix=$3 four=$4
  shift 4
  local name4=4nodes
  [[ $four == jumbo ]] && name4=4nodesmtu64k
  if ((p % 2 == 0)); then
    run "${name4}${suffix}_$p" "$four" "$tls" "$@"
    run "1node${suffix}_$p" one "$tls" "$@"
  else
    run "1node${suffix}_$p" one "$tls" "$@"
    run "${name4}${suffix}_$p" "$four" "$tls" "$@"
  fi
}

: >"$MN_TMP/loads"
for ((p = 0; p < FLAG_pairs; p++)); do
  echo "$p $(cut -d' ' -f1 /proc/loadavg)" >>"$MN_TMP/loads"
  pair "$p" tcp _tcp spread
  pair "$p" "" "" spread
  if ((p % 2 == 0)); then perftest two 1; perftest one 0; else perftest one 0; perftest two 1; fi
  if ((FLAG_extra)); then
    run "4nodesmtu64k_tcp_$p" jumbo tcp
    pair "$p" tcp _tcp_eager spread UCX_RNDV_THRESH=inf
  fi
  echo "round $((p + 1))/$FLAG_pairs done, $(($(date +%s) - started)) s" >&2
done
"$TESTBED" down --name "$MN_NAME"
((FLAG_extra)) && "$TESTBED" down --name "$MN_JUMBO"
trap - EXIT

torch_summary=""
if ((FLAG_torchrun)); then
  # The torchrun SparseLoCo job across 3 nodes (its own testbed).
  mkdir -p "$MN_TMP/pkg"
  cp -r python/lbcc "$MN_TMP/pkg/"
  cp bazel-bin/python/lbcc/_lbcc.so bazel-bin/python/lbcc/_c10d_lbcc.so "$MN_TMP/pkg/lbcc/"
  PYTHONPATH="$MN_TMP/pkg" NODES=3 tests/multinode_torchrun_test.sh tests/multinode_sparseloco.py \
    >"$MN_TMP/torchrun.out" 2>&1 || { cat "$MN_TMP/torchrun.out" >&2; exit 1; }
  torch_summary=$(grep -E "^rank [0-9]+ on|replicas|NET/Socket" "$MN_TMP/torchrun.out")
fi

summary=$(python3 - "$MN_TMP" "$FLAG_op" "$FLAG_results" <<'PY'
import collections, json, os, statistics, sys
sys.path.insert(0, "bench")
import baselines
d, op = sys.argv[1], sys.argv[2]
check = baselines.Checker(sys.argv[3])
by = collections.defaultdict(list)  # (setting, layout) -> one {bytes: seconds} per run
for r in open(os.path.join(d, "runs")).read().split():
    layout, *rest = r.split("_")
    setting = ("UCX_TLS=tcp UCX_RNDV_THRESH=inf" if "eager" in rest else
               "UCX_TLS=tcp" if "tcp" in rest else "UCX default")
    by[(setting, layout)].append(
        {row["bytes"]: row["seconds"] for row in json.load(open(os.path.join(d, r + ".json")))})
loads = [line.split() for line in open(os.path.join(d, "loads"))]
print("lbcc_perf %s, 4 ranks through mpirun: 4 nodes (1 rank per namespace, veth MTU 1500) vs"
      " one node (4 ranks in one namespace), one fast island in both (LBCC_TOPO_FILE); time per"
      " operation (mean of the timed iterations, mean over ranks), median of %d rounds, each"
      " round running both layouts back to back in alternating order." %
      (op, len(by[("UCX_TLS=tcp", "1node")])))
print("Rule: 'within noise' when 4n/1n (the ratio of the medians) lies inside the one-node"
      " runs' own band, [min, max] / median; spread = max/min of one layout's runs.")
print("platform = the same ratio for ucx_perftest tag_bw over tcp (no LBCC: two namespaces vs"
      " one, run in the same rounds); '/platform' = 4n/1n over it, judged by the same band.")
print("Load average (1 min) at the start of each round: " +
      ", ".join("%s" % l[1] for l in loads))
# The platform's own ratio (ucx_perftest, no LBCC): time between two namespaces / inside one.
platform = {}
if os.path.getsize(os.path.join(d, "perftest")):
    rates = collections.defaultdict(list)
    for n, line in enumerate(open(os.path.join(d, "perftest"))):
        label, size, mbps = line.split()
        if mbps != "failed":
            rates[(label, int(size))].append(float(mbps))
            check("ucx_perftest_loopback" if label == "one" else "ucx_perftest_veth",
                  float(mbps), where=f"ucx_perftest {label} namespace(s), {size} B, round {n // 6}")
    check.refuse_if_off()
    for (label, size) in list(rates):
        if rates[("two", size)] and rates[("one", size)]:
            platform[size] = (statistics.median(rates[("one", size)]) /
                              statistics.median(rates[("two", size)]))
for setting, other in (("UCX_TLS=tcp", "4nodes"), ("UCX default", "4nodes"),
                       ("UCX_TLS=tcp", "4nodesmtu64k"), ("UCX_TLS=tcp UCX_RNDV_THRESH=inf", "4nodes")):
    four, one = by[(setting, other)], by[(setting, "1node")]
    if not four or len(one) < 2:
        continue
    title = setting + ("" if other == "4nodes" else ", 4 nodes at MTU 65520")
    print("\n%s\n%10s %12s %12s %7s %15s %10s %10s %9s  %s" % (
        title, "bytes", "4 nodes (us)", "1 node (us)", "4n/1n", "1n band", "spread 1n",
        "spread 4n", "platform", "verdict"))
    within = 0
    sizes = sorted(four[0])
    for size in sizes:
        t4 = [run[size] for run in four]
        t1 = [run[size] for run in one]
        m4, m1 = statistics.median(t4), statistics.median(t1)
        lo, hi = min(t1) / m1, max(t1) / m1
        ratio = m4 / m1
        verdict = ("within noise" if lo <= ratio <= hi else
                   "4n slower" if ratio > hi else "4n faster")
        within += verdict == "within noise"
        if size in platform:
            # LBCC's ratio over the platform's: inside the band, LBCC adds nothing of its own.
            rel = ratio / platform[size]
            verdict += "; /platform %.2f: %s" % (
                rel, "within noise" if lo <= rel <= hi else "above" if rel > hi else "below")
        print("%10d %12.1f %12.1f %7.2f %7.2f-%-7.2f %10.2f %10.2f %9s  %s" % (
            size, m4 * 1e6, m1 * 1e6, ratio, lo, hi, max(t1) / min(t1), max(t4) / min(t4),
            "%.2f" % platform[size] if size in platform else "-", verdict))
    print("%s: within noise at %d of %d sizes" % (title, within, len(sizes)))
if os.path.getsize(os.path.join(d, "perftest")):
    rates = collections.defaultdict(list)
    for line in open(os.path.join(d, "perftest")):
        label, size, mbps = line.split()
        rates[(label, int(size))].append(None if mbps == "failed" else float(mbps))
    print("\nucx_perftest tag_bw over tcp, no LBCC (MB/s, median of the runs that finished;"
          " ok = runs that did)")
    print("%10s %16s %16s %10s %8s" % ("bytes", "two namespaces", "one namespace", "one/two", "ok"))
    for size in (262144, 1048576, 4194304):
        ok = {k: [r for r in rates[(k, size)] if r] for k in ("two", "one")}
        two, one = (statistics.median(ok[k]) if ok[k] else float("nan") for k in ("two", "one"))
        print("%10d %16.1f %16.1f %10.2f %4d/%-3d" % (size, two, one, one / two, len(ok["two"]),
                                                     len(ok["one"])))
PY
)
elapsed=$(($(date +%s) - started))
echo "$summary"
[[ -n "$torch_summary" ]] && { echo; echo "$torch_summary"; }
echo "took $elapsed s"
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
    echo "Command: \`$command_line\` (took $elapsed s after the build)."
    echo
    echo '```'
    echo "$summary"
    if [[ -n "$torch_summary" ]]; then
      echo
      echo "torchrun --nnodes 3 (tests/multinode_torchrun_test.sh, SparseLoCo, node2's down-link at 100mbit):"
      echo "$torch_summary"
    fi
    echo '```'
  } >"$FLAG_results"
  echo "wrote $FLAG_results"
fi
