#!/usr/bin/env bash
# The outcome agreement's cost on the no-failure path (docs/agreement.md): SparseAllReduce time
# from lbcc_perf --local 4 of this tree against a baseline lbcc_perf without the agreement,
# alternating the two binaries round by round so that both see the same machine load; writes
# bench/results/agreement.md (median and best time per size, their ratios, the load average).
# Without --baseline, the baseline is this tree built with -DLBCC_MEASURE_WITHOUT_AGREEMENT for
# comm/sparse_allreduce.cc alone (a measurement-only switch: SparseAllReduce concludes without
# the agreement, everything else the same), and --this is this tree's normal build.
#
#   bench/agreement_overhead.sh [--baseline /path/to/lbcc_perf] [--this bazel-bin/bench/lbcc_perf]
#       [--rounds 5] [--iters 30] [--sizes "64K 1M 4M"] [--out bench/results/agreement.md]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
FLAGS_SCRIPT="$here/agreement_overhead.sh"
source "$here/../tools/flags.sh"
flags_value baseline "" "baseline lbcc_perf (empty: this tree built without the agreement)"
flags_value this "$here/../bazel-bin/bench/lbcc_perf" "this tree's lbcc_perf"
flags_value rounds 5 "alternating rounds"
flags_value sizes "64K 1M 4M" "tensor sizes"
flags_value iters 30 "timed iterations per run"
flags_value out "$here/results/agreement.md" "results file"
flags_parse "$@"
((${#FLAGS_ARGS[@]} == 0)) || { echo "agreement_overhead: unexpected argument ${FLAGS_ARGS[0]}" >&2; exit 2; }
baseline=$FLAG_baseline this=$FLAG_this rounds=$FLAG_rounds sizes=$FLAG_sizes iters=$FLAG_iters
out=$FLAG_out
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ -z "$baseline" ]]; then
  switch="--per_file_copt=comm/sparse_allreduce.cc@-DLBCC_MEASURE_WITHOUT_AGREEMENT"
  (cd "$here/.." && bazel build --jobs=2 $switch //bench:lbcc_perf >/dev/null 2>&1 &&
     cp -L bazel-bin/bench/lbcc_perf "$work/without_agreement" &&
     bazel build --jobs=2 //bench:lbcc_perf >/dev/null 2>&1 &&
     cp -L bazel-bin/bench/lbcc_perf "$work/with_agreement")
  baseline="$work/without_agreement (this tree, $switch)"
  baseline_bin="$work/without_agreement"
  this="$work/with_agreement"
  this_label="this tree, bazel build //bench:lbcc_perf"
else
  baseline_bin=$baseline
fi
[[ -x "$baseline_bin" && -x "$this" ]] || {
  echo "agreement_overhead: --baseline and --this must be lbcc_perf binaries" >&2; exit 2; }

# One lbcc_perf run per size: prints "size time_us" (out-of-place time, mean over ranks).
measure() {
  local bin=$1 size
  for size in $sizes; do
    UCX_MEM_EVENTS=no "$bin" --local 4 --op sparse_allreduce -b "$size" -e "$size" -n "$iters" -w 5 \
      2>/dev/null | awk '$1 ~ /^[0-9]+$/ {print $1, $6}'
  done
}
load=$(cut -d' ' -f1-3 /proc/loadavg)
for ((r = 0; r < rounds; r++)); do
  measure "$baseline_bin" >>"$work/baseline"
  measure "$this" >>"$work/this"
done

end_load=$(cut -d' ' -f1-3 /proc/loadavg)
best() { sort -g | head -1; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
{
  echo "# Outcome agreement: SparseAllReduce cost without failures"
  echo
  echo "Written by bench/agreement_overhead.sh on $(date -u '+%Y-%m-%d %H:%M UTC'), host $(uname -n)"
  echo "($(nproc) cores, shared with other jobs, load average $load at the start and $end_load at"
  echo "the end: medians and bests of $rounds alternating rounds). Tree: commit $(git -C "$here/.." rev-parse --short HEAD)."
  echo
  echo "Command: \`bench/agreement_overhead.sh --rounds $rounds --iters $iters" \
       "--sizes \"$sizes\"\`; each round runs \`lbcc_perf --local 4 --op sparse_allreduce -b S -e S" \
       "-n $iters -w 5\` (4 processes over UCX on 127.0.0.1, TopK-EF) per size S, baseline first." \
       "Baseline: $baseline; with agreement: ${this_label:-$this}."

  echo
  echo "| size (B) | baseline median (us) | with agreement median (us) | median ratio | baseline best (us) | with agreement best (us) | best ratio |"
  echo "|---:|---:|---:|---:|---:|---:|---:|"
  for size_bytes in $(awk '{print $1}' "$work/baseline" | sort -gu); do
    b=$(awk -v s="$size_bytes" '$1 == s {print $2}' "$work/baseline" | median)
    t=$(awk -v s="$size_bytes" '$1 == s {print $2}' "$work/this" | median)
    bb=$(awk -v s="$size_bytes" '$1 == s {print $2}' "$work/baseline" | best)
    tb=$(awk -v s="$size_bytes" '$1 == s {print $2}' "$work/this" | best)
    echo "| $size_bytes | $b | $t | $(awk -v b="$b" -v t="$t" 'BEGIN {printf "%.3f", t / b}') |" \
         "$bb | $tb | $(awk -v b="$bb" -v t="$tb" 'BEGIN {printf "%.3f", t / b}') |"
  done
  echo
  echo "Raw (size, time us), baseline: $(tr '\n' ';' <"$work/baseline")"
  echo
  echo "Raw (size, time us), with agreement: $(tr '\n' ';' <"$work/this")"
} >"$out"
cat "$out"
