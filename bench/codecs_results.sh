#!/usr/bin/env bash
# The codecs' figures in one run, written with the date, the machine and the exact commands to
# bench/results/codecs.md (the only place codecs/ figures are kept; docs/codecs.md names the
# cases).
#
#   bench/codecs_results.sh [--min-time 1] [--filter REGEX] [--subspace] [--out FILE]
#
# Runs //bench:topk_ef_benchmark (all cases, or those matching --filter) and, with
# --subspace, //bench:subspace_benchmark on one OpenBLAS thread. Serialised with other
# benchmark runs through /tmp/lbcc-bench.lock. Records the load average before and after;
# refuses to write (exit 3, the reason printed, FILE left as it was) when a limit the ratios
# divide by (triad, memcpy, sgemm) is off its expected range (bench/baselines.py).
set -euo pipefail
cd "$(dirname "$0")/.."
args="$*"
min_time=1 filter=. subspace=0 out=bench/results/codecs.md
while (($#)); do
  case "$1" in
    --min-time) min_time=$2; shift ;;
    --filter) filter=$2; shift ;;
    --subspace) subspace=1 ;;
    --out) out=$2; shift ;;
    -h|--help) sed -n "2,12p" "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
targets=(//bench:topk_ef_benchmark)
((subspace)) && targets+=(//bench:subspace_benchmark)
bazel build -c opt "${targets[@]}" >/dev/null 2>&1 || bazel build -c opt "${targets[@]}"

json=$(mktemp -d)
trap 'rm -rf "$json"' EXIT
runs=0
run() {  # title, command...; each run's figures also go to $json/N.json for the check below
  local title=$1
  shift
  printf '\n## %s\n\n```sh\n%s\n```\n\n```\n' "$title" "$*"
  runs=$((runs + 1))
  # Colour codes stripped: some Google Benchmark builds colour even when not on a terminal.
  flock /tmp/lbcc-bench.lock "$@" --benchmark_out="$json/$runs.json" \
    --benchmark_out_format=json 2>&1 | sed 's/\x1b\[[0-9;]*m//g'
  printf '```\n'
}

load_before=$(bench/baselines.py load)
tmp=$(mktemp)
{
  echo "# codecs/ benchmark results"
  echo
  echo "Written by \`bench/codecs_results.sh${args:+ $args}\`; do not edit by hand."
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "- machine: \`$(uname -a)\`"
  echo "- cpu: $(lscpu | grep 'Model name' | sed 's/Model name: *//'), $(nproc) cores"
  echo "- load average (1, 5, 15 min) at the start: $load_before"
  run "TopK-EF and dense quantizer (bazel-bin/bench/topk_ef_benchmark)" \
    bazel-bin/bench/topk_ef_benchmark --benchmark_filter="$filter" --benchmark_min_time="$min_time"
  if ((subspace)); then
    run "Subspace codec (bazel-bin/bench/subspace_benchmark, OPENBLAS_NUM_THREADS=1)" \
      env OPENBLAS_NUM_THREADS=1 bazel-bin/bench/subspace_benchmark --benchmark_min_time="$min_time"
  fi
  echo
  echo "Load average (1, 5, 15 min) at the end: $(bench/baselines.py load)."
} > "$tmp"
# The limits the ratios divide by, every run of them: refused (nothing written) when one is off.
python3 - "$json" "$out" <<'EOF' || { rc=$?; rm -f "$tmp"; exit "$rc"; }
import glob, json, sys
sys.path.insert(0, "bench")
import baselines
check = baselines.Checker(sys.argv[2])
counters = {"BM_Triad": ("triad", "items_per_second"), "BM_Memcpy": ("memcpy", "bytes_per_second"),
            "BM_Sgemm": ("sgemm", "FLOP/s")}
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    for b in json.load(open(path))["benchmarks"]:
        family = b["name"].split("/")[0]
        if family in counters and b.get("run_type", "iteration") == "iteration" and \
                counters[family][1] in b:
            name, key = counters[family]
            check(name, b[key] / 1e9, where=b["name"])
check.refuse_if_off()
EOF
mkdir -p "$(dirname "$out")"
chmod 644 "$tmp"
mv "$tmp" "$out"
echo "bench/codecs_results.sh: wrote $out"
