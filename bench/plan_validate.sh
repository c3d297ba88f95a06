#!/usr/bin/env bash
# Validates `lbcc plan` against tools/testbed: (a) bench/lbcc_perf's SparseAllReduce and dense
# ring AllReduce at 25, 100 and 400 Mbit/s per down-link (tbf), 4 and 8 ranks as processes, one
# rank per emulated host; (b) examples/hetero_training (its own CLI, hetero.py: SparseLoCo with
# an uncompressed and a k/d = 1/16 pipeline replica) at --hetero_rates, per-step time and
# slow-link bytes. Beside each, the plan's prediction for the same layout. Writes
# bench/results/plan_validation.md (date, machine, command, load; predicted vs measured, ratio).
#
#   bench/plan_validate.sh [--quick] [--rates 25,100,400] [--ranks 4,8] [--parts perf,hetero]
#                          [--bytes 16M] [--tensors 16] [--iters 10] [--dense_iters 2]
#                          [--reps 3] [--window_rows 1] [--probe_s 3] [--probe_rounds 7]
#                          [--hetero_rates 100,25]
#                          [--hetero_steps 40] [--burst auto] [--limit 1mb] [--name plan]
#                          [--out DIR]
#   bench/plan_validate.sh --report_only [--out DIR]     rewrite the report from DIR's runs
#
# --quick: --reps 3 --iters 10 --dense_iters 1 --window_rows 0 --probe_s 2 (the whole table,
# 8 ranks at 400 Mbit/s and the hetero part included; the report records how long the runs
# took). --rates / --ranks / --parts pick a subset. Testbeds are named <name>u<pid> (unshaped)
# and <name>s<pid> (shaped): --name keeps parallel runs apart. --burst auto gives each tbf 5 ms
# of its rate (at least 32 kB): with the testbed's 32 kB a 400 Mbit/s link waits for the
# qdisc's timer on loaded cores and delivers a fraction of its rate.
#
# The N ranks share this machine's cores, so the model is given each layout's CPU
# (docs/planning.md, "Shared cores"): an unshaped calibration run of the same lbcc_perf right
# before each shaped run (LBCC_DEBUG=TRACE: every rank's encode / exchange+validation / decode
# per call; medians over calls into the plan's "cpu" section), and the unshaped dense
# all-reduce's ring pass for the host's cost per byte moved ("cpu.copy_gbytes_s", with the
# machine's cores as "cpu.shared_cores"). The shaped links are probed before the calibrations
# (bench/plan_probe.py, in each op's pattern: a ring relay through the transport's credit window
# for the dense ring, a burst of every rank's blob to every other for SparseAllReduce, and a
# window's credit cycle): the plan predicts from the nominal rates and, as the "probed"
# prediction, from the measured ones. hetero_training runs at 10 Gbit/s first (its compute per
# step) and then at each rate.
# Needs root (network namespaces); builds //bench:lbcc_perf, //tools:lbcc, //python:lbcc/_lbcc.so.
# Refuses to write the report (exit 3, the reason printed, the file left as it was) when a probed
# link rate is off its expected range against the nominal one (bench/baselines.py).
set -euo pipefail
cd "$(dirname "$0")/.."
rates=25,100,400 ranks_list=4,8 bytes=16M tensors=16 iters=10 dense_iters=2 reps=3 window_rows=1
probe_s=3 out=/tmp/lbcc_plan_validate hetero_rates=100,25 hetero_steps=40 parts=perf,hetero
tbname=plan burst=auto limit=1mb burst_rounds=7
cmdline="bench/plan_validate.sh $*"
report_only=0
quick() { reps=3 iters=10 dense_iters=1 window_rows=0 probe_s=2; }
# --quick first, so that options after it still override it.
for arg in "$@"; do [[ $arg != --quick ]] || quick; done
while (($#)); do
  case "$1" in
    --quick) ;;
    --rates) rates=$2; shift ;;
    --ranks) ranks_list=$2; shift ;;
    --bytes) bytes=$2; shift ;;
    --tensors) tensors=$2; shift ;;
    --iters) iters=$2; shift ;;
    --dense_iters) dense_iters=$2; shift ;;
    --reps) reps=$2; shift ;;
    --window_rows) window_rows=$2; shift ;;
    --probe_s) probe_s=$2; shift ;;
    --probe_rounds) burst_rounds=$2; shift ;;
    --out) out=$2; shift ;;
    --hetero_rates) hetero_rates=$2; shift ;;
    --hetero_steps) hetero_steps=$2; shift ;;
    --parts) parts=$2; shift ;;
    --name) tbname=$2; shift ;;
    --burst) burst=$2; shift ;;
    --limit) limit=$2; shift ;;
    --report_only) report_only=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[[ $tbname =~ ^[A-Za-z0-9_]{1,10}$ ]] || { echo "--name: letters, digits, _ (at most 10)" >&2; exit 2; }
T=tools/testbed/testbed
if ((report_only)); then
  # The runs' own settings, as recorded when they were made.
  # shellcheck disable=SC1091
  source "$out/settings.sh"
