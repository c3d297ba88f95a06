#!/usr/bin/env bash
# torch.distributed backend "lbcc" vs "gloo": the same script (bench/torch_backend_perf.py),
# backend= switched, 4 ranks as processes, runs alternating --pairs times (lbcc first):
#   1. testbed (tools/testbed): every down-link shaped to --rate, one rank per emulated host:
#      dense all-reduce of one float32 tensor of --bytes, time (goal: lbcc / gloo <= 1.0).
#      The emulated hosts share one host name, so LBCC's default topology makes one fast island
#      of them; "lbcc, slow links" runs again with every rank its own island (LBCC_TOPO_FILE
#      {"nranks": 4}), the slow-link scheduler's path, which real hosts behind such links take;
#   2. loopback (127.0.0.1, no shaping, no namespaces): the same all-reduce, throughput
#      (goal: lbcc / gloo >= 0.9), and the per-call time of an 8-byte all-reduce.
#
#   bench/torch_backend_perf.sh [--rate 100mbit] [--bytes 16M] [--iters 3] [--pairs 2]
#                               [--out DIR] [--results bench/results/torch_backend.md]
#
# Needs root for 1. (network namespaces; skipped with the reason otherwise) and Debian's
# python3-torch; builds //python:lbcc/_lbcc.so and //python:lbcc/_c10d_lbcc.so and installs them
# into --out. Writes the summary with the date, machine, command and the load average at the
# start and the end to --results; refuses to (exit 3, the reason printed, --results left as it
# was) when Gloo, the baseline, is off its expected range (bench/baselines.py: its ring against
# the wire limit on the testbed, its bandwidth on loopback) or an LBCC run beats the wire limit.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/flags.sh
flags_value rate 100mbit "rate of each shaped down-link (tc syntax)"
flags_value bytes 16M "all-reduce size (K, M suffixes)"
flags_value iters 3 "timed iterations per run"
flags_value pairs 2 "alternating lbcc/gloo runs per setting"
flags_value small_calls 200 "8-byte all-reduces per per-call sample (loopback)"
flags_value out /tmp/lbcc_torch_backend_perf "folder for the installed package, JSON and logs"
flags_value results bench/results/torch_backend.md "where the summary is written (empty: nowhere)"
flags_bool reuse "summarise the JSON already in --out (same --pairs) instead of running"
command_line="bench/torch_backend_perf.sh $*"
flags_parse "$@"
((${#FLAGS_ARGS[@]} == 0)) || { echo "torch_backend_perf: unexpected argument ${FLAGS_ARGS[0]}" >&2; exit 2; }
rate=$FLAG_rate iters=$FLAG_iters pairs=$FLAG_pairs out=$FLAG_out results=$FLAG_results
small_calls=$FLAG_small_calls reuse=$FLAG_reuse
bytes=$(python3 -c "import sys; s = sys.argv[1].upper(); m = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}
print(int(float(s[:-1]) * m[s[-1]]) if s[-1] in m else int(s))" "$FLAG_bytes")
python="${LBCC_PYTHON:-/usr/bin/python3}"
T=tools/testbed/testbed

if ((!reuse)); then
bazel build //python:lbcc/_lbcc.so //python:lbcc/_c10d_lbcc.so >/dev/null 2>&1 ||
  bazel build //python:lbcc/_lbcc.so //python:lbcc/_c10d_lbcc.so
mkdir -p "$out"
rm -rf "$out/site"
python/install_files.sh --c10d bazel-bin/python/lbcc/_c10d_lbcc.so python/lbcc \
  bazel-bin/python/lbcc/_lbcc.so "$out/site" >/dev/null
worker=$PWD/bench/torch_backend_perf.py
fi
export PYTHONPATH="$out/site" OMP_NUM_THREADS=1
# The command that measured (a --reuse run summarises it).
if ((reuse)); then
  command_line=$(cat "$out/command.txt")
else
  echo "$command_line" > "$out/command.txt"
  start_s=$SECONDS
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg) at the start (1, 5, 15 min), tree $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- python comm transport || echo ' + uncommitted changes')" > "$out/when.txt"
fi

# run LABEL BACKEND WHERE(testbed|loopback) SMALL_CALLS: 4 ranks; rank 0 writes LABEL.json.
run() {
  local label=$1 backend=$2 where=$3 calls=$4
  local port=$((29500 + RANDOM % 1000)) pids=() rank master
  master=127.0.0.1
  [[ $where == testbed ]] && master=$($T addr --name "$name" 0)
  for rank in 0 1 2 3; do
    local prefix=() addr=127.0.0.1
    if [[ $where == testbed ]]; then
      addr=$($T addr --name "$name" "$rank")
      prefix=($T exec --name "$name" "$rank" -- env UCX_TLS=tcp UCX_NET_DEVICES=eth0
              UCX_MEM_EVENTS=no GLOO_SOCKET_IFNAME=eth0)
    else
      prefix=(env GLOO_SOCKET_IFNAME=lo)
    fi
    "${prefix[@]}" env ${RUN_ENV:-} PYTHONPATH="$PYTHONPATH" OMP_NUM_THREADS=1 LBCC_LISTEN_ADDR="$addr" \
      RANK=$rank WORLD_SIZE=4 LOCAL_RANK=$rank MASTER_ADDR="$master" MASTER_PORT=$port \
      "$python" "$worker" --backend "$backend" --bytes "$bytes" --iters "$iters" \
      --small-calls "$calls" --json "$out/$label.json" > "$out/$label.rank$rank.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  if ((rc)); then
    echo "torch_backend_perf: $label failed; logs in $out/$label.rank*.log" >&2
    tail -5 "$out/$label".rank*.log >&2
    exit 1
  fi
  echo "  $label done"
}

testbed=yes
if ((reuse)); then
  [[ -e $out/testbed_gloo_0.json ]] || testbed="no: not in the reused --out"
elif ! why=$($T check); then
  testbed="no: $why"
  echo "torch_backend_perf: testbed skipped: $why" >&2
fi
name="tb$$"
if [[ $testbed == yes ]] && ((!reuse)); then
  trap '$T down --name "$name" >/dev/null 2>&1 || true' EXIT
  $T down --stale >/dev/null 2>&1 || true
  echo "== testbed: 4 hosts, every down-link $rate"
  $T up --name "$name" --hosts 4 --rate "$rate" --slow 0,1,2,3 --owner-pid $$ >/dev/null
  echo '{"nranks": 4}' > "$out/own_islands.json"
  for ((p = 0; p < pairs; ++p)); do
    run "testbed_lbcc_$p" lbcc testbed 0
    RUN_ENV="LBCC_TOPO_FILE=$out/own_islands.json" run "testbed_lbcc_slow_$p" lbcc testbed 0
    run "testbed_gloo_$p" gloo testbed 0
  done
  $T down --name "$name" >/dev/null
fi
((reuse)) || echo "== loopback: 4 processes on 127.0.0.1, no shaping"
for ((p = 0; p < pairs && !reuse; ++p)); do
  run "loopback_lbcc_$p" lbcc loopback "$small_calls"
  run "loopback_gloo_$p" gloo loopback "$small_calls"
done

if ((!reuse)); then
  echo "load average $(cut -d' ' -f1-3 /proc/loadavg) at the end, $((SECONDS - start_s)) s of runs" > "$out/end.txt"
fi

summary=$("$python" - "$out" "$pairs" "$rate" "$testbed" "$results" <<'PY'
import json, re, statistics, sys
sys.path.insert(0, "bench")
import baselines
out, pairs, rate, testbed = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
check = baselines.Checker(sys.argv[5])
load = lambda k: json.load(open(f"{out}/{k}.json"))
med = statistics.median
lines = []
def setting(where):
    lb = [load(f"{where}_lbcc_{p}") for p in range(pairs)]
    gl = [load(f"{where}_gloo_{p}") for p in range(pairs)]
    return lb, gl
first = None
if testbed == "yes":
    lb, gl = setting("testbed")
    first = lb[0]
    t_l, t_g = med([r["seconds"] for r in lb]), med([r["seconds"] for r in gl])
    lines.append(f"testbed, every down-link {rate}, 4 ranks, all-reduce of {lb[0]['bytes']} bytes "
                 f"(float32), median of {pairs} runs x {len(lb[0]['samples'])} iterations:")
    lines.append(f"  lbcc {t_l:.3f} s  gloo {t_g:.3f} s  lbcc/gloo time = {t_l / t_g:.2f}x "
                 "(goal <= 1.0)")
    lines.append("  per run (s): lbcc " + " ".join(f"{r['seconds']:.3f}" for r in lb) +
                 " | gloo " + " ".join(f"{r['seconds']:.3f}" for r in gl))
    slow = [load(f"testbed_lbcc_slow_{p}") for p in range(pairs)]
    t_s = med([r["seconds"] for r in slow])
    lines.append(f"  lbcc, slow links (every rank its own island): {t_s:.3f} s, lbcc/gloo time = "
                 f"{t_s / t_g:.2f}x; per run (s): " + " ".join(f"{r['seconds']:.3f}" for r in slow))
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    link = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8 if m else None
    if link:
        wire = 2 * 3 / 4 * lb[0]["bytes"] / link
        for runs, baseline, what in ((gl, "gloo_wire_limit_time", "gloo"),
                                     (lb, "wire_limit_time", "lbcc"),
                                     (slow, "wire_limit_time", "lbcc slow links")):
            for p, r in enumerate(runs):
                check(baseline, r["seconds"], reference=wire, where=f"testbed {what} run {p}")
        lines.append(f"  wire limit of the ring (2 (n-1)/n x bytes per down-link at {rate}): "
                     f"{wire:.3f} s; lbcc {t_l / wire:.2f}x, slow links {t_s / wire:.2f}x, gloo "
                     f"{t_g / wire:.2f}x of it")
else:
    lines.append(f"testbed: not run ({testbed})")
lb, gl = setting("loopback")
first = first or lb[0]
if lb[0]["bytes"] >= 16 << 20:  # the size the range is for
    for p, r in enumerate(gl):
        check("gloo_loopback_bandwidth", r["bytes_per_second"] / 1e6, where=f"loopback gloo run {p}")
check.refuse_if_off()
b_l, b_g = med([r["bytes_per_second"] for r in lb]), med([r["bytes_per_second"] for r in gl])
s_l, s_g = med([r["small_seconds"] for r in lb]), med([r["small_seconds"] for r in gl])
lines.append(f"loopback (127.0.0.1, unshaped), 4 ranks, all-reduce of {lb[0]['bytes']} bytes:")
lines.append(f"  lbcc {b_l / 1e6:.1f} MB/s  gloo {b_g / 1e6:.1f} MB/s  lbcc/gloo throughput = "
             f"{b_l / b_g:.2f}x (goal >= 0.9)")
lines.append("  per run (MB/s): lbcc " + " ".join(f"{r['bytes_per_second'] / 1e6:.1f}" for r in lb)
             + " | gloo " + " ".join(f"{r['bytes_per_second'] / 1e6:.1f}" for r in gl))
lines.append(f"8-byte all-reduce per call (loopback, median of runs x reps): lbcc "
             f"{s_l * 1e6:.0f} us  gloo {s_g * 1e6:.0f} us  lbcc/gloo = {s_l / s_g:.2f}x")
print("\n".join(lines))
PY
)
echo
echo "$summary"
if [[ -n $results ]]; then
  {
    echo "# torch.distributed backend lbcc vs gloo (bench/torch_backend_perf.sh)"
    echo
    echo "- measured: $(cat "$out/when.txt" 2>/dev/null || echo unknown)"
    echo "- then: $(cat "$out/end.txt" 2>/dev/null || echo unknown)"
    echo "- machine: $(uname -srm), $(getconf _NPROCESSORS_ONLN) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), shared with other jobs"
    echo "- command: \`$command_line\`"
    echo
    echo '```'
    echo "$summary"
    echo '```'
  } > "$results"
  echo "written to $results"
fi
