#!/usr/bin/env bash
# Elastic membership figures, one run (comm/elastic.h, docs/elastic.md), 4 member processes over
# UCX on 127.0.0.1 with the master in the test process:
#   1. churn: --events consecutive events (a random member killed -9, every third a SIGSTOP'd
#      one evicted, every sixth two killed at once; each restarted and rejoining); time to
#      recover (event -> the first step committed in a newer epoch) against
#      LBCC_PEER_TIMEOUT_MS + 1 s, a newcomer's join (connect -> admitted) and join -> first
#      committed step;
#   2. steady state: the same SparseAllReduce over the epoch's plain communicator and through
#      the elastic group, alternating --steps times (medians per member, ratio), and a member's
#      next step after another member's clean Leave() (timed once the leave is announced, as
#      during a trainer's inner steps) against one elastic step.
#
#   bench/elastic.sh [--events 100] [--steps 30] [--results bench/results/elastic.md]
#
# Builds //comm:elastic_churn_test. Prints the summary and writes it with the date, machine and
# command to --results.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/flags.sh
flags_value events 100 "churn events"
flags_value steps 30 "alternating plain / elastic steps of the steady-state comparison"
flags_value results bench/results/elastic.md "where the summary is written (empty: nowhere)"
command_line="bench/elastic.sh $*"
flags_parse "$@"
((${#FLAGS_ARGS[@]} == 0)) || { echo "elastic: unexpected argument ${FLAGS_ARGS[0]}" >&2; exit 2; }

bazel build --jobs=2 //comm:elastic_churn_test >/dev/null
bin=bazel-bin/comm/elastic_churn_test
stats=$(mktemp)
trap 'rm -f "$stats"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
ELASTIC_CHURN_EVENTS=$FLAG_events ELASTIC_CHURN_STATS=$stats \
  "$bin" --gtest_filter='*NeverBreakTheJob*' >/tmp/lbcc_elastic_churn.log 2>&1 ||
  { echo "elastic: the churn run failed (see /tmp/lbcc_elastic_churn.log)" >&2; exit 1; }
ELASTIC_BENCH_STEPS=$FLAG_steps ELASTIC_CHURN_STATS=$stats \
  "$bin" --gtest_filter='*SteadyState*' >/tmp/lbcc_elastic_bench.log 2>&1 ||
  { echo "elastic: the steady-state run failed (see /tmp/lbcc_elastic_bench.log)" >&2; exit 1; }
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

summary=$(python3 - "$stats" <<'PY'
import statistics, sys
lines = [l.split() for l in open(sys.argv[1]) if l.strip()]
kv = {l[0]: l[1:] for l in lines if l[0] != "bench"}
bench = [list(map(float, l[1:])) for l in lines if l[0] == "bench"]
f = lambda k: [float(x) for x in kv.get(k, [])]
rec, join, first = f("recover_ms"), f("join_ms"), f("first_commit_ms")
ev = kv["events"]
peer = 5000  # elastic_churn_test's LBCC_PEER_TIMEOUT_MS
def q(v):
    if not v:
        return "-"
    v = sorted(v)
    return f"median {statistics.median(v):.0f}, p90 {v[int(0.9 * (len(v) - 1))]:.0f}, max {v[-1]:.0f}"
print(f"| churn events | {ev[0]} ({ev[2]} SIGSTOP, {ev[4]} two at once) |")
print(f"| steps committed / epochs | {kv['steps'][0]} / {kv['steps'][2]} |")
print(f"| recover ms (event -> next commit in a newer epoch) | {q(rec)} |")
# Event e is a SIGSTOP when e % 6 == 2 (elastic_churn_test), else one or two kills.
kills = [r for e, r in enumerate(rec) if e % 6 != 2]
stops = [r for e, r in enumerate(rec) if e % 6 == 2]
within = sum(1 for r in kills if r <= peer + 1000)
print(f"| recover ms after a kill | {q(kills)} |")
print(f"| recover ms after a SIGSTOP (detected after LBCC_PEER_TIMEOUT_MS of silence) | {q(stops)} |")
print(f"| kill recoveries within LBCC_PEER_TIMEOUT_MS + 1 s ({peer + 1000} ms) | {within} of {len(kills)} |")
print(f"| newcomer join ms (connect -> admitted) | {q(join)} |")
print(f"| newcomer first committed step ms (from start) | {q(first)} |")
plain = [b[0] for b in bench]
ela = [b[1] for b in bench]
after = [b[2] for b in bench if b[2] >= 0]
if plain:
    print(f"| steady state: plain SparseAllReduce ms (median per member) | {', '.join(f'{x:.1f}' for x in plain)} |")
    print(f"| steady state: elastic ms (median per member) | {', '.join(f'{x:.1f}' for x in ela)} |")
    print(f"| ratio elastic / plain (median over members) | {statistics.median(e / p for e, p in zip(ela, plain)):.2f} |")
    if after:
        print(f"| step after a clean Leave() ms / one elastic step | {statistics.median(after):.0f} / {statistics.median(ela):.0f} = {statistics.median(after) / statistics.median(ela):.2f}x |")
PY
)
report=$(cat <<EOF2
# Elastic membership (bench/elastic.sh)

- Date: $(date -u '+%Y-%m-%d %H:%M UTC')
- Machine: $(nproc) cores, $(uname -srm), load average $load_before before / $load_after after
- Command: \`$command_line\`
- Layout: 4 member processes over UCX on 127.0.0.1, 65536-element tensor, TopK-EF (top_k 64),
  LBCC_PEER_TIMEOUT_MS 5000, 20 ms of "inner steps" between exchanges in the churn run
- Shared-state bytes per transfer: the 256 KiB parameter vector plus a 32-byte header (same host:
  fast link, sent uncompressed); verified by XXH3 against every member's

| figure | value |
|---|---|
$summary
EOF2
)
echo "$report"
[[ -z $FLAG_results ]] || { echo "$report" >"$FLAG_results"; echo "wrote $FLAG_results"; }