else
if ! why=$($T check); then echo "plan_validate: $why" >&2; exit 1; fi
targets="//bench:lbcc_perf //tools:lbcc"
[[ $parts != *hetero* ]] || targets="$targets //python:lbcc/_lbcc.so"
# shellcheck disable=SC2086
bazel build --jobs=2 $targets >/dev/null 2>&1 || bazel build --jobs=2 $targets
perf=$PWD/bazel-bin/bench/lbcc_perf
lbcc=$PWD/bazel-bin/tools/lbcc
nbytes=$(/usr/bin/python3 -c "import re; m = re.fullmatch(r'(\d+)([KMG]?)', '$bytes'); \
print(int(m.group(1)) << {'': 0, 'K': 10, 'M': 20, 'G': 30}[m.group(2)])")
rm -rf "$out"
mkdir -p "$out"
t_begin=$(date +%s)
unshaped="${tbname}u$$" shaped="${tbname}s$$"
trap '$T down --name "$unshaped" >/dev/null 2>&1 || true; $T down --name "$shaped" >/dev/null 2>&1 || true' EXIT
$T down --stale >/dev/null 2>&1 || true

# run TESTBED LABEL NRANKS PERF_ARGS...: one lbcc_perf rank per host; rank 0 writes the JSON.
# Every run times the out-of-place and the in-place variant (lbcc_perf's two columns).
run() {
  local tb=$1 label=$2 n=$3
  shift 3
  echo "{\"nranks\": $n}" > "$out/$label.topology.json"
  local port=$((29000 + RANDOM % 1000))
  local root pids=() rank
  root=$($T addr --name "$tb" 0)
  for ((rank = 0; rank < n; rank++)); do
    $T exec --name "$tb" "$rank" -- env UCX_TLS=tcp UCX_NET_DEVICES=eth0 UCX_MEM_EVENTS=no \
      LBCC_LISTEN_ADDR="$($T addr --name "$tb" "$rank")" LBCC_BOOTSTRAP_ADDR="$root:$port" \
      LBCC_TIMEOUT_S=300 LBCC_DEBUG="${LBCC_DEBUG_LEVEL:-WARN}" RANK=$rank WORLD_SIZE=$n \
      ${LBCC_SLOW_WINDOW_BYTES:+LBCC_SLOW_WINDOW_BYTES=$LBCC_SLOW_WINDOW_BYTES} \
      "$perf" --min_bytes "$bytes" --max_bytes "$bytes" --check 0 --quiet \
      --topology "$out/$label.topology.json" --json "$out/$label.json" "$@" \
      > "$out/$label.rank$rank.log" 2>&1 &
    pids+=($!)
  done
  local rc=0 pid
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  if ((rc)); then
    echo "plan_validate: $label failed; logs in $out/$label.rank*.log" >&2
    tail -5 "$out/$label".rank*.log >&2
    exit 1
  fi
  echo "  $label done ($(($(date +%s) - t_begin)) s)"
}

# pair_bytes NRANKS: the bytes one rank's SparseAllReduce blob puts on another rank's down-link,
# as the plan predicts them (its bytes are exact against the codecs): the probe's burst size.
pair_bytes() {
  local n=$1 doc="$out/pair_bytes_n$1.json"
  echo "{\"topology\": {\"nranks\": $n}, \"rates\": {\"default\": {\"down_mbit\": 100,
    \"up_mbit\": 10000, \"latency_ms\": 0.05}}, \"job\": {\"top_k\": 64, \"values\": \"binmean2\",
    \"indices\": \"auto\"}, \"collective\": {\"op\": \"sparse_allreduce\", \"bytes\": $nbytes,
    \"tensors\": $tensors}}" > "$doc"
  "$lbcc" plan --json "$doc" | /usr/bin/python3 -c \
    "import json, sys; print(int(json.load(sys.stdin)['wire_recv_bytes']) // ($n - 1))"
}

# probe LABEL NRANKS RATE: bench/plan_probe.py on every host of the shaped testbed at once. The
# rate phase is comm's ring on the transport's slow-link window: 1 MiB segments, a rank sending
# a segment only once it has received one beyond its own piece, in 256 KiB chunks with a credit
# each and 4 chunks uncredited (transport::WindowBytes on these links); the burst phase sends
# each rank's SparseAllReduce blob to every other rank at once, rounds 2.5 nominal drain times
# apart.
probe() {
  local label=$1 n=$2 r=$3
  local addrs port start pids=() rank pid pair period slack rate_s
  pair=$(pair_bytes "$n")
  # comm's ring: 1 MiB segments, each rank's piece (bytes / N) its own to send at the start.
  slack=$(( (nbytes / n + 1048575) / 1048576 ))
  # The relay's rate phase: at least 20 segments through each link between its edges (a
  # shorter count sees the slack, not the pace).
  rate_s=$(/usr/bin/python3 -c "print(max($probe_s, 20 * 8 * 1048576 / ($r * 0.95e6) + 1.5))")
  period=$(/usr/bin/python3 -c "print(max(0.05, 2.5 * $((n - 1)) * $pair * 8 / ($r * 0.95e6)))")
  addrs=$(for ((rank = 0; rank < n; rank++)); do $T addr --name "$shaped" "$rank"; done | paste -sd,)
  port=$((30000 + RANDOM % 1000))
  start=$(/usr/bin/python3 -c "import time; print(time.time() + 1.5)")
  for ((rank = 0; rank < n; rank++)); do
    $T exec --name "$shaped" "$rank" -- /usr/bin/python3 bench/plan_probe.py --rank "$rank" \
      --addrs "$addrs" --port "$port" --start "$start" --seconds "$probe_s" \
      --rate_seconds "$rate_s" --window 262144 --chunk 262144 --inflight 1048576 \
      --segment 1048576 --slack "$slack" --burst_bytes "$pair" --burst_rounds "$burst_rounds" \
      --burst_period "$period" --out "$out/$label.rank$rank.json" \
      > "$out/$label.rank$rank.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || { echo "plan_validate: probe $label failed" >&2; tail -5 "$out/$label".rank*.log >&2; exit 1; }
  done
  echo "  $label done ($(($(date +%s) - t_begin)) s)"
}

