#!/bin/bash
# The cost of the operation-header round (comm/signature.h, issue 19 item 1) on an 8-byte
# all_reduce: this tree's lbcc_perf alternating with a baseline build (a tree without the
# header round), 4 ranks as processes over UCX on 127.0.0.1. Writes
# bench/results/signature_overhead.md (date, machine, commands, every run, medians, ratio).
#   bench/signature_overhead.sh BASELINE_LBCC_PERF [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:?usage: bench/signature_overhead.sh BASELINE_LBCC_PERF [rounds]}
ROUNDS=${2:-5}
bazel build --jobs=2 //bench:lbcc_perf >/dev/null
NEW=$(mktemp -d)/lbcc_perf
cp -L bazel-bin/bench/lbcc_perf "$NEW"
ARGS="--local 4 -b 8 -e 8 -n 2000 -w 200 -c 0"
OUT=bench/results/signature_overhead.md
ROWS=$(mktemp)
for i in $(seq "$ROUNDS"); do
  for which in baseline new; do
    bin=$BASE; [ $which = new ] && bin=$NEW
    line=$(timeout 600 "$bin" $ARGS 2>/dev/null | grep -E '^ +8 ' || true)
    oop=$(echo "$line" | awk '{print $6}'); inp=$(echo "$line" | awk '{print $10}')
    echo "$i $which ${oop:-NA} ${inp:-NA} $(cut -d' ' -f1 /proc/loadavg)" >> "$ROWS"
  done
done
median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "NA"; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
med() { awk -v w="$1" -v c="$2" '$2 == w && $c != "NA" {print $c}' "$ROWS" | median; }
b_oop=$(med baseline 3); n_oop=$(med new 3); b_inp=$(med baseline 4); n_inp=$(med new 4)
{
  echo "# Operation-header round: cost on an 8-byte all_reduce (issue 19 item 1)"
  echo
  echo "Written by \`bench/signature_overhead.sh $BASE $ROUNDS\` on $(date -u '+%Y-%m-%d %H:%M UTC'),"
  echo "machine: $(uname -n), $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')),"
  echo "shared with other jobs (the load average of each run is listed: figures this noisy are"
  echo "only indicative). This tree: commit $(git rev-parse --short HEAD); baseline: \`$BASE\`."
  echo "Command (each binary, alternating): \`lbcc_perf $ARGS\` (UCX on 127.0.0.1, 4 processes)."
  echo
  echo "| round | binary | out-of-place time (us) | in-place time (us) | load average |"
  echo "|---:|---|---:|---:|---:|"
  awk '{printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5}' "$ROWS"
  echo
  echo "Medians: baseline $b_oop / $b_inp us, with the header round $n_oop / $n_inp us"
  echo "(out-of-place / in-place); ratio $(awk -v a="$n_oop" -v b="$b_oop" 'BEGIN {printf "%.2f", a / b}') / $(awk -v a="$n_inp" -v b="$b_inp" 'BEGIN {printf "%.2f", a / b}')."
} > "$OUT"
rm -f "$ROWS"
echo "wrote $OUT"
