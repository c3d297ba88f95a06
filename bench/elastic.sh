#!/usr/bin/env bash
# Elastic membership figures, one run (comm/elastic/elastic.h, docs/elastic.md), 4 member
# processes over UCX on 127.0.0.1 with the master in the test process:
#   1. churn: --events consecutive events (a random member killed -9, every third a SIGSTOP'd
#      one evicted, every sixth two killed at once; each restarted and rejoining); time to
#      recover (event -> the first step committed in a newer epoch) against
#      LBCC_PEER_TIMEOUT_MS + 1 s (the ratio of the median and the worst kill recovery to it),
#      a newcomer's join (connect -> admitted) and join -> first committed step;
#   2. steady state on loopback: the same SparseAllReduce over the epoch's plain communicator
#      and through the elastic group, alternating --steps times (medians per member, ratio);
#      then a clean Leave(): the highest-seeded member calls Leave() right after its own last
#      step returns (the others may still be inside that exchange), and each survivor waits
#      until it sees the new epoch announced (as during a trainer's inner steps) and times its
#      next whole step from that moment: Boundary() (adopting the epoch: its communicator
#      derived from the previous one's connections) + SparseAllReduce over the survivors,
#      retries included; the goal's figure is the median of that over the survivors against
#      the median elastic step above (the survivors' retries and epochs made anew are listed:
#      0 when the leave is clean);
#   3. steady state in bench/comm_testbed_perf.sh's layout (the goal's figure): 4 members, one
#      per emulated host (tools/testbed), every down-link shaped to --rate, lbcc-master on host
#      0, a --elements fp32 tensor (16 MiB), top_k 64; --rounds rounds of --block plain steps
#      (the epoch's Communicator::SparseAllReduce) and --block elastic steps (Boundary() +
#      SparseAllReduce), the blocks' order alternating by round; wall and CPU time per step
#      (medians per member, ratios), the elastic steps' waits for the master's decision, load.
#      Skipped (with a note) where namespaces cannot be made.
#
#   bench/elastic.sh [--events 100] [--steps 30] [--rounds 10] [--block 3] [--rate 100mbit]
#                    [--elements 4194304] [--results bench/results/elastic.md]
#
# Builds //comm/elastic:elastic_churn_test and //tools:lbcc-master. Prints the summary and writes
# it with the date, machine and command to --results. --events 0: no churn run.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/flags.sh
flags_value events 100 "churn events"
flags_value steps 30 "alternating plain / elastic steps of the steady-state comparison"
flags_value rounds 10 "rounds of the testbed steady-state comparison"
flags_value block 3 "plain steps, then as many elastic steps (or the other way round), per round"
flags_value rate 100mbit "rate of every down-link in the testbed run (tc syntax)"
flags_value elements 4194304 "fp32 elements of the testbed run's tensor"
flags_value results bench/results/elastic.md "where the summary is written (empty: nowhere)"
command_line="bench/elastic.sh $*"
flags_parse "$@"
((${#FLAGS_ARGS[@]} == 0)) || { echo "elastic: unexpected argument ${FLAGS_ARGS[0]}" >&2; exit 2; }

bazel build --jobs=2 //comm/elastic:elastic_churn_test //tools:lbcc-master >/dev/null
# A private copy: the members a run restarts load the libraries it started with, whatever is
# rebuilt meanwhile.
run_dir=$(mktemp -d)
stats=$run_dir/stats
T=tools/testbed/testbed
tb_name="el$$"
trap '$T down --name "$tb_name" >/dev/null 2>&1 || true; rm -rf "$run_dir"' EXIT
mkdir -p "$run_dir/comm/elastic" "$run_dir/tools"
cp -rL bazel-bin/_solib_k8 "$run_dir/"
cp bazel-bin/comm/elastic/elastic_churn_test "$run_dir/comm/elastic/"
cp bazel-bin/tools/lbcc-master "$run_dir/tools/"
bin=$run_dir/comm/elastic/elastic_churn_test
: >"$stats"
start_s=$SECONDS
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
if ((FLAG_events > 0)); then
  ELASTIC_CHURN_EVENTS=$FLAG_events ELASTIC_CHURN_STATS=$stats \
    "$bin" --gtest_filter='*NeverBreakTheJob*' >/tmp/lbcc_elastic_churn.log 2>&1 ||
    { echo "elastic: the churn run failed (see /tmp/lbcc_elastic_churn.log)" >&2; exit 1; }
fi
ELASTIC_BENCH_STEPS=$FLAG_steps ELASTIC_CHURN_STATS=$stats.loopback \
  "$bin" --gtest_filter='*SteadyState*' >/tmp/lbcc_elastic_bench.log 2>&1 ||
  { echo "elastic: the steady-state run failed (see /tmp/lbcc_elastic_bench.log)" >&2; exit 1; }
cat "$stats.loopback" >>"$stats"

# 3. The testbed layout: lbcc-master on host 0, one member per host.
tb_dir=$run_dir/testbed
mkdir -p "$tb_dir"
tb_note=""
if why=$($T check); then
  $T down --stale >/dev/null 2>&1 || true
  $T up --name "$tb_name" --hosts 4 --rate "$FLAG_rate" --slow 0,1,2,3 --owner-pid $$ >/dev/null
  echo '{"nranks": 4}' >"$tb_dir/topology.json"
  a0=$($T addr --name "$tb_name" 0)
  port=$((29400 + RANDOM % 500))
  $T exec --name "$tb_name" 0 -- env LBCC_PEER_TIMEOUT_MS=5000 "$run_dir/tools/lbcc-master" \
    --job_id bench --listen "$a0:$port" --bootstrap_host "$a0" --min_members 4 \
    >"$tb_dir/master.log" 2>&1 &
  master_pid=$!
  pids=()
  for r in 0 1 2 3; do
    $T exec --name "$tb_name" "$r" -- env UCX_TLS=tcp UCX_NET_DEVICES=eth0 UCX_MEM_EVENTS=no \
      LBCC_LISTEN_ADDR="$($T addr --name "$tb_name" "$r")" LBCC_TOPO_FILE="$tb_dir/topology.json" \
      LBCC_PEER_TIMEOUT_MS=5000 ELASTIC_ROLE=bench ELASTIC_MASTER="$a0:$port" ELASTIC_SEED="$r" \
      ELASTIC_NAME="m$r" ELASTIC_BENCH_ELEMENTS="$FLAG_elements" ELASTIC_BENCH_ROUNDS="$FLAG_rounds" \
      ELASTIC_BENCH_STEPS="$FLAG_block" "$bin" >"$tb_dir/member$r.log" 2>&1 &
    pids+=($!)
  done
  rc=0
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  kill "$master_pid" 2>/dev/null || true
  wait "$master_pid" 2>/dev/null || true
  $T down --name "$tb_name" >/dev/null
  if ((rc)); then
    cp "$tb_dir"/*.log /tmp/ 2>/dev/null || true
    echo "elastic: the testbed run failed (member logs in /tmp/member*.log)" >&2
    tail -3 "$tb_dir"/member*.log >&2
    exit 1
  fi
else
  tb_note="testbed run skipped: $why"
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
elapsed_s=$((SECONDS - start_s))

summary=$(python3 - "$stats" "$tb_dir" "$tb_note" <<'PY'
import glob, os, statistics, sys
lines = [l.split() for l in open(sys.argv[1]) if l.strip()]
kv = {l[0]: l[1:] for l in lines if l[0] != "bench"}
bench = [list(map(float, l[1:])) for l in lines if l[0] == "bench"]
f = lambda k: [float(x) for x in kv.get(k, [])]
rec, join, first = f("recover_ms"), f("join_ms"), f("first_commit_ms")
ev = kv.get("events")
peer = 5000  # elastic_churn_test's LBCC_PEER_TIMEOUT_MS
def q(v):
    if not v:
        return "-"
    v = sorted(v)
    return f"median {statistics.median(v):.0f}, p90 {v[int(0.9 * (len(v) - 1))]:.0f}, max {v[-1]:.0f}"
if ev:
    print(f"| churn events | {ev[0]} ({ev[2]} SIGSTOP, {ev[4]} two at once) |")
    print(f"| steps committed / epochs | {kv['steps'][0]} / {kv['steps'][2]} |")
if ev:
    print(f"| recover ms (event -> next commit in a newer epoch) | {q(rec)} |")
    # Event e is a SIGSTOP when e % 6 == 2 (elastic_churn_test), else one or two kills.
    kills = [r for e, r in enumerate(rec) if e % 6 != 2]
    stops = [r for e, r in enumerate(rec) if e % 6 == 2]
    within = sum(1 for r in kills if r <= peer + 1000)
    print(f"| recover ms after a kill | {q(kills)} |")
    print(f"| recover ms after a SIGSTOP (detected after LBCC_PEER_TIMEOUT_MS of silence) | {q(stops)} |")
    print(f"| kill recoveries within LBCC_PEER_TIMEOUT_MS + 1 s ({peer + 1000} ms) | {within} of {len(kills)} |")
    if kills:
        print(f"| **kill recovery / (LBCC_PEER_TIMEOUT_MS + 1 s): median, worst (goal <= 1)** | **{statistics.median(kills) / (peer + 1000):.3f}, {max(kills) / (peer + 1000):.3f}** |")
    print(f"| newcomer join ms (connect -> admitted) | {q(join)} |")
    print(f"| newcomer first committed step ms (from start) | {q(first)} |")
plain = [b[0] for b in bench]
ela = [b[1] for b in bench]
after = [b[2] for b in bench if b[2] >= 0]
survivors = [b for b in bench if b[2] >= 0]
if plain:
    print(f"| loopback steady state (65536 elements): plain SparseAllReduce ms (median per member) | {', '.join(f'{x:.1f}' for x in plain)} |")
    print(f"| loopback steady state: elastic ms (median per member) | {', '.join(f'{x:.1f}' for x in ela)} |")
    print(f"| loopback ratio elastic / plain (median over members) | {statistics.median(e / p for e, p in zip(ela, plain)):.2f} |")
    if after:
        print(f"| **survivors' step after a clean Leave() ms / one elastic step (medians; goal < 2x)** | **{statistics.median(after):.1f} / {statistics.median(ela):.1f} = {statistics.median(after) / statistics.median(ela):.2f}x** |")
        print(f"| step after the leave, per survivor: ms (of which Boundary(), adopting the new epoch) | {', '.join(f'{b[2]:.1f} ({b[3]:.1f})' for b in survivors)} |")
        print(f"| survivors' retries / epochs made anew / epochs derived (the leave's) | {sum(int(b[4]) for b in survivors)} / {sum(int(b[5]) for b in survivors)} / {sum(int(b[6]) for b in survivors)} |")
tb_dir, tb_note = sys.argv[2], sys.argv[3]
if tb_note:
    print(f"| testbed steady state | {tb_note} |")
else:
    wall = {"plain": [], "elastic": []}
    cpu = {"plain": [], "elastic": []}
    tot = {"plain": [], "elastic": []}
    waits, loads, retries = [], [], 0
    for f in sorted(glob.glob(os.path.join(tb_dir, "member*.log"))):
        rows = [l.split() for l in open(f)]
        for v in wall:
            steps = [r for r in rows if r[:2] == ["STEP", v]]
            wall[v].append(statistics.median(float(r[3]) for r in steps))
            cpu[v].append(statistics.median(float(r[4]) for r in steps))
            tot[v].append(sum(float(r[3]) for r in steps))
        waits += [(float(r[1]), int(r[2])) for r in rows if r[0] == "WAIT"]
        retries += sum(int(r[1]) for r in rows if r[0] == "RETRIES")
        loads += [r[2] for r in rows if r[0] == "LOAD"]
    ratio = lambda d: statistics.median(e / p for e, p in zip(d["elastic"], d["plain"]))
    fmt = lambda v: ", ".join(f"{x:.1f}" for x in v)
    print(f"| testbed steady state: plain SparseAllReduce wall ms (median per member) | {fmt(wall['plain'])} |")
    print(f"| testbed steady state: elastic step wall ms (median per member) | {fmt(wall['elastic'])} |")
    print(f"| **testbed ratio elastic / plain, wall (median over members; goal <= 1.05)** | **{ratio(wall):.3f}** |")
    print(f"| testbed ratio elastic / plain, total wall time of all steps | {ratio(tot):.3f} |")
    print(f"| testbed CPU ms per step, plain / elastic (median per member) | {fmt(cpu['plain'])} / {fmt(cpu['elastic'])} = {ratio(cpu):.3f} |")
    print(f"| testbed elastic steps that waited for the master's decision (ms in all) | {sum(w[1] for w in waits)} ({sum(w[0] for w in waits):.1f} ms); retries {retries} |")
    print(f"| testbed load average (1 min) at each round's start | {' '.join(loads)} |")
PY
)
report=$(cat <<EOF2
# Elastic membership (bench/elastic.sh)

- Date: $(date -u '+%Y-%m-%d %H:%M UTC')
- Machine: $(nproc) cores, $(uname -srm), load average $load_before before / $load_after after
- Command: \`$command_line\` ($elapsed_s s)
- Layout: 4 member processes over UCX on 127.0.0.1, 65536-element tensor, TopK-EF (top_k 64),
  LBCC_PEER_TIMEOUT_MS 5000, 20 ms of "inner steps" between exchanges in the churn run
- Shared-state bytes per transfer: the 256 KiB parameter vector plus a 32-byte header (same host:
  fast link, sent uncompressed); verified by XXH3 against every member's
- Testbed steady state: 4 members, one per emulated host, every down-link $FLAG_rate, lbcc-master on
  host 0, $FLAG_elements fp32 elements, top_k 64; $FLAG_rounds rounds of $FLAG_block plain and $FLAG_block
  elastic steps, the order alternating by round, back to back (each step's pseudo-gradient drawn
  untimed before it)

| figure | value |
|---|---|
$summary
EOF2
)
echo "$report"
[[ -z $FLAG_results ]] || { echo "$report" >"$FLAG_results"; echo "wrote $FLAG_results"; }