all_ranks=$(echo "$ranks_list" | tr ',' ' ')
all_rates=$(echo "$rates" | tr ',' ' ')
uptime > "$out/load_start.txt"
if [[ $parts == *perf* ]]; then
# Other work on the machine changes the codec CPU time from minute to minute, so every shaped
# run comes right after its own unshaped calibration, --reps times. The unshaped testbed stays
# up beside the shaped one (separate namespaces and bridges).
for n in $all_ranks; do
  slow=$(seq -s, 0 $((n - 1)))
  $T up --name "$unshaped" --hosts "$n" --owner-pid $$ >/dev/null
  for r in $all_rates; do
    # tbf's burst: what the link may send at once when the qdisc's timer fires late. The
    # testbed's 32 kB drain in 0.65 ms at 400 Mbit/s, so on loaded cores the timer's delay,
    # not the rate, limits the link; --burst auto gives every rate 5 ms of its bytes (at least
    # 32 kB), which keeps the average at the rate.
    b=$burst
    [[ $b != auto ]] || b="$(( r * 5000 / 8 / 1024 > 32 ? r * 5000 / 8 / 1024 : 32 ))kb"
    $T up --name "$shaped" --hosts "$n" --rate "${r}mbit" --slow "$slow" --burst "$b" \
      --limit "$limit" --owner-pid $$ >/dev/null
    for ((rep = 0; rep < reps; rep++)); do
      # The probe first, then each shaped run right after its own CPU calibration: the load
      # of the seconds between is what the calibration cannot see.
      echo "== $n ranks, ${r} Mbit/s, repetition $rep: probe, calibration (unshaped), shaped"
      # The links do not change between repetitions, the cores' load does: one probe.
      ((rep > 0)) || probe "probe_n${n}_r${r}_$rep" "$n" "$r"
      LBCC_DEBUG_LEVEL=TRACE run "$unshaped" "cal_sparse_n${n}_r${r}_$rep" "$n" \
        --op sparse_allreduce --tensors "$tensors" --iters "$iters"
      uptime > "$out/load_n${n}_r${r}_$rep.txt"
      LBCC_DEBUG_LEVEL=TRACE run "$shaped" "sparse_n${n}_r${r}_$rep" "$n" \
        --op sparse_allreduce --tensors "$tensors" --iters "$iters"
      if ((rep == 0)); then
        LBCC_DEBUG_LEVEL=TRACE run "$unshaped" "cal_dense_n${n}_r${r}" "$n" --op allreduce \
          --iters 3
        # No warm-up: the connections are made (and probed) at start-up, and the in-place
        # variant follows the out-of-place one.
        run "$shaped" "dense_n${n}_r${r}" "$n" --op allreduce --iters "$dense_iters" --warmup 0
        if ((window_rows)); then
          # The same with a 4 MiB slow-link window (default: transport::WindowBytes, 4 chunks
          # here): the credit-window term is what separates the two predictions.
          LBCC_SLOW_WINDOW_BYTES=4194304 run "$shaped" "densew_n${n}_r${r}" "$n" --op allreduce \
            --iters "$dense_iters" --warmup 0
        fi
      fi
    done
    $T down --name "$shaped" >/dev/null
  done
  $T down --name "$unshaped" >/dev/null
done
fi
if [[ $parts == *hetero* ]]; then
  # examples/hetero_training through its own CLI (its own testbed, named ht<pid>): 10 Gbit/s
  # (compute per step), then each rate, then 10 Gbit/s again (the compute is the mean of the
  # two: other work on the cores changes it over the minutes between).
  for r in 10000 $(echo "$hetero_rates" | tr ',' ' ') 10000b; do
    echo "== hetero_training at ${r%b} Mbit/s"
    uptime > "$out/load_hetero_r$r.txt"
    /usr/bin/python3 examples/hetero_training/hetero.py --preset smoke \
      --runs sparseloco,hetero_k16_lossy --steps "$hetero_steps" --rate "${r%b}mbit" \
      --out "$out/hetero_r$r" > "$out/hetero_r$r.log" 2>&1 ||
      { echo "plan_validate: hetero_training at ${r%b} Mbit/s failed; see $out/hetero_r$r.log" >&2; exit 1; }
    echo "  hetero_r$r done ($(($(date +%s) - t_begin)) s)"
  done
fi
uptime > "$out/load_end.txt"
date -u '+%Y-%m-%d %H:%M UTC' > "$out/date.txt"
echo "$(($(date +%s) - t_begin))" > "$out/wall_s.txt"
declare -p rates ranks_list bytes tensors iters dense_iters reps window_rows burst limit cmdline \
  hetero_rates hetero_steps parts burst_rounds > "$out/settings.sh"
fi
lbcc=$PWD/bazel-bin/tools/lbcc

# Predictions and the report.
/usr/bin/python3 - "$out" "$lbcc" "$bytes" "$tensors" "$rates" "$ranks_list" "$cmdline" \
  "$iters" "$dense_iters" "$reps" "$parts" "$hetero_rates" "$hetero_steps" \
  "${window_rows:-1}" "${burst:-32kb}" "${limit:-1mb}" "${burst_rounds:-7}" <<'PY'
import glob, json, os, platform, re, statistics, subprocess, sys
(out, lbcc, size, tensors, rates, ranks_list, cmdline, iters, dense_iters, reps, parts,
 hetero_rates, hetero_steps, window_rows, burst, limit, burst_rounds) = sys.argv[1:18]
