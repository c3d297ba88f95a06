#!/usr/bin/env bash
# lbcc_perf's output read the way nccl-tests' output is read by the scripts that consume it:
# FlagPerf's `grep "# Avg bus bandwidth" | awk '{print $NF}'`, SuperBench's row parser (rows
# between the "out-of-place" header and "Out of bounds values", busbw at line[-6], with
# --nolbcc_columns), and the usual per-row regular expression of nccl-tests' 13 columns. Also:
# nccl-tests' busbw factors, a spoilt value gives FAILED and exit status 1, a bad --op is
# refused before any output, -g N starts N processes.
set -euo pipefail
perf=$1
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*" >&2; exit 1; }
export UCX_MEM_EVENTS=no

"$perf" --local 2 -b 8 -e 64K -f 4 -n 2 -w 1 --quiet > "$tmp/allreduce.txt" || fail "allreduce exit $?"
"$perf" --local 2 --op allgather -b 1K -e 64K -f 8 -n 2 --quiet --nolbcc_columns \
  > "$tmp/allgather.txt" || fail "allgather exit $?"
"$perf" --local 2 --op sparse_allreduce -b 16K -e 64K -f 4 -n 1 --quiet > "$tmp/sparse.txt" ||
  fail "sparse exit $?"

# FlagPerf.
for f in allreduce allgather sparse; do
  bw=$(grep "# Avg bus bandwidth" "$tmp/$f.txt" | awk '{print $NF}')
  [[ $bw =~ ^[0-9.e+-]+$ ]] || fail "$f: Avg bus bandwidth '$bw'"
done

python3 - "$tmp" <<'PY'
import re, sys
tmp = sys.argv[1]
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                 r"\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)")
OOB = re.compile(r"# Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)")
AVG = re.compile(r"# Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")

def rows(name):
    text = open(f"{tmp}/{name}.txt").read()
    out = [ROW.match(l).groups() for l in text.splitlines() if not l.startswith("#") and l.strip()]
    assert out, text
    assert OOB.search(text).groups() == ("0", "OK"), text
    avg = float(AVG.search(text).group(1))
    measured = [float(r[7]) for r in out] + [float(r[11]) for r in out]
    assert abs(avg - sum(measured) / len(measured)) <= 0.01, (avg, measured)
    return text, out

n = 2
text, r = rows("allreduce")
assert [int(x[0]) for x in r] == [8, 32, 128, 512, 2048, 8192, 32768], r
for size, count, typ, redop, root, t, alg, bus, wrong, t2, alg2, bus2, wrong2 in r:
    assert (typ, redop, root, wrong, wrong2) == ("float", "sum", "-1", "0", "0"), r
    assert int(count) * 4 == int(size)
    # busbw = algbw * 2(n-1)/n (printed with 2 decimals).
    assert abs(float(bus) - float(alg) * 2 * (n - 1) / n) <= 0.011, (alg, bus)
header = [l.split() for l in text.splitlines() if l.split()[1:3] == ["size", "count"]][0]
assert header[1:14] == ["size", "count", "type", "redop", "root", "time", "algbw", "busbw",
                        "#wrong", "time", "algbw", "busbw", "#wrong"], header
assert header[14:] == ["wire", "ratio", "error", "fast", "slow", "slow_all"], header

text, r = rows("allgather")
# Size is the gathered bytes, count each rank's elements; busbw = algbw * (n-1)/n.
for x in r:
    assert int(x[1]) * 4 * n == int(x[0]), x
    assert len(x) == 13 and x[3] == "none"
    assert abs(float(x[7]) - float(x[6]) * (n - 1) / n) <= 0.011, x
# SuperBench's parser (micro_benchmarks/cuda_nccl_bw_performance.py), on nccl-tests' 13 columns.
content = text.splitlines()
start = [i for i, l in enumerate(content) if "out-of-place" in l][-1]
end = [i for i, l in enumerate(content) if "Out of bounds values" in l][0]
busbw_out = -1
for line in content[start + 4:end]:
    line = re.sub(r" +", " ", line.strip(" ")).split(" ")
    if len(line) <= 10:
        break
    busbw_out = max(busbw_out, float(line[-6]))
assert busbw_out == max(float(x[7]) for x in r[1:]), (busbw_out, r)

text, r = rows("sparse")
for x in r:
    assert x[3] == "avg" and x[8] == "0" and x[12] == "0", x
print("lbcc_perf output parsed:", len(r), "sparse rows")
PY

# A wrong value: FAILED, exit status 1.
set +e
LBCCPERF_CORRUPT=1 "$perf" --local 2 -b 1K -e 1K -n 1 --quiet > "$tmp/corrupt.txt"
rc=$?
set -e
[[ $rc -eq 1 ]] || fail "corrupt run exit $rc"
grep -qE "^# Out of bounds values : 2 FAILED" "$tmp/corrupt.txt" || fail "$(cat "$tmp/corrupt.txt")"

# Flags: a bad --op is refused before any output; errors name their flag; -g 2 = 2 processes.
set +e
"$perf" --op allreduc -b 8 > "$tmp/out.txt" 2> "$tmp/err.txt"; rc=$?
set -e
[[ $rc -eq 2 && ! -s "$tmp/out.txt" ]] || fail "bad --op: exit $rc, output $(cat "$tmp/out.txt")"
grep -q -- "--op allreduc" "$tmp/err.txt" || fail "bad --op message: $(cat "$tmp/err.txt")"
for args in "-b 1x" "-e 1K -b 2K" "-f 0" "-n 0" "-o prod" "-d double" "-a 7" "-z 2" "--tensors 0"; do
  set +e
  # shellcheck disable=SC2086
  "$perf" $args > /dev/null 2> "$tmp/err.txt"; rc=$?
  set -e
  flag=${args%% *}
  [[ $rc -eq 2 ]] || fail "'$args': exit $rc"
  grep -q -- "$flag" "$tmp/err.txt" || fail "'$args' message does not name $flag: $(cat "$tmp/err.txt")"
done
"$perf" -g 2 -b 1K -e 1K -n 1 --quiet > "$tmp/g.txt" || fail "-g 2 exit $?"
grep -q "^#  Rank  1 " "$tmp/g.txt" || fail "-g 2: $(cat "$tmp/g.txt")"
echo "lbcc_perf: all checks passed"
