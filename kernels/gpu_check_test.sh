#!/usr/bin/env bash
# kernels/gpu_check.sh without a GPU: it says what is missing and exits 2; its summary parses
# benchmark and torch results (synthetic ones here) into the figures the README asks for.
set -uo pipefail
fail() { echo "FAIL: $*"; exit 1; }
script=kernels/gpu_check.sh
[[ -x $script ]] || fail "no $script"

# No nvidia-smi on PATH: exit 2 with a MISSING line.
export OUT=$TEST_TMPDIR/out
bin=$TEST_TMPDIR/bin
mkdir -p "$bin"
for tool in bash dirname sed tee cat git head mkdir; do
  path=$(command -v "$tool") && ln -sf "$path" "$bin/$tool"
done
PATH=$bin "$script" > "$TEST_TMPDIR/log" 2>&1
rc=$?
((rc == 2)) || { cat "$TEST_TMPDIR/log"; fail "exit $rc without a GPU, expected 2"; }
grep -q "MISSING: no NVIDIA GPU" "$OUT/summary.txt" || fail "no MISSING line in the summary"

# The summary of a run: copy 4000 GB/s; encode 4096x4096 device work 0.1 ms (2013 GB/s),
# end to end 0.2 ms; torch 1.5 ms.
cat > "$OUT/benchmark.json" <<'JSON'
{"benchmarks": [
 {"name": "lbcc::kernels::BM_DeviceCopy/1073741824/real_time", "real_time": 536.9, "time_unit": "us", "bytes_per_second": 4.0e12},
 {"name": "lbcc::kernels::BM_TopKEfEncodeGpuKernels/4096/4096/manual_time", "real_time": 100.0, "time_unit": "us", "bytes_per_second": 2.013265920e12},
 {"name": "lbcc::kernels::BM_TopKEfEncodeGpu/4096/4096/real_time", "real_time": 0.2, "time_unit": "ms", "bytes_per_second": 1.00663296e12},
 {"name": "lbcc::kernels::BM_TopKEfEncodeGpu/8192/8192/real_time", "error_occurred": true, "error_message": "x"}
]}
JSON
echo '{"rows": 4096, "cols": 4096, "seconds_per_step": 0.0015}' > "$OUT/torch_4096x4096.json"
python3 kernels/gpu/summarize.py "$OUT" > "$TEST_TMPDIR/summary" || fail "summarize.py failed"
cat "$TEST_TMPDIR/summary"
grep -q "device copy: 4000 GB/s" "$TEST_TMPDIR/summary" || fail "copy figure"
grep -q "4096x4096, device work: 0.100 ms, 2013 GB/s of 12 B/element = 0.50 of device copy (goal >= 0.5); torch.topk baseline 1.500 ms = 15.0x" "$TEST_TMPDIR/summary" || fail "device-work line"
grep -q "4096x4096, end to end: 0.200 ms, 1007 GB/s of 12 B/element = 0.25 of device copy" "$TEST_TMPDIR/summary" || fail "end-to-end line"
grep -q "8192x8192" "$TEST_TMPDIR/summary" && fail "a failed case was summarized"
echo "PASS"
