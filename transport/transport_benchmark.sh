#!/usr/bin/env bash
# Runs //transport:transport_benchmark (its cases and targets: transport_benchmark.cc) and writes
# its figures to bench/results/transport.md with the date, the machine and the command. With
# --compare WORKTREE (another checkout where the benchmark is built, e.g. main's), runs that
# tree's binary and this one alternately, --rounds times each, and writes both side by side.
#
#   transport/transport_benchmark.sh [--rounds N] [--compare WORKTREE] [--filter REGEX] [--out FILE]
#
# Needs root for the shaped cases (they bring up tools/testbed; without root they report an
# error and the loopback case still runs). Builds the benchmark here with -c opt. Refuses to
# write (exit 3, the reason printed, FILE left as it was) when a baseline is off its expected
# range (bench/baselines.py: ucx_perftest on loopback, the shaped link's rate); records the
# load average before and after the rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
args="$*"
rounds=1 compare="" filter="" out=bench/results/transport.md
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift ;;
    --compare) compare=$2; shift ;;
    --filter) filter=$2; shift ;;
    --out) out=$2; shift ;;
    -h|--help) sed -n "2,13p" "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
bazel build -c opt //transport:transport_benchmark >/dev/null 2>&1 ||
  bazel build -c opt //transport:transport_benchmark
here=$PWD
trees=("$here")
if [[ -n "$compare" ]]; then
  compare=$(cd "$compare" && pwd)
  [[ -x "$compare/bazel-bin/transport/transport_benchmark" ]] || {
    echo "no built transport_benchmark in $compare (bazel build -c opt //transport:transport_benchmark there)" >&2
    exit 1
  }
  trees=("$compare" "$here")
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
load_before=$(bench/baselines.py load)
for ((round = 1; round <= rounds; ++round)); do
  for i in "${!trees[@]}"; do
    tree=${trees[$i]}
    echo "round $round: $tree" >&2
    (cd "$tree" && bazel-bin/transport/transport_benchmark ${filter:+--benchmark_filter="$filter"} \
      --benchmark_out="$tmp/$i.$round.json" --benchmark_out_format=json >&2)
  done
done
mkdir -p "$(dirname "$out")"
python3 - "$tmp" "$out" "$rounds" "$args" "$load_before" "${trees[@]}" <<'EOF'
import json, os, platform, subprocess, sys, time
sys.path.insert(0, "bench")
import baselines
tmp, out, rounds, args, load_before, trees = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                              sys.argv[4], sys.argv[5], sys.argv[6:])
load_after = baselines.load()
def rev(tree):
    try:
        return subprocess.run(["git", "-C", tree, "log", "-1", "--format=%h %s"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except Exception:
        return "?"
runs = {}  # (benchmark, counter) -> [(tree index, round, value)]
labels = {}
for i in range(len(trees)):
    for r in range(1, rounds + 1):
        with open(os.path.join(tmp, f"{i}.{r}.json")) as f:
            data = json.load(f)
        for b in data["benchmarks"]:
            name = b["name"].split("/iterations:")[0].split("/manual_time")[0]
            if "error_message" in b:
                runs.setdefault((name, "error"), []).append((i, r, b["error_message"]))
                continue
            if b.get("label"):
                labels.setdefault(name, b["label"])
            for key, value in b.items():
                if key in ("name", "run_name", "run_type", "repetitions", "repetition_index",
                           "threads", "iterations", "real_time", "cpu_time", "time_unit",
                           "label", "family_index", "per_family_instance_index", "error_occurred",
                           "aggregate_name"):
                    continue
                if isinstance(value, (int, float)):
                    runs.setdefault((name, key), []).append((i, r, value))
# The baselines the ratios divide by, each round's: refused when one is off its range.
cells = {}  # (benchmark, tree, round) -> {counter: value}
for (name, key), values in runs.items():
    for i, r, v in values:
        cells.setdefault((name, i, r), {})[key] = v
check = baselines.Checker(out)
for (name, i, r), c in sorted(cells.items()):
    where = f"{name} tree {i} round {r}"
    if name.startswith("BM_LoopbackTcp") and "ucx_perftest_MBps" in c:
        check("ucx_perftest_loopback", c["ucx_perftest_MBps"], where=where)
    for key, baseline in (("ucx_perftest_MBps", "shaped_link_rate"),
                          ("lbcc_MBps", "shaped_link_measured")):
        if "shaped_MBps" in c and key in c:
            check(baseline, c[key], reference=c["shaped_MBps"], where=f"{where} {key}")
check.refuse_if_off()
lines = [
    "# transport/ figures",
    "",
    "Written by `transport/transport_benchmark.sh`; do not edit by hand. Cases and targets: "
    "[transport/transport_benchmark.cc](../../transport/transport_benchmark.cc).",
    "",
    f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}",
    f"- machine: {platform.node()}, {platform.platform()}, {os.cpu_count()} cores",
    f"- load average (1, 5, 15 min): {load_before} before the rounds, {load_after} after",
    "- command: `" + f"transport/transport_benchmark.sh {args}".strip() + "`",
]
for i, tree in enumerate(trees):
    lines.append(f"- tree {i}: `{tree}` at {rev(tree)}")
lines += ["", "Rounds alternate between the trees; each cell is one round's value.", ""]
header = "| case | counter | " + " | ".join(
    f"tree {i} round {r}" for r in range(1, rounds + 1) for i in range(len(trees))) + " |"
lines += [header, "|" + "---|" * (2 + rounds * len(trees))]
for (name, key), values in sorted(runs.items()):
    cells = {(i, r): v for i, r, v in values}
    row = []
    for r in range(1, rounds + 1):
        for i in range(len(trees)):
            v = cells.get((i, r), "")
            row.append(f"{v:.4g}" if isinstance(v, float) else str(v))
    lines.append(f"| {name} | {key} | " + " | ".join(row) + " |")
if labels:
    lines += [""] + [f"- {name}: {label}" for name, label in sorted(labels.items())]
with open(out, "w") as f:
    f.write("\n".join(lines) + "\n")
print(out)
EOF
