#!/usr/bin/env bash
# Outcome trials (issue 19, item 5): 4 ranks of tests/outcome_trial over UCX run SparseAllReduce
# steps; at a random moment one random rank is killed (kill -9), frozen (SIGSTOP, resumed once
# the others are done) or cut off (tools/testbed cut: its link vanishes, no reset). Each rank
# prints one line per step; a trial is a disagreement when the ranks that lived on do not all
# end with the same last committed step (or one left a state or output half done).
#
#   tests/outcome_trials.sh --bin bazel-bin/tests/outcome_trial [--kills 300] [--stops 20]
#       [--cuts 15] [--seed 1] [--keep DIR] [--results bench/results/outcome_trials.md --label L]
#   tests/outcome_trials.sh --from-log LOG --results FILE --label L   (a finished run's log)
#
# Prints one line per trial and a summary, and exits 1 when the ranks that stayed connected
# disagreed, a rank left a half-done step, or a rank hung:
#   SUMMARY kind=kill trials=300 disagreements=0 connected_disagreements=0 broken=0 hangs=0
#       survivor_errors=900 blames_a_live_rank=0
# "blames_a_live_rank" counts survivors' errors whose first named rank (after "on rank R: ") is
# not the victim; BLAMES_LIVE lists them (trial:rank) when there are any.
# "disagreements" counts every rank that lived on (a stopped rank once resumed, a cut-off rank);
# "connected_disagreements" only those that were neither killed, stopped nor cut off.
# --results appends the summary, with date, host and command, to a Markdown file.
# Link cuts need root and network namespaces (tools/testbed/testbed check); without them they
# are skipped with the reason. LBCC_TIMEOUT_S defaults to 3 here (a lost rank shows up fast).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
testbed="$here/../tools/testbed/testbed"
command_line="tests/outcome_trials.sh $*"
FLAGS_SCRIPT="$here/outcome_trials.sh"
source "$here/../tools/flags.sh"
flags_value bin "" "outcome_trial binary (empty: build //tests:outcome_trial)"
flags_value kills 300 "trials with one rank killed (-9)"
flags_value stops 20 "trials with one rank stopped (SIGSTOP)"
flags_value cuts 15 "trials with one rank cut off (tools/testbed cut; root)"
flags_value seed 1 "random seed"
flags_value keep "" "folder to keep the trials' logs in"
flags_value results "" "results file to append the summary to"
flags_value label "" "label of this run in the results file"
flags_value from_log "" "summarise an earlier run's log instead of running"
flags_parse "$@"
((${#FLAGS_ARGS[@]} == 0)) || { echo "outcome_trials: unexpected argument ${FLAGS_ARGS[0]}" >&2; exit 2; }
bin=$FLAG_bin kills=$FLAG_kills stops=$FLAG_stops cuts=$FLAG_cuts seed=$FLAG_seed keep=$FLAG_keep
results=$FLAG_results label=$FLAG_label from_log=$FLAG_from_log
# Appends the SUMMARY lines of $1 to the results file.
write_results() {
  [[ -n "$results" ]] || return 0
  {
    [[ -s "$results" ]] || printf '# Outcome trials (tests/outcome_trials.sh)\n\nEach row: 4 ranks of tests/outcome_trial over UCX; one random rank killed (-9), stopped (SIGSTOP,\nresumed after the others exit) or cut off (tools/testbed cut) at a random moment. LBCC_TIMEOUT_S=%s.\n' "${LBCC_TIMEOUT_S:-3}"
    echo
    echo "## ${label:-run}"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), host $(uname -n), $(nproc) cores (shared); command: \`$command_line\`"
    echo
    grep '^SUMMARY\|^SKIP\|^BLAMES_LIVE\|^LOAD' "$1" | sed 's/^/    /'
  } >>"$results"
}
if [[ -n "$from_log" ]]; then
  command_line="$(grep -m1 '^# command: ' "$from_log" | cut -c12-)"
  [[ -n "$command_line" ]] || command_line="(see $from_log)"
  write_results "$from_log"
  exit 0
fi
[[ -x "$bin" ]] || { echo "outcome_trials: --bin must name the outcome_trial binary" >&2; exit 2; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
export LBCC_TIMEOUT_S=${LBCC_TIMEOUT_S:-3}
export UCX_MEM_EVENTS=no
RANDOM=$seed
work=$(mktemp -d)
tb_name="ot$$"
cleanup() {
  [[ -n "${pids:-}" ]] && kill -9 $pids 2>/dev/null
  "$testbed" down --name "$tb_name" >/dev/null 2>&1 || true
  if [[ -n "$keep" ]]; then mkdir -p "$keep" && cp -r "$work"/. "$keep"/; fi
  rm -rf "$work"
}
trap cleanup EXIT

# Waits up to $2 seconds for the processes in $1 to exit; prints those still alive.
wait_for() {
  local left=$(( $2 * 10 )) alive
  while :; do
    alive=""
    for p in $1; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
    [[ -z "$alive" || $left -le 0 ]] && break
    sleep 0.1
    left=$((left - 1))
  done
  echo $alive
}

# The last committed step of a rank's output ("-1" when it left something half done, "none"
# when it never started).
last_commit() {
  local f=$1
  grep -q "BROKEN" "$f" && { echo -1; return; }
  grep -q "^READY" "$f" || { echo none; return; }
  awk '$1 == "STEP" && $3 == "COMMIT" {c = $2} END {print c + 0}' "$f"
}

# Starts 4 ranks; $1: "local" or "testbed". Sets pids and dir.
start_ranks() {
  local mode=$1 port=$((20000 + RANDOM % 20000)) addr="127.0.0.1"
  dir="$work/trial$trial"
  mkdir -p "$dir"
  pids=""
  for r in 0 1 2 3; do
    if [[ $mode == local ]]; then
      RANK=$r WORLD_SIZE=4 LBCC_TRANSPORT=ucx LBCC_BOOTSTRAP_ADDR="$addr:$port" \
        "$bin" >"$dir/r$r.out" 2>"$dir/r$r.err" &
    else
      "$testbed" exec --name "$tb_name" "$r" -- env RANK=$r WORLD_SIZE=4 LBCC_TRANSPORT=ucx \
        LBCC_BOOTSTRAP_ADDR="10.77.0.1:$port" LBCC_LISTEN_ADDR="10.77.0.$((r + 1))" \
        UCX_TLS=tcp UCX_NET_DEVICES=eth0 LBCC_TIMEOUT_S="$LBCC_TIMEOUT_S" UCX_MEM_EVENTS=no \
        "$bin" >"$dir/r$r.out" 2>"$dir/r$r.err" &
    fi
    pids="$pids $!"
  done
  # Every rank joined (or one failed to): then a random moment into the steps.
  local left=300
  while ((left > 0)); do
    local ready=0
    for r in 0 1 2 3; do grep -q "^READY\|^INIT_FAILED" "$dir/r$r.out" 2>/dev/null && ready=$((ready + 1)); done
    ((ready == 4)) && break
    sleep 0.1
    left=$((left - 1))
  done
  sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
}

declare -A total disagree broken hangs minority errors blames_live
blamed_trials=""
run_trial() {
  local kind=$1 victim=$((RANDOM % 4)) others="" all="" stuck
  local mode=local
  [[ $kind == cut ]] && mode=testbed
  start_ranks "$mode"
  local -a pid=($pids)
  for r in 0 1 2 3; do [[ $r != "$victim" ]] && others="$others ${pid[$r]}"; done
  case "$kind" in
    kill) kill -9 "${pid[$victim]}" ;;
    stop) kill -STOP "${pid[$victim]}" ;;
    cut) "$testbed" cut --name "$tb_name" "$victim" ;;
  esac
  stuck=$(wait_for "$others" 120)
  if [[ $kind == stop ]]; then kill -CONT "${pid[$victim]}"; fi
  if [[ $kind != kill ]]; then stuck="$stuck $(wait_for "${pid[$victim]}" 120)"; fi
  stuck=$(echo $stuck)
  [[ -n "$stuck" ]] && kill -9 $stuck 2>/dev/null
  wait 2>/dev/null
  pids=""
  # Who lived on: everyone but a killed rank. The connected ranks: everyone but the victim.
  local lines="" rest="" r c
  for r in 0 1 2 3; do
    c=$(last_commit "$dir/r$r.out")
    [[ $c == -1 ]] && broken[$kind]=$((${broken[$kind]:-0} + 1))
    if [[ $r != "$victim" ]]; then rest="$rest $c"; fi
    if [[ $kind != kill || $r != "$victim" ]]; then lines="$lines $c"; fi
  done
  # Survivors' errors that blame a live rank instead of the victim: the first rank an ABORT's
  # message names after "... on rank R: " (a killed rank is the only dead one; for stop and cut
  # the victim is the one that was lost).
  local named blamed_here=""
  for r in 0 1 2 3; do
    [[ $r == "$victim" ]] && continue
    named=$(awk '$1 == "STEP" && $3 == "ABORT" {line = $0} END {print line}' "$dir/r$r.out" |
            sed -E 's/^[^:]* on rank [0-9]+: //' | grep -oE 'ranks? [0-9]+' | head -1 | cut -d' ' -f2)
    [[ -z "$(awk '$1 == "STEP" && $3 == "ABORT"' "$dir/r$r.out")" ]] && continue
    errors[$kind]=$((${errors[$kind]:-0} + 1))
    if [[ "$named" != "$victim" ]]; then
      blames_live[$kind]=$((${blames_live[$kind]:-0} + 1))
      blamed_trials="$blamed_trials $trial:r$r"
      blamed_here=1
    fi
  done
  local verdict=agree
  [[ $(echo $lines | tr ' ' '\n' | sort -u | wc -l) -gt 1 ]] && verdict=DISAGREE
  # The connected survivors alone (for stop and cut the victim may be the odd one out).
  local rest_verdict=agree
  [[ $(echo $rest | tr ' ' '\n' | sort -u | wc -l) -gt 1 ]] && rest_verdict=DISAGREE
  total[$kind]=$((${total[$kind]:-0} + 1))
  [[ $verdict == DISAGREE ]] && disagree[$kind]=$((${disagree[$kind]:-0} + 1))
  [[ $rest_verdict == DISAGREE ]] && minority[$kind]=$((${minority[$kind]:-0} + 1))
  [[ -n "$stuck" ]] && hangs[$kind]=$((${hangs[$kind]:-0} + 1))
  echo "TRIAL $trial kind=$kind victim=$victim last_commits=[$lines ] connected=[$rest ]" \
       "$verdict${stuck:+ hung}"
  [[ -n "$keep" || $verdict == DISAGREE || -n "$blamed_here" ]] || rm -rf "$dir"
}

trial=0
for ((i = 0; i < kills; i++)); do trial=$((trial + 1)); run_trial kill; done
for ((i = 0; i < stops; i++)); do trial=$((trial + 1)); run_trial stop; done
if ((cuts > 0)); then
  if ! why=$("$testbed" check 2>&1); then
    skipped="SKIP cut trials: $why"
    echo "$skipped"
    cuts=0
  fi
fi
for ((i = 0; i < cuts; i++)); do
  trial=$((trial + 1))
  "$testbed" down --name "$tb_name" >/dev/null 2>&1 || true
  "$testbed" up --name "$tb_name" --hosts 4 --owner-pid $$ >/dev/null || { echo "SKIP cut: testbed up failed"; break; }
  run_trial cut
done
failed=0
summary="$work/summary"
: >"$summary"
for kind in kill stop cut; do
  [[ -n "${total[$kind]:-}" ]] || continue
  (( ${minority[$kind]:-0} + ${broken[$kind]:-0} + ${hangs[$kind]:-0} > 0 )) && failed=1
  echo "SUMMARY kind=$kind trials=${total[$kind]} disagreements=${disagree[$kind]:-0}" \
       "connected_disagreements=${minority[$kind]:-0} broken=${broken[$kind]:-0}" \
       "hangs=${hangs[$kind]:-0} survivor_errors=${errors[$kind]:-0}" \
       "blames_a_live_rank=${blames_live[$kind]:-0}" | tee -a "$summary"
done
[[ -n "$blamed_trials" ]] && echo "BLAMES_LIVE trial:rank$blamed_trials" | tee -a "$summary"
[[ -n "${skipped:-}" ]] && echo "$skipped" >>"$summary"
echo "LOAD average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$summary"
write_results "$summary"
# Disagreements kept for a look (their ranks' outputs) when --keep is not given.
if [[ -z "$keep" ]] && compgen -G "$work/trial*" >/dev/null; then
  mkdir -p /tmp/outcome_trials_disagreements && cp -r "$work"/trial* /tmp/outcome_trials_disagreements/
fi
exit $failed