burst_rounds = int(burst_rounds)
reps, window_rows = int(reps), int(window_rows)
mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
m = re.fullmatch(r"(\d+)([KMG]?)", size)
nbytes = int(m.group(1)) * mult[m.group(2)]
rates = [int(r) for r in rates.split(",")]
ranks_list = [int(n) for n in ranks_list.split(",")]
hetero_rates = [int(r) for r in hetero_rates.split(",")] if hetero_rates else []
trace = re.compile(r"encode ([\d.]+) ms, then exchange and validation ([\d.]+) ms, decode ([\d.]+) ms")
LATENCY_MS = 0.05   # per host and direction on the testbed, as the plan is told
EFFICIENCY = 0.95   # nominal: TCP/IP goodput over 1500-byte frames
CPU_BOUND = 0.85    # a probe below this share of the nominal goodput: the host, not the link
CORES = os.cpu_count()  # every rank of a run shares this machine's cores
med = statistics.median

def seconds(label):
    """lbcc_perf times the out-of-place and the in-place variant: both are samples."""
    row = json.load(open(f"{out}/{label}.json"))[0]
    return (row["seconds"] + row["in_place"]["seconds"]) / 2

def timed_calls(label, pattern, timed):
    """Per rank, the TRACE lines of lbcc_perf's timed calls: two variants (out of place, in
    place), each its warm-up, then `timed` calls."""
    per_rank = []
    for log in sorted(glob.glob(f"{out}/{label}.rank*.log")):
        rows = [tuple(map(float, t.groups())) for t in map(pattern.search, open(log)) if t]
        half = len(rows) // 2
        skip = max(0, half - timed)
        per_rank.append(rows[skip:half] + rows[half + skip:])
    calls = min(len(r) for r in per_rank)
    if calls == 0:
        sys.exit(f"plan_validate: no TRACE timings in {out}/{label}.rank*.log")
    return [[r[i] for r in per_rank] for i in range(calls)]  # [call][rank] -> fields

def calibration(label):
    """The unshaped SparseAllReduce's CPU: per call the slowest rank's encode + exchange +
    decode (TRACE), the median over calls (other work on the cores puts outliers into a
    mean); encode and decode the medians over ranks and calls, exchange + validation the
    rest, so that the model's CPU path equals the unshaped call."""
    calls = timed_calls(label, trace, int(iters))
    unshaped = med(max(sum(r) for r in ranks) for ranks in calls)
    e = med(r[0] for ranks in calls for r in ranks)
    d = med(r[2] for ranks in calls for r in ranks)
    return {"encode_ms": e, "exchange_ms": max(0.0, unshaped - e - d), "decode_ms": d,
            "unshaped_ms": unshaped, "mean_ms": seconds(label) * 1e3}

ring_trace = re.compile(r"ring \(tag \d+\): sends done after ([\d.]+) ms")

def dense_calibration(label):
    """The unshaped dense all-reduce: per call the slowest rank's ring pass (TRACE), the median
    over calls."""
    calls = timed_calls(label, ring_trace, 3)
    return med(max(r[0] for r in ranks) for ranks in calls) / 1e3

def copy_rate(n, unshaped_s):
    """The host's per-core byte rate that makes the plan's host term equal the unshaped dense
    all-reduce (docs/planning.md, "Shared cores"): every rank sends and receives 2 (N - 1)
    pieces of bytes / N; on C shared cores the phase takes max(most, sum / C)."""
    moved = 4 * (n - 1) * nbytes  # all ranks, sent + received
    return moved * max(1 / n, 1 / min(n, CORES)) / unshaped_s / 1e9

def probe(label, n):
    """The shaped links as bench/plan_probe.py measured them."""
    hosts = [json.load(open(f"{out}/{label}.rank{r}.json")) for r in range(n)]
    # Per down-link: rank r's is what it received from rank r - 1.
    down = [h["recv_bytes_per_second"] for h in hosts]
    # A host whose probe counted nothing (its sender never got the core in the measured span)
    # measured no rate: the median of the others stands in.
    good = [b for b in down if b > 0]
    down = [b if b > 0 else med(good) for b in down]
    # The burst phase (each rank's SparseAllReduce blob to every other rank at once, after an
    # idle link): what the op's exchange gets, the shaper's bucket included.
    burst = [h.get("burst_bytes_per_second", 0.0) for h in hosts]
    good_b = [b for b in burst if b > 0] or [0.0]
    burst = [b if b > 0 else med(good_b) for b in burst]
    cycle = med(h["credit_cycle_s"] for h in hosts)
    window = hosts[0]["window_bytes"]
    rtt = 4 * LATENCY_MS * 1e-3
    # The ring stream: every link carries the same bytes, the relay holds them to one pace, so
    # its rate is the links' total over their number (the mean).
    return {"mbit": statistics.mean(down) * 8 / 1e6, "down_mbit": [b * 8 / 1e6 for b in down],
            "burst_mbit": med(burst) * 8 / 1e6, "burst_down_mbit": [b * 8 / 1e6 for b in burst],
            "credit_ms": max(0.0, cycle - window / med(down) - rtt) * 1e3,
            "cycle_ms": cycle * 1e3}

def plan(doc, path):
    json.dump(doc, open(path, "w"), indent=1)
    res = subprocess.run([lbcc, "plan", "--json", path], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"plan_validate: lbcc plan {path}: {res.stderr}")
    return json.loads(res.stdout)

