#!/usr/bin/env bash
# Where a SparseAllReduce's time goes, per rank (lbcc_perf --profile): 4 ranks, one per emulated
# host (tools/testbed), a --bytes fp32 tensor (TopK-EF defaults: top_k 64, 2-bit values), on
# links shaped to --rate and on unshaped links (what the codec and the protocol cost on this
# machine's cores), --runs runs each, alternating. Per rank and call: the operation-header round
# (the part not hidden behind the first encode), the encode (and posting), the wait for the wire
# after the encode, the commit-or-abort agreement, the decode; the exchange thread's payload
# validation runs alongside them. The time is printed against the wire limit (the payload bytes
# a rank receives / the link rate).
#
#   bench/sparse_profile.sh [--rate 100mbit] [--bytes 16M] [--iters 20] [--runs 3]
#                           [--out DIR] [--results bench/results/sparse_profile.md]
#
# Needs root (network namespaces); builds //bench:lbcc_perf. Writes the table with the date,
# machine, command and the load average before and after to --results; refuses (exit 3, the
# file left as it was) when a shaped run beats the wire limit it divides by (bench/baselines.py).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/flags.sh
flags_value rate 100mbit "rate of the shaped down-links (tc syntax)"
flags_value bytes 16M "tensor size (K, M, G suffixes)"
flags_value iters 20 "timed iterations per run"
flags_value runs 3 "runs per link kind (shaped and unshaped alternate)"
flags_value out /tmp/lbcc_sparse_profile "folder for the per-run JSON and logs"
flags_value results bench/results/sparse_profile.md "where the summary is written (empty: nowhere)"
command_line="bench/sparse_profile.sh $*"
flags_parse "$@"
((${#FLAGS_ARGS[@]} == 0)) || { echo "sparse_profile: unexpected argument ${FLAGS_ARGS[0]}" >&2; exit 2; }
rate=$FLAG_rate bytes=$FLAG_bytes iters=$FLAG_iters runs=$FLAG_runs out=$FLAG_out results=$FLAG_results
T=tools/testbed/testbed
if ! why=$($T check); then echo "sparse_profile: $why" >&2; exit 1; fi
echo "sparse_profile: building //bench:lbcc_perf"
bazel build -c opt //bench:lbcc_perf >/dev/null 2>&1 || bazel build -c opt //bench:lbcc_perf
perf=$PWD/bazel-bin/bench/lbcc_perf
mkdir -p "$out"
load_before=$(bench/baselines.py load)
shaped="sp$$s" unshaped="sp$$u"
trap '$T down --name "$shaped" >/dev/null 2>&1 || true; $T down --name "$unshaped" >/dev/null 2>&1 || true' EXIT
$T down --stale >/dev/null 2>&1 || true
$T up --name "$shaped" --hosts 4 --rate "$rate" --slow 0,1,2,3 --owner-pid $$ >/dev/null
$T up --name "$unshaped" --hosts 4 --owner-pid $$ >/dev/null
echo '{"nranks": 4}' > "$out/topology.json"

# run TESTBED LABEL: one lbcc_perf rank per host; rank 0 writes the JSON with every rank's profile.
run() {
  local name=$1 label=$2 port=$((29000 + RANDOM % 1000)) pids=() rank
  for rank in 0 1 2 3; do
    $T exec --name "$name" "$rank" -- env UCX_TLS=tcp UCX_NET_DEVICES=eth0 UCX_MEM_EVENTS=no \
      LBCC_LISTEN_ADDR="$($T addr --name "$name" "$rank")" \
      LBCC_BOOTSTRAP_ADDR="$($T addr --name "$name" 0):$port" LBCC_TIMEOUT_S=120 \
      RANK=$rank WORLD_SIZE=4 \
      "$perf" --op sparse_allreduce --min_bytes "$bytes" --max_bytes "$bytes" --iters "$iters" \
      --warmup 2 --quiet --profile --topology "$out/topology.json" --json "$out/$label.json" \
      > "$out/$label.rank$rank.log" 2>&1 &
    pids+=($!)
  done
  local rc=0 pid
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  if ((rc)); then
    echo "sparse_profile: $label failed; logs in $out/$label.rank*.log" >&2
    tail -5 "$out/$label".rank*.log >&2
    exit 1
  fi
  echo "  $label done"
}

loads=()
for ((r = 0; r < runs; ++r)); do
  loads+=("$(cut -d' ' -f1 /proc/loadavg)")
  if ((r % 2 == 0)); then
    run "$shaped" "shaped_$r"; run "$unshaped" "unshaped_$r"
  else
    run "$unshaped" "unshaped_$r"; run "$shaped" "shaped_$r"
  fi
done
load_after=$(bench/baselines.py load)

summary=$(python3 - "$out" "$rate" "$runs" "$results" "${loads[*]}" <<'PY'
import json, re, statistics, sys
sys.path.insert(0, "bench")
import baselines
out, rate, runs, results, loads = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
check = baselines.Checker(results)
m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
link = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8
fields = ["header", "encode", "wire_wait", "agreement", "decode", "total", "validate"]
print(f"SparseAllReduce, 4 ranks (one per emulated host), {runs} runs per link kind, alternating; "
      f"load average at each run's start: {loads}")
print("per rank, milliseconds per call, medians over the runs (each run: the mean of its timed "
      "calls); 'other' = total - the phases (hand-offs between them), its median over the runs")
for kind in ("shaped", "unshaped"):
    rows = [json.load(open(f"{out}/{kind}_{r}.json"))[0] for r in range(runs)]
    nbytes = rows[0]["bytes"]
    wire = statistics.median(row["wire_recv_bytes"] for row in rows)
    limit = wire / link
    times = [row["seconds"] for row in rows]
    t = statistics.median(times)
    if kind == "shaped":
        for r, row in enumerate(rows):
            check("wire_limit_time", row["seconds"], reference=limit, where=f"shaped run {r}")
        print(f"\n{kind}: every down-link {rate}; {nbytes} B fp32; rank 0 receives {wire:.0f} B per "
              f"call, wire limit {limit * 1e3:.2f} ms; time {t * 1e3:.2f} ms = {t / limit:.2f}x "
              f"the wire limit (runs: {' '.join(f'{x * 1e3:.2f}' for x in times)})")
    else:
        print(f"\n{kind}: no shaping; time {t * 1e3:.2f} ms (runs: "
              f"{' '.join(f'{x * 1e3:.2f}' for x in times)}); against the shaped wire limit "
              f"{t / (wire / link):.2f}x")
    print(f"{'rank':>4} " + " ".join(f"{f:>9}" for f in fields) + f" {'other':>9}")
    for rank in range(4):
        med = {f: statistics.median(row["profile"][rank][f] for row in rows) * 1e3 for f in fields}
        phases = ("header", "encode", "wire_wait", "agreement", "decode")
        other = statistics.median(
            (row["profile"][rank]["total"] - sum(row["profile"][rank][f] for f in phases)) * 1e3
            for row in rows)
        print(f"{rank:>4} " + " ".join(f"{med[f]:9.3f}" for f in fields) + f" {other:9.3f}")
check.refuse_if_off()
PY
)
echo "$summary"
if [[ -n $results ]]; then
  {
    echo "# Where a SparseAllReduce's time goes, per rank (bench/sparse_profile.sh)"
    echo
    echo "Written by the script; do not edit. Date: $(date -u '+%Y-%m-%d %H:%M UTC')."
    echo "Machine: $(uname -n), $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -1); 4 ranks share its cores."
    echo "Tree: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- comm transport codecs || echo ' + uncommitted changes')."
    echo "Command: \`$command_line\`"
    echo "Load average (1, 5, 15 min): $load_before before the runs, $load_after after."
    echo
    echo '```'
    echo "$summary"
    echo '```'
  } > "$results"
  echo "sparse_profile: wrote $results"
fi
