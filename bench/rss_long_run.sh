#!/bin/bash
# Resident memory over long runs (issue 19 item 2): 1,000,000 8-byte all-reduces and 100,000
# sparse all-reduces, 4 ranks as threads over the loopback transport; RSS every N calls.
# Writes bench/results/rss.md (date, machine, commit, command, curves, growth after warm-up)
# from the raw samples in bench/results/rss_<op>.txt; a count of 0 keeps that op's earlier run.
#   bench/rss_long_run.sh [allreduce_calls] [sparse_calls]
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/flags.sh
flags_positional "[allreduce_calls] [sparse_calls]" "calls of each op (defaults 1000000 and 100000; 0 keeps that op's earlier run)"
flags_parse "$@"
((${#FLAGS_ARGS[@]} <= 2)) || { echo "rss_long_run: unexpected argument ${FLAGS_ARGS[2]}" >&2; exit 2; }
ALLREDUCE_CALLS=${FLAGS_ARGS[0]:-1000000}
SPARSE_CALLS=${FLAGS_ARGS[1]:-100000}
for n in "$ALLREDUCE_CALLS" "$SPARSE_CALLS"; do
  [[ $n =~ ^[0-9]+$ ]] || { echo "rss_long_run: call counts must be integers, not '$n'" >&2; exit 2; }
done
bazel build --jobs=2 //bench:rss_long_run >/dev/null
BIN=bazel-bin/bench/rss_long_run
OUT=bench/results/rss.md
RAW=bench/results
run() {  # name calls every
  [ "$2" -gt 0 ] || return 0
  local start end
  start=$(date +%s)
  echo "# command: $BIN --op $1 --calls $2 --every $3" > "$RAW/rss_$1.txt.tmp"
  echo "# started $(date -u '+%Y-%m-%d %H:%M UTC') at commit $(git rev-parse --short HEAD)" >> "$RAW/rss_$1.txt.tmp"
  "$BIN" --op "$1" --calls "$2" --every "$3" 2>/dev/null >> "$RAW/rss_$1.txt.tmp"
  end=$(date +%s)
  echo "# seconds $((end - start))" >> "$RAW/rss_$1.txt.tmp"
  mv "$RAW/rss_$1.txt.tmp" "$RAW/rss_$1.txt"
}
run allreduce "$ALLREDUCE_CALLS" $((ALLREDUCE_CALLS / 20))
run sparse_allreduce "$SPARSE_CALLS" $((SPARSE_CALLS / 20))
{
  echo "# RSS over long runs (issue 19 item 2)"
  echo
  echo "Written by \`bench/rss_long_run.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'),"
  echo "machine: $(uname -n), $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')),"
  echo "shared with other jobs (load average at the end: $(cut -d' ' -f1-3 /proc/loadavg))."
  echo "4 ranks as threads of one process over the loopback transport; rank 0 samples the"
  echo "process's VmRSS and the transport's live per-tag entries on the send side of its links every 1/20 of the run."
  echo "Growth = RSS at the end minus RSS at the first sample (the warm-up). Target: within 1 MB (1024 KiB)."
  for op in allreduce sparse_allreduce; do
    f="$RAW/rss_$op.txt"
    [ -f "$f" ] || continue
    calls=$(sed -n 's/.*--calls \([0-9]*\).*/\1/p' "$f" | head -1)
    echo
    case $op in
      allreduce) echo "## 8-byte all_reduce (2 x f32), $calls calls per rank";;
      *) echo "## sparse_all_reduce (one 64x64 f32 tensor, top-k 64, error feedback), $calls calls per rank";;
    esac
    echo
    echo "Command: \`$(sed -n 's/^# command: //p' "$f")\` ($(sed -n 's/^# started //p' "$f"), $(sed -n 's/^# seconds //p' "$f") s)"
    echo
    echo "| calls | RSS (KiB) | live tag entries (rank 0) |"
    echo "|---:|---:|---:|"
    grep -v '^#' "$f" | awk '{printf "| %s | %s | %s |\n", $1, $2, $3}'
    echo
    growth=$(grep '^# growth_kib' "$f" | awk '{print $3}')
    echo "Growth after warm-up: **$growth KiB** ($([ "$growth" -le 1024 ] && echo "flat within 1 MB" || echo "NOT within 1 MB"))."
  done
} > "$OUT"
echo "wrote $OUT"
