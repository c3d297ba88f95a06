#!/usr/bin/env bash
# Communicator figures on emulated slow links (tools/testbed), one run, ratios side by side:
#   1. 4 ranks, every down-link shaped to --rate: SparseAllReduce (top_k 64, 2-bit) vs dense
#      fp32 ring AllReduce of the same tensor (LBCC's and Gloo's, the peer torch.distributed
#      runs), and SparseAllReduce vs its own wire limit
#      (payload bytes each rank receives / link rate), for the parameters as one tensor and as
#      --tensors equal tensors (a model's layers: encode and exchange then overlap);
#      the same without shaping shows what the codecs cost on this machine's cores;
#   2. heterogeneous: ranks 0 and 1 on an unshaped fast island, ranks 2 and 3 behind shaped
#      links: hierarchical vs flat (direct) algorithm, slow-link bytes and time;
#   3. the same island as a site (a cluster behind one shared WAN link at --rate, testbed
#      --site), ranks 2 and 3 behind their own links: hierarchical vs flat;
#      2. and 3. also with the parameters as --tensors tensors.
#
#   4. with --baseline BIN (an lbcc_perf built from another tree, e.g. before a change): the
#      SparseAllReduce runs of 1. (one tensor, --tensors tensors) again with BIN, alternating
#      with this tree's binary --pairs times, side by side (a before/after in one run).
#
#   5. with --dense (instead of 1.-4.): only the dense fp32 ring all-reduce, at each rate of
#      --dense_rates: LBCC over slow links (every rank its own island, the slow-link scheduler),
#      LBCC over fast links (one island), Gloo's ring, each against the ring's wire limit
#      (2 (n-1)/n x bytes per down-link), --pairs alternating rounds (with --baseline, its binary
#      too), medians; written to --results (default bench/results/dense_ring.md).
#
#   bench/comm_testbed_perf.sh [--rate 100mbit] [--bytes 16M] [--iters 3] [--tensors 16] [--out DIR]
#                              [--baseline BIN --pairs 3] [--results bench/results/comm_testbed.md]
#   bench/comm_testbed_perf.sh --dense [--dense_rates 100mbit,400mbit] [--pairs 3] [--baseline BIN]
#
# Needs root (network namespaces); builds //bench:lbcc_perf. Prints a summary table, writes it
# with the date, machine, command and load average before and after the runs to --results, and
# leaves the per-run JSON in --out (default /tmp/lbcc_comm_perf). Refuses to write (exit 3, the
# reason printed, --results left as it was) when a baseline is off its expected range
# (bench/baselines.py): Gloo's ring or an LBCC run against the wire limit it divides by.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/flags.sh
flags_value rate 100mbit "rate of a shaped link (tc syntax)"
flags_value bytes 16M "tensor size (K, M, G suffixes)"
flags_value iters 3 "timed iterations per run"
flags_value tensors 16 "tensors the parameters are split into for the --tensors runs"
flags_value out /tmp/lbcc_comm_perf "folder for the per-run JSON and logs"
flags_value baseline "" "a second lbcc_perf binary to compare this tree's with (before/after)"
flags_value pairs 3 "alternating runs of this tree's and the --baseline binary"
flags_value results bench/results/comm_testbed.md "where the summary is written (empty: nowhere)"
flags_bool dense "only the dense ring at each --dense_rates rate (see 5. above)"
flags_value dense_rates 100mbit,400mbit "rates of the --dense runs"
command_line="bench/comm_testbed_perf.sh $*"
flags_parse "$@"
((${#FLAGS_ARGS[@]} == 0)) || { echo "comm_testbed_perf: unexpected argument ${FLAGS_ARGS[0]}" >&2; exit 2; }
rate=$FLAG_rate bytes=$FLAG_bytes iters=$FLAG_iters tensors=$FLAG_tensors out=$FLAG_out
baseline=$FLAG_baseline pairs=$FLAG_pairs results=$FLAG_results
if ((FLAG_dense)) && [[ $results == bench/results/comm_testbed.md ]]; then
  results=bench/results/dense_ring.md
fi
if [[ -n $baseline && ! -x $baseline ]]; then
  echo "comm_testbed_perf: --baseline $baseline is not an executable" >&2; exit 2
fi
T=tools/testbed/testbed
if ! why=$($T check); then echo "comm_testbed_perf: $why" >&2; exit 1; fi
bazel build -c opt //bench:lbcc_perf //bench:gloo_allreduce >/dev/null 2>&1 ||
  bazel build -c opt //bench:lbcc_perf //bench:gloo_allreduce
perf=$PWD/bazel-bin/bench/lbcc_perf
gloo=$PWD/bazel-bin/bench/gloo_allreduce
mkdir -p "$out"
load_before=$(bench/baselines.py load)
name="cp$$"
trap '$T down --name "$name" >/dev/null 2>&1 || true' EXIT
$T down --stale >/dev/null 2>&1 || true

# run LABEL TOPOLOGY_JSON PERF_ARGS...: one lbcc_perf rank per host; rank 0 writes the JSON.
run() {
  local label=$1 topo=$2
  shift 2
  local topo_args=()
  if [[ -n $topo ]]; then
    echo "$topo" > "$out/$label.topology.json"
    topo_args=(--topology "$out/$label.topology.json")
  fi
  local port=$((29000 + RANDOM % 1000))
  local pids=()
  for rank in 0 1 2 3; do
    $T exec --name "$name" "$rank" -- env UCX_TLS=tcp UCX_NET_DEVICES=eth0 UCX_MEM_EVENTS=no \
      LBCC_LISTEN_ADDR="$($T addr --name "$name" "$rank")" \
      LBCC_BOOTSTRAP_ADDR="$($T addr --name "$name" 0):$port" LBCC_TIMEOUT_S=120 \
      RANK=$rank WORLD_SIZE=4 \
      "${PERF:-$perf}" --min_bytes "$bytes" --max_bytes "$bytes" --iters "$iters" --warmup 1 --quiet \
      "${topo_args[@]}" --json "$out/$label.json" "$@" \
      > "$out/$label.rank$rank.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  if ((rc)); then
    echo "comm_testbed_perf: $label failed; logs in $out/$label.rank*.log" >&2
    tail -5 "$out/$label".rank*.log >&2
    exit 1
  fi
  echo "  $label done"
}

# gloo LABEL: Gloo's dense ring all-reduce of the same bytes, one rank per host.
gloo_run() {
  local label=$1 store
  store=$(mktemp -d)
  local pids=()
  for rank in 0 1 2 3; do
    $T exec --name "$name" "$rank" -- "$gloo" --rank "$rank" --size 4 --store "$store" \
      --addr "$($T addr --name "$name" "$rank")" --bytes "$bytes" --iters "$iters" --warmup 1 \
      --json "$out/$label.json" > "$out/$label.rank$rank.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  rm -rf "$store"
  if ((rc)); then
    echo "comm_testbed_perf: $label failed; logs in $out/$label.rank*.log" >&2
    tail -5 "$out/$label".rank*.log >&2
    exit 1
  fi
  echo "  $label done"
}

if ((FLAG_dense)); then
  loads=()
  IFS=, read -r -a dense_rates <<< "$FLAG_dense_rates"
  for r in "${dense_rates[@]}"; do
    echo "== dense ring: 4 ranks, every down-link $r"
    $T up --name "$name" --hosts 4 --rate "$r" --slow 0,1,2,3 --owner-pid $$ >/dev/null
    for ((p = 0; p < pairs; ++p)); do
      loads+=("$(cut -d' ' -f1 /proc/loadavg)")
      run "dense_${r}_${p}_slow" '{"nranks": 4}' --op allreduce -c 0
      run "dense_${r}_${p}_fast" '' --op allreduce -c 0
      gloo_run "dense_${r}_${p}_gloo"
      if [[ -n $baseline ]]; then
        PERF=$baseline run "dense_${r}_${p}_slow_before" '{"nranks": 4}' --op allreduce -c 0
        PERF=$baseline run "dense_${r}_${p}_fast_before" '' --op allreduce -c 0
      fi
    done
    $T down --name "$name" >/dev/null
  done
  load_after=$(bench/baselines.py load)
  summary=$(python3 - "$out" "$FLAG_dense_rates" "$pairs" "${baseline:+yes}" "${loads[*]}" "$results" <<'PY'
import json, re, statistics, sys
sys.path.insert(0, "bench")
import baselines
out, rates, pairs, with_baseline, loads = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4] == "yes", sys.argv[5]
check = baselines.Checker(sys.argv[6])
def seconds(label):
    d = json.load(open(f"{out}/{label}.json"))
    return d["seconds"] if isinstance(d, dict) else d[0]["seconds"]
print(f"dense fp32 ring all-reduce, 4 ranks, one per emulated host, every down-link shaped; medians of "
      f"{pairs} alternating rounds (load average at each round's start: {loads})")
print(f"{'rate':>8} {'bytes':>9} {'wire limit':>10} {'run':>22} {'time (s)':>9} {'/ wire':>7} {'/ gloo':>7}  per round")
for rate in rates:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    link = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8
    first = json.load(open(f"{out}/dense_{rate}_0_slow.json"))
    nbytes = (first if isinstance(first, dict) else first[0])["bytes"]
    wire = 2 * 3 / 4 * nbytes / link
    kinds = [("slow", "lbcc, slow links"), ("fast", "lbcc, fast island"), ("gloo", "gloo ring")]
    if with_baseline:
        kinds += [("slow_before", "baseline, slow links"), ("fast_before", "baseline, fast island")]
    for k, what in kinds:  # every run's wire limit; Gloo's ring is the baseline of "/ gloo"
        for p in range(pairs):
            check("gloo_wire_limit_time" if k == "gloo" else "wire_limit_time",
                  seconds(f"dense_{rate}_{p}_{k}"), reference=wire, where=f"{rate} {what} round {p}")
    med = {k: statistics.median(seconds(f"dense_{rate}_{p}_{k}") for p in range(pairs)) for k, _ in kinds}
    for k, what in kinds:
        rounds = " ".join(f"{seconds(f'dense_{rate}_{p}_{k}'):.3f}" for p in range(pairs))
        print(f"{rate:>8} {nbytes:>9} {wire:9.3f}s {what:>22} {med[k]:9.3f} {med[k] / wire:6.2f}x "
              f"{med[k] / med['gloo']:6.2f}x  {rounds}")
check.refuse_if_off()
PY
)
  echo "$summary"
  if [[ -n $results ]]; then
    {
      echo "# Dense ring all-reduce on emulated slow links (bench/comm_testbed_perf.sh --dense)"
      echo
      echo "Written by the script; do not edit. Date: $(date -u '+%Y-%m-%d %H:%M UTC')."
      echo "Machine: $(uname -n), $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -1), shared with other jobs."
      echo "Tree: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- comm transport || echo ' + uncommitted changes')${baseline:+; baseline binary: $baseline}."
      echo "Command: \`$command_line\`"
      echo "Load average (1, 5, 15 min): $load_before before the runs, $load_after after."
      echo
      echo '```'
      echo "$summary"
      echo '```'
    } > "$results"
    echo "comm_testbed_perf: wrote $results"
  fi
  exit 0
fi

echo "== flat: 4 ranks, every down-link $rate"
$T up --name "$name" --hosts 4 --rate "$rate" --slow 0,1,2,3 --owner-pid $$ >/dev/null
run flat_sparse '{"nranks": 4}' --op sparse_allreduce
run flat_sparse_tensors '{"nranks": 4}' --op sparse_allreduce --tensors "$tensors"
run flat_dense '{"nranks": 4}' --op allreduce
gloo_run flat_gloo
if [[ -n $baseline ]]; then
  for ((p = 0; p < pairs; ++p)); do
    PERF=$baseline run "ab${p}_before_sparse" '{"nranks": 4}' --op sparse_allreduce
    run "ab${p}_after_sparse" '{"nranks": 4}' --op sparse_allreduce
    PERF=$baseline run "ab${p}_before_sparse_tensors" '{"nranks": 4}' --op sparse_allreduce \
      --tensors "$tensors"
    run "ab${p}_after_sparse_tensors" '{"nranks": 4}' --op sparse_allreduce --tensors "$tensors"
  done
fi
$T down --name "$name" >/dev/null

echo "== the same 4 ranks, no shaping: the codecs' share (4 ranks on this machine's cores)"
$T up --name "$name" --hosts 4 --owner-pid $$ >/dev/null
run unshaped_sparse '{"nranks": 4}' --op sparse_allreduce
run unshaped_sparse_tensors '{"nranks": 4}' --op sparse_allreduce --tensors "$tensors"
$T down --name "$name" >/dev/null

echo "== heterogeneous: ranks 0,1 fast island, ranks 2,3 behind $rate"
$T up --name "$name" --hosts 4 --rate "$rate" --slow 2,3 --owner-pid $$ >/dev/null
hetero='{"nranks": 4, "islands": [[0, 1]]}'
run hetero_hierarchical "$hetero" --op sparse_allreduce --algo hierarchical
run hetero_flat "$hetero" --op sparse_allreduce --algo direct
run hetero_hierarchical_tensors "$hetero" --op sparse_allreduce --algo hierarchical --tensors "$tensors"
run hetero_flat_tensors "$hetero" --op sparse_allreduce --algo direct --tensors "$tensors"
$T down --name "$name" >/dev/null

echo "== heterogeneous site: ranks 0,1 share one $rate link, ranks 2,3 behind their own"
$T up --name "$name" --hosts 4 --rate "$rate" --slow 2,3 --site 0,1 --owner-pid $$ >/dev/null
run site_hierarchical "$hetero" --op sparse_allreduce --algo hierarchical
run site_flat "$hetero" --op sparse_allreduce --algo direct
run site_hierarchical_tensors "$hetero" --op sparse_allreduce --algo hierarchical --tensors "$tensors"
run site_flat_tensors "$hetero" --op sparse_allreduce --algo direct --tensors "$tensors"
$T down --name "$name" >/dev/null

load_after=$(bench/baselines.py load)
summary=$(python3 - "$out" "$rate" "$tensors" "$pairs" "${baseline:+yes}" "$results" <<'PY'
import json, re, sys
sys.path.insert(0, "bench")
import baselines
out, rate = sys.argv[1], sys.argv[2]
check = baselines.Checker(sys.argv[6])
pairs, with_baseline = int(sys.argv[4]), sys.argv[5] == "yes"
m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
bits = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
link = bits / 8  # bytes per second of one shaped down-link
r = {k: json.load(open(f"{out}/{k}.json"))[0] for k in
     ["flat_sparse", "flat_sparse_tensors", "flat_dense", "unshaped_sparse",
      "unshaped_sparse_tensors", "hetero_hierarchical", "hetero_flat",
      "hetero_hierarchical_tensors", "hetero_flat_tensors", "site_hierarchical", "site_flat",
      "site_hierarchical_tensors", "site_flat_tensors"]}
gloo = json.load(open(f"{out}/flat_gloo.json"))
fs, fd = r["flat_sparse"], r["flat_dense"]
wire_limit = fs["wire_recv_bytes"] / link
# The wire limits every ratio below divides by, and Gloo's ring, the baseline of "/ Gloo".
ring_limit = 2 * 3 / 4 * fd["bytes"] / link
check("gloo_wire_limit_time", gloo["seconds"], reference=ring_limit, where="flat_gloo")
check("wire_limit_time", fd["seconds"], reference=ring_limit, where="flat_dense")
for k in ("flat_sparse", "flat_sparse_tensors"):
    check("wire_limit_time", r[k]["seconds"], reference=r[k]["wire_recv_bytes"] / link, where=k)
for p in range(pairs if with_baseline else 0):
    for k in ("before_sparse", "after_sparse", "before_sparse_tensors", "after_sparse_tensors"):
        row = json.load(open(f"{out}/ab{p}_{k}.json"))[0]
        check("wire_limit_time", row["seconds"], reference=row["wire_recv_bytes"] / link,
              where=f"ab{p}_{k}")
check.refuse_if_off()
print(f"\nlink rate {rate} ({link/1e6:.2f} MB/s per down-link), tensor {fs['count']} fp32")
print(f"{'run':28} {'time(s)':>9} {'rank0_recv(B)':>14} {'slow_recv_all_ranks(B)':>23}")
for k, v in r.items():
    print(f"{k:28} {v['seconds']:9.4f} {v['wire_recv_bytes']:14.0f} {v['slow_recv_bytes_all_ranks']:23.0f}")
print(f"{'flat_gloo (dense ring)':28} {gloo['seconds']:9.4f}")
print(f"\nSparseAllReduce / dense AllReduce time      = 1/{fd['seconds']/fs['seconds']:.1f}  (goal <= 1/50)")
print(f"SparseAllReduce / Gloo dense ring time      = 1/{gloo['seconds']/fs['seconds']:.1f}; "
      f"LBCC dense ring / Gloo = {fd['seconds']/gloo['seconds']:.2f}")
print(f"SparseAllReduce / its wire limit ({wire_limit:.4f} s) = {fs['seconds']/wire_limit:.2f}x  (goal <= 1.3x)")
ft = r["flat_sparse_tensors"]
ft_limit = ft["wire_recv_bytes"] / link
print(f"  same parameters as {sys.argv[3]} tensors: {ft['seconds']:.4f} s / wire limit ({ft_limit:.4f} s) = "
      f"{ft['seconds']/ft_limit:.2f}x; vs dense = 1/{fd['seconds']/ft['seconds']:.1f}, "
      f"vs Gloo = 1/{gloo['seconds']/ft['seconds']:.1f}")
us, ut = r["unshaped_sparse"], r["unshaped_sparse_tensors"]
print(f"  unshaped links (encode + decode on this machine, no wire limit): 1 tensor {us['seconds']:.4f} s, "
      f"{sys.argv[3]} tensors {ut['seconds']:.4f} s")
printed = set()
for label in ["hetero", "site", "hetero", "site"]:
    suffix = "" if f"{label}:" not in printed else "_tensors"
    printed.add(f"{label}:")
    hh, hf = r[f"{label}_hierarchical{suffix}"], r[f"{label}_flat{suffix}"]
    what = f"{label}{' (' + sys.argv[3] + ' tensors)' if suffix else ''}"
    print(f"{what}: hierarchical / flat time = {hh['seconds']/hf['seconds']:.2f}, slow-link "
          f"bytes (all ranks) {hh['slow_recv_bytes_all_ranks']:.0f} / "
          f"{hf['slow_recv_bytes_all_ranks']:.0f} = "
          f"{hh['slow_recv_bytes_all_ranks']/hf['slow_recv_bytes_all_ranks']:.2f}")
if with_baseline:
    print(f"\nbefore/after ({pairs} alternating pairs, --baseline binary first in each pair), "
          f"time / wire limit:")
    for kind, what in [("sparse", "one tensor"), ("sparse_tensors", f"{sys.argv[3]} tensors")]:
        rows = []
        for p in range(pairs):
            b = json.load(open(f"{out}/ab{p}_before_{kind}.json"))[0]
            a = json.load(open(f"{out}/ab{p}_after_{kind}.json"))[0]
            rows.append((b["seconds"] / (b["wire_recv_bytes"] / link),
                         a["seconds"] / (a["wire_recv_bytes"] / link)))
        before = " ".join(f"{x:.2f}x" for x, _ in rows)
        after = " ".join(f"{y:.2f}x" for _, y in rows)
        mb = sorted(x for x, _ in rows)[len(rows) // 2]
        ma = sorted(y for _, y in rows)[len(rows) // 2]
        print(f"  {what}: before {before} | after {after} | medians {mb:.2f}x -> {ma:.2f}x "
              f"(after / before {ma / mb:.2f})")
PY
)
echo "$summary"
if [[ -n $results ]]; then
  mkdir -p "$(dirname "$results")"
  {
    echo "# Communicator on emulated slow links (bench/comm_testbed_perf.sh)"
    echo
    echo "Written by the script; do not edit. Date: $(date -u '+%Y-%m-%d %H:%M UTC')."
    echo "Machine: $(uname -n), $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -1)."
    echo "Tree: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)${baseline:+; baseline binary: $baseline}."
    echo "Command: \`$command_line\`"
    echo "Load average (1, 5, 15 min): $load_before before the runs, $load_after after."
    echo
    echo '```'
    echo "$summary"
    echo '```'
  } > "$results"
  echo "comm_testbed_perf: wrote $results"
fi