def rates_of(rate, pr=None, window=None, key="mbit"):
    if pr is None:
        r = {"efficiency": EFFICIENCY,
             "default": {"down_mbit": rate, "up_mbit": 10000, "latency_ms": LATENCY_MS}}
    else:
        # The probe's goodput is what a link delivers: efficiency 1. Every down-link has the
        # same shaper, so the median over the links is the rate of each: a probe process that
        # waited for a loaded core counts less than its link carried (one such link would set
        # every phase's time).
        r = {"efficiency": 1, "credit_ms": pr["credit_ms"],
             "default": {"down_mbit": pr[key], "up_mbit": 10000, "latency_ms": LATENCY_MS}}
    if window:
        r["window_bytes"] = window
    return r

def predict(n, rate, op, cpu, tag, pr=None, window=None):
    # The probe's rate of the op's own pattern: the SparseAllReduce's exchange is one burst
    # of every blob at once, the dense ring a stream through the credit window.
    key = "burst_mbit" if op == "sparse_allreduce" else "mbit"
    doc = {"topology": {"nranks": n}, "rates": rates_of(rate, pr, window, key), "cpu": cpu,
           "job": {"top_k": 64, "values": "binmean2", "indices": "auto"},
           "collective": {"op": op, "bytes": nbytes, "tensors": int(tensors)}}
    kind = "probed" if pr else "nominal"
    return plan(doc, f"{out}/plan_{op}_n{n}_r{rate}_{tag}_{kind}.json")

rows, cals, probes, not_run = [], [], [], []
if "perf" in parts:
    for n in ranks_list:
        for rate in rates:
            runs = ([f"sparse_n{n}_r{rate}_{rep}" for rep in range(reps)] +
                    [f"dense_n{n}_r{rate}"] + ([f"densew_n{n}_r{rate}"] if window_rows else []))
            if not all(os.path.exists(f"{out}/{r}.json") for r in runs):
                not_run.append(f"{n} ranks at {rate} Mbit/s")  # a run stopped before it
                continue
            dense_cal = dense_calibration(f"cal_dense_n{n}_r{rate}")
            copy = copy_rate(n, dense_cal)
            cals.append((n, rate, "dense", {"unshaped_ms": dense_cal * 1e3, "copy": copy}))
            host = {"copy_gbytes_s": copy, "shared_cores": CORES}
            nom, prb, inr, meas = [], [], [], []
            for rep in range(reps):
                cal = calibration(f"cal_sparse_n{n}_r{rate}_{rep}")
                if rep == 0:
                    pr = probe(f"probe_n{n}_r{rate}_{rep}", n)  # the links', for every rep
                    probes.append((n, rate, rep, pr))
                cals.append((n, rate, rep, cal))
                cpu = {k: cal[k] for k in ("encode_ms", "exchange_ms", "decode_ms")}
                cpu.update(host)
                nom.append(predict(n, rate, "sparse_allreduce", cpu, rep))
                prb.append(predict(n, rate, "sparse_allreduce", cpu, rep, pr))
                # Diagnostic: the codec's encode and decode as the shaped run itself timed
                # them (same load), exchange + validation from the calibration.
                own = calibration(f"sparse_n{n}_r{rate}_{rep}")
                inrun = dict(cpu, encode_ms=own["encode_ms"], decode_ms=own["decode_ms"])
                inr.append(predict(n, rate, "sparse_allreduce", inrun, f"{rep}_inrun", pr))
                meas.append(seconds(f"sparse_n{n}_r{rate}_{rep}"))
                bytes_row = json.load(open(f"{out}/sparse_n{n}_r{rate}_{rep}.json"))[0]
            pr0 = probes[-1][3]
            rows.append((n, rate, "sparse", nom, prb, meas, [pr0],
                         bytes_row, inr))
            variants = [("dense", "dense", None)]
            if window_rows:
                variants.append(("dense, 4 MiB window", "densew", 4194304))
            for label, run, window in variants:
                rows.append((n, rate, label,
                             [predict(n, rate, "allreduce", host, run, None, window)],
                             [predict(n, rate, "allreduce", host, run, pr0, window)],
                             [seconds(f"{run}_n{n}_r{rate}")], [pr0],
                             json.load(open(f"{out}/{run}_n{n}_r{rate}.json"))[0], None))

