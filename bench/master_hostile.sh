#!/usr/bin/env bash
# Members' join latency at the membership service (ElasticMaster) quiet and under 1,000 hostile
# connections (issue 44 item 3, goal: at most 2x the quiet latency), one run, written to
# bench/results/master_hostile.md (date, machine, load, command). The measures and the load
# are comm/elastic/master_hostile_bench.cc's: welcome (connect + join + the master's welcome)
# and group (ElasticGroup::Join into an empty job, which returns once admitted, and its Leave),
# quiet and hostile blocks alternating in one process; everything stays on loopback
# (127.0.0.0/8).
#
#   bench/master_hostile.sh [--welcome_joins 500] [--group_joins 40] [--blocks 4]
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/flags.sh
flags_value welcome_joins 500 "welcome joins per block"
flags_value group_joins 40 "group joins per block"
flags_value blocks 4 "quiet/hostile block pairs"
flags_value results bench/results/master_hostile.md "where the summary is written"
flags_parse "$@"
command="bench/master_hostile.sh $*"
nice -n 15 bazel build //comm/elastic:master_hostile_bench >/dev/null 2>&1
bin="$(bazel info bazel-bin 2>/dev/null)/comm/elastic/master_hostile_bench"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u '+%Y-%m-%d %H:%M UTC')
t0=$(date +%s)
out=$("$bin" --welcome_joins="$FLAG_welcome_joins" --group_joins="$FLAG_group_joins" \
      --blocks="$FLAG_blocks" 2>/tmp/lbcc_master_hostile_bench.log)
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
took=$(( $(date +%s) - t0 ))
welcome_ratio=$(sed -n 's/^RATIO welcome //p' <<<"$out")
group_ratio=$(sed -n 's/^RATIO group //p' <<<"$out")
opened=$(sed -n 's/^HOSTILE_CONNECTIONS_OPENED //p' <<<"$out")
verdict() { awk -v r="$1" 'BEGIN { print (r <= 2.0 ? "met" : "missed") }'; }
{
  echo "# Membership service under hostile clients (issue 44 item 3)"
  echo
  echo "Written by \`$command\` on $started; $(hostname), $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p' | head -n1)),"
  echo "shared with other engineers' builds and tests, so single runs vary. Load average (1, 5, 15 min)"
  echo "at the start: $load_before; at the end: $load_after. The run took ${took} s."
  echo
  echo "One process: a master per measure (default limits: handshake_timeout 10 s, max_handshakes"
  echo "1024, max_connections_per_address 64), members on 127.0.0.1. Hostile load, per master: 1,000"
  echo "silent connections from 127.0.0.10-29 (50 per address; each one the master closes at its"
  echo "handshake timeout is opened again at once), a client sending 64 random bytes every 10 ms and"
  echo "one sending a join a byte every 100 ms, each reconnecting when closed. Quiet and hostile blocks"
  echo "alternate ($FLAG_blocks pairs); $opened silent hostile connections were opened in all."
  echo
  echo "- welcome: connect + join + the master's welcome, then close ($FLAG_welcome_joins per block);"
  echo "- group: ElasticGroup::Join into an empty job (connect, join, welcome, admission into the"
  echo "  first epoch; the epoch's communicator is built in the background) and its Leave"
  echo "  ($FLAG_group_joins per block)."
  echo
  echo "| measure | load | joins | failed | median (ms) | p90 (ms) | max (ms) |"
  echo "|---|---|---|---|---|---|---|"
  grep '^|' <<<"$out"
  echo
  echo "| measure | median hostile / median quiet | goal <= 2x |"
  echo "|---|---|---|"
  echo "| welcome | $welcome_ratio | $(verdict "$welcome_ratio") |"
  echo "| group | $group_ratio | $(verdict "$group_ratio") |"
} >"$FLAG_results"
echo "master_hostile: wrote $FLAG_results"
cat "$FLAG_results"