# examples/hetero_training: the plan of the layout hetero.py runs, compute from its 10 Gbit/s run.
hetero_rows = []
if "hetero" in parts:
    sys.path.insert(0, os.path.abspath("examples/hetero_training"))
    sys.path.insert(0, f"{out}/hetero_r10000/pkg")  # the lbcc package hetero.py staged
    import torch  # noqa: E402 (the example's model: its parameter shapes per shard)
    from model import Data, Stage0, Stage1  # noqa: E402
    D, LAYERS, HEADS, SEQ, BATCH, H = 128, 4, 4, 64, 8, 10  # hetero.py's smoke preset, worker.py
    # The tbf bucket of hetero.py's slow down-links: tools/testbed's default --burst, 32kb
    # (tc's kb: 1024 bytes); docs/planning.md, "Shaper bucket".
    HETERO_BURST = 32 * 1024
    vocab = len(Data(SEQ, BATCH, "grammar").vocab)  # the smoke preset's corpus
    s0 = Stage0(vocab, D, HEADS, LAYERS // 2, SEQ, torch.zeros(vocab, D), 0)
    s1 = Stage1(vocab, D, HEADS, LAYERS - LAYERS // 2, 0)
    shapes = [[list(p.shape) for p in s.parameters()] for s in (s0, s1)]
    stage_params = [sum(p.numel() for p in s.parameters()) for s in (s0, s1)]
    topology = {"nranks": 4, "islands": [[0, 1]],
                "replicas": [{"kind": "full", "rank": 0}, {"kind": "full", "rank": 1},
                             {"kind": "pipeline", "stages": [2, 3]}]}

    def measured(rate, run):
        ranks = [json.load(open(f"{out}/hetero_r{rate}/{run}/rank{r}.json")) for r in range(4)]
        steps = len(ranks[0]["steps"])
        # The boundary-table refresh after each outer step (lossy mode: the synced embedding's
        # changed elements to the later stage) is not in the plan's model: its bytes, counted
        # by the run, are left out of the comparison.
        table = sum(r["payload"].get("table_sent", 0) for r in ranks
                    if r["final_counters"].get("stage_slow"))
        return {"steps": steps, "step_s": max(r["train_seconds"] for r in ranks) / steps,
                "slow_bytes": sum(r["final_counters"]["slow_sent"] for r in ranks) - table}

    def hetero_plan(rate, run, k, full_s, tag):
        doc = {"topology": topology,
               "rates": {"efficiency": EFFICIENCY,
                         "ranks": [{"rank": r, "up_mbit": 10000,
                                    "down_mbit": rate if r >= 2 else 10000,
                                    "latency_ms": LATENCY_MS,
                                    **({"down_burst_bytes": HETERO_BURST} if r >= 2 else {})}
                                   for r in range(4)]},
               "model": {"stage_params": stage_params, "d": D, "layers": LAYERS, "seq_len": SEQ,
                         "vocab": vocab, "tokens_per_step": SEQ * BATCH,
                         "microbatch_tokens": SEQ * BATCH, "shard_shapes": shapes},
               # A full replica's inner step on a core of its own, the pipeline's stages half
               # each; the four ranks share this machine's cores.
               "compute": {"ranks": [{"rank": r, "step_s": full_s if r < 2 else full_s / 2}
                                     for r in range(4)]},
               "cpu": {"shared_cores": CORES},
               "job": {"H": H, "top_k": 64, "values": "binmean2", "indices": "auto",
                       "coefficients": "fp32", "boundary": [{"replica": 2, "k": k}]}}
        return plan(doc, f"{out}/plan_hetero_{run}_r{rate}{tag}.json")["prediction"]

    def alone_step(run, k, step_s):
        """The per-rank compute that makes the plan's 10 Gbit/s step the measured one (the plan
        is monotone in it): bisection."""
        lo, hi = 0.0, step_s
        for _ in range(30):
            mid = (lo + hi) / 2
            if hetero_plan(10000, run, k, mid, "_cal")["outer_s"] / H < step_s:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    for run, k in (("sparseloco", D), ("hetero_k16_lossy", D // 16)):
        before = measured(10000, run)
        after = measured("10000b", run) if os.path.exists(f"{out}/hetero_r10000b") else before
        cal = {"step_s": (before["step_s"] + after["step_s"]) / 2,
               "range": (before["step_s"], after["step_s"])}
        full_s = alone_step(run, k, cal["step_s"])
        for rate in hetero_rates:
            got = measured(rate, run)
            p = hetero_plan(rate, run, k, full_s, "")
            pipe = p["replicas"][2]
            outer = got["steps"] // H
            slow = (got["steps"] * (pipe["boundary_forward_bytes"] + pipe["boundary_backward_bytes"])
                    + outer * sum(p["sync"]["slow_up_bytes"]))
            hetero_rows.append((run, k, rate, cal, full_s, got, p, p["outer_s"] / H, slow))

# The probed rates the probed predictions divide by: a shaper that let more through than its
# rate, or a probe whose hosts never got a core, is refused (nothing written).
sys.path.insert(0, "bench")
import baselines
check = baselines.Checker("bench/results/plan_validation.md")
for n, rate, rep, pr in probes:
    check("shaped_link_rate", pr["mbit"], reference=rate, where=f"probe, {n} ranks at {rate} Mbit/s")
check.refuse_if_off()

lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
model = next((l.split(":", 1)[1].strip() for l in lscpu.splitlines() if l.startswith("Model name")), "?")
load = lambda f: open(f"{out}/{f}").read().strip()
loadavg = lambda f: re.search(r"load average: ([\d.]+)", load(f)).group(1)
wall = open(f"{out}/wall_s.txt").read().strip() if os.path.exists(f"{out}/wall_s.txt") else "?"
md = []
md.append("# `lbcc plan` against the testbed\n")
md.append("Generated by bench/plan_validate.sh.\n")
md.append(f"- date: {open(f'{out}/date.txt').read().strip()} (the runs' end); the runs took "
          f"{wall} s")
md.append(f"- machine: {platform.node()}, {model}, {CORES} CPUs, {platform.platform()}; "
          f"load at start `{load('load_start.txt')}`, at end `{load('load_end.txt')}` "
          "(the load before each shaped run is in the tables)")
md.append(f"- command: `{cmdline.strip()}`")
if "perf" in parts:
    md.append(f"- workload (a): bench/lbcc_perf, {nbytes} dense fp32 bytes ({nbytes // 4} "
              f"parameters); SparseAllReduce as {tensors} tensors, top_k 64/4096, 2-bit values, "
              f"auto index coding, {iters} timed iterations, {reps} repetition(s); dense ring "
              f"AllReduce (pipelined in 1 MiB segments), {dense_iters} timed iteration(s); "
              "every time is the mean of lbcc_perf's out-of-place and in-place variants")
    md.append("- network: tools/testbed, one rank per emulated host, every down-link a tbf at "
              f"the rate (burst {'5 ms of the rate, at least 32 kB' if burst == 'auto' else burst}, "
              f"queue {limit}), up-links unshaped; the plan is given the same "
              "layout (`{\"nranks\": N}`, up_mbit 10000, latency 0.05 ms per host) and the "
              "transport's own slow-link scheduler (chunk 256 KiB, window "
              "transport::WindowBytes: 4 chunks here"
              + ("; the 4 MiB rows set it)" if window_rows else ")"))
    md.append(f"- nominal prediction: down_mbit = the tbf rate, efficiency {EFFICIENCY} (TCP/IP "
              "goodput over 1500-byte frames)")
    md.append("- probed prediction: the rate a probe measured on the shaped testbed right "
              "before the shaped runs (bench/plan_probe.py, every host at once, the op's own "
              "pattern: for the dense ring each down-link's goodput from its left neighbour in "
              "a relay like comm's ring (1 MiB segments, a rank forwarding one for each it has "
              "received beyond its own piece, through the transport's credit window: 256 KiB "
              "chunks, 4 uncredited), the mean over the links; for SparseAllReduce each "
              "down-link's rate in a burst of every rank's blob (the plan's bytes) to every "
              f"other rank at once after an idle link, the median over {burst_rounds} - 1 rounds, "
              "then the median over the links; efficiency 1; "
              "a 256 KiB window's stop-and-wait cycle, its excess over the window's drain time "
              "and the round trip = credit_ms)")
    md.append(f"- CPU (docs/planning.md, \"Shared cores\"): the N ranks share this machine's "
              f"{CORES} cores (`cpu.shared_cores` = {CORES}). SparseAllReduce: the codec CPU of "
              "an unshaped calibration run right before each shaped run (LBCC_DEBUG=TRACE "
              "medians over ranks and calls of encode and decode; the rest of the unshaped call "
              "is exchange + validation). Both ops: the host's cost per byte moved "
              "(`cpu.copy_gbytes_s`), from the unshaped dense all-reduce of the same layout: "
              "the rate at which the plan's host term equals that call (each phase then takes "
              "the longer of its busiest link and the hosts' CPU for its bytes)\n")
    md.append("## (a) bench/lbcc_perf: predicted vs measured\n")
    md.append("Ratio = predicted / measured. SparseAllReduce: median over the repetitions (each "
              "predicted from its own CPU calibration, right before it, and the probe of the first), "
              "range in brackets. *CPU-bound*: the "
              f"probe found the links delivering less than {CPU_BOUND:.0%} of the nominal goodput "
              "(the tbf shapers and the ranks wait for the cores): the nominal rate is not what "
              "the testbed gives there, the probed one is. Goal: the probed prediction within "
              "15 % on time, bytes within 1 %.\n")
    md.append("| ranks | Mbit/s | op | algorithm | nominal pred. | probed pred. | measured | "
              "ratio nominal | ratio probed | ratio probed, in-run codec CPU | probe Mbit/s | "
              "host ms | bytes pred. (rank 0) | bytes meas. | bytes ratio | "
              "slow bytes all ranks, ratio | load | CPU-bound | within goal |")
    md.append("|" + "---|" * 19)
    ok_t = ok_b = ok_nt = 0
    for n, rate, label, nom, prb, meas, prs, brow, inr in rows:
        rn = [p["seconds"] / mm for p, mm in zip(nom, meas)]
        ri = f"{med(p['seconds'] / mm for p, mm in zip(inr, meas)):.3f}" if inr else "-"
        rp = [p["seconds"] / mm for p, mm in zip(prb, meas)]
        tn, tp = med(rn), med(rp)
        br = prb[-1]["wire_recv_bytes"] / brow["wire_recv_bytes"]
        sr = prb[-1]["slow_recv_bytes_all_ranks"] / brow["slow_recv_bytes_all_ranks"]
        mbit = med(p["burst_mbit" if label == "sparse" else "mbit"] for p in prs)
        bound = mbit < CPU_BOUND * EFFICIENCY * rate
        good = abs(tp - 1) <= 0.15 and abs(br - 1) <= 0.01
        ok_t += abs(tp - 1) <= 0.15
        ok_nt += abs(tn - 1) <= 0.15
        ok_b += abs(br - 1) <= 0.01
        rng = lambda r: f" [{min(r):.2f}-{max(r):.2f}]" if len(r) > 1 else ""
        reps_here = range(len(meas)) if label == "sparse" else [0]
        lo = "/".join(loadavg(f"load_n{n}_r{rate}_{rep}.txt") for rep in reps_here)
        md.append(f"| {n} | {rate} | {label} | {prb[0]['algorithm']} | "
                  f"{med(p['seconds'] for p in nom)*1e3:.1f} ms | "
                  f"{med(p['seconds'] for p in prb)*1e3:.1f} ms | "
                  f"{med(meas)*1e3:.1f} ms | {tn:.3f}{rng(rn)} | "
                  f"{tp:.3f}{rng(rp)} | {ri} | {mbit:.0f} | {prb[0]['host_s']*1e3:.0f} | "
                  f"{prb[-1]['wire_recv_bytes']:.0f} | {brow['wire_recv_bytes']:.0f} | "
                  f"{br:.4f} | {sr:.4f} | {lo} | {'yes' if bound else 'no'} | "
                  f"{'yes' if good else 'no'} |")
    md.append(f"\nTime within 15 %: probed {ok_t} of {len(rows)}, nominal {ok_nt} of {len(rows)}; "
              f"bytes within 1 %: {ok_b} of {len(rows)}. \"probe Mbit/s\": the rate the row's "
              "probed prediction got (SparseAllReduce: the burst's, the dense ring: the ring "
              "relay's). \"host ms\": the phases in which the "
              "hosts' CPU, not a link, drains last (probed prediction). \"in-run codec CPU\" "
              "(a diagnostic, not the goal): the probed prediction with encode and decode as the "
              "shaped run itself timed them (LBCC_DEBUG=TRACE, the same load), exchange + "
              "validation from the calibration: what is left of a miss there is the model's, "
              "not the calibration's.\n")
    if not_run:
        md.append(f"Not in this run (stopped before them): {', '.join(not_run)}.\n")
    if window_rows:
        md.append("\"dense, 4 MiB window\" is the same all-reduce with "
                  "LBCC_SLOW_WINDOW_BYTES=4194304, predicted with that window (docs/planning.md, "
                  "\"Credit window\").\n")
    md.append("### Probes (the shaped links, before the calibrations and shaped runs)\n")
    md.append("| ranks | Mbit/s (tbf) | repetition | ring relay through the window: Mbit/s per "
              "down-link (rank 0, 1, ...) | mean | burst of every blob: Mbit/s per down-link | "
              "median | 256 KiB credit cycle (ms) | credit_ms |")
    md.append("|---|---|---|---|---|---|---|---|---|")
    for n, rate, rep, pr in probes:
        per = ", ".join(f"{m:.1f}" for m in pr["down_mbit"])
        per_b = ", ".join(f"{m:.1f}" for m in pr["burst_down_mbit"])
        md.append(f"| {n} | {rate} | {rep} | {per} | {pr['mbit']:.1f} | {per_b} | "
                  f"{pr['burst_mbit']:.1f} | {pr['cycle_ms']:.1f} | {pr['credit_ms']:.2f} |")
    md.append("\n### Calibration (CPU time given to the model)\n")
    md.append("| ranks | Mbit/s of the shaped run | repetition | encode (ms) | exchange+validation (ms) | decode (ms) | unshaped call (ms) | copy GB/s per core |")
    md.append("|---|---|---|---|---|---|---|---|")
    for n, rate, rep, cal in cals:
        if rep == "dense":
            md.append(f"| {n} | {rate} | dense all-reduce | | | | {cal['unshaped_ms']:.1f} | "
                      f"{cal['copy']:.3f} |")
        else:
            md.append(f"| {n} | {rate} | {rep} | {cal['encode_ms']:.2f} | {cal['exchange_ms']:.2f} | "
                      f"{cal['decode_ms']:.2f} | {cal['unshaped_ms']:.2f} | |")
if "hetero" in parts:
    md.append("\n## (b) examples/hetero_training: predicted vs measured\n")
    md.append(f"`examples/hetero_training/hetero.py --preset smoke --runs "
              f"sparseloco,hetero_k16_lossy --steps {hetero_steps} --rate R` (its own CLI; "
              "d = 128, 4 layers, context 64, batch 8 = 512 tokens per inner step, H = 10; "
              "ranks 0, 1 full replicas on a fast island, ranks 2 -> 3 a two-stage pipeline "
              "whose hosts' down-links are shaped to R; lossy mode: the boundary-table "
              "refresh, counted by the run, left out of the byte comparison), "
              "at R = 10 Gbit/s before and after the rates (the step there: the mean of the two). "
              "The plan gets the example's layout, "
              "its parameter shapes per shard (model.py), one microbatch per step with fp32 "
              "coefficients and token ids at the boundary (k = d = 128 uncompressed, k = 8 at "
              f"1/16), the four ranks on this machine's {CORES} shared cores, and as compute a "
              "full replica's inner step on a core of its own (the pipeline's stages half each): "
              "the value at which the plan's 10 Gbit/s step equals the measured one (found by "
              "bisection). Predicted step = the plan's outer step at R / H. Measured: the "
              "slowest rank's train_seconds / steps; slow-link bytes = every rank's bytes sent on "
              "slow links (bytes_by_class, the example's own counters, identity checks and "
              "evaluation excluded). Predicted bytes = steps x boundary (forward + backward) + "
              "outer steps x the SparseAllReduce's slow-link bytes of every rank.\n")
    md.append("| run | k | Mbit/s | load | step at 10 Gbit/s (before, after) | compute alone | "
              "predicted step | "
              "measured step | time ratio | predicted slow bytes | measured slow bytes | "
              "bytes ratio | sync algorithm | within goal |")
    md.append("|" + "---|" * 14)
    ok = 0
    for run, k, rate, cal, full_s, got, p, step, slow in hetero_rows:
        tr, br = step / got["step_s"], slow / got["slow_bytes"]
        good = abs(tr - 1) <= 0.15 and abs(br - 1) <= 0.01
        ok += good
        md.append(f"| {run} | {k} | {rate} | {loadavg(f'load_hetero_r{rate}.txt')} | "
                  f"{cal['step_s']*1e3:.1f} ms ({cal['range'][0]*1e3:.0f}, "
                  f"{cal['range'][1]*1e3:.0f}) | {full_s*1e3:.1f} ms | {step*1e3:.1f} ms | "
                  f"{got['step_s']*1e3:.1f} ms | {tr:.3f} | {slow:.0f} | {got['slow_bytes']:.0f} | "
                  f"{br:.4f} | {'/'.join(p['sync']['algorithm'])} | {'yes' if good else 'no'} |")
    md.append(f"\nWithin goal (time 15 %, bytes 1 %): {ok} of {len(hetero_rows)}.")
md.append(f"\nPer-run JSON, logs, probes and plan inputs were left in `{out}`.")
dest = "bench/results/plan_validation.md"
open(dest, "w").write("\n".join(md) + "\n")
print("\n".join(md))
print(f"\nwrote {dest}")
PY
