#!/usr/bin/env bash
# The GPU verification of kernels/ in one go: under two minutes on one H200 (kernels/README.md).
#
#   kernels/gpu_check.sh           on a machine with an NVIDIA GPU: take the GPU binaries (from
#                                  kernels/gpu_bundle/, or built with Bazel when that is
#                                  missing), run the GPU tests (device codecs against the CPU
#                                  codecs), the benchmark (encode vs device copy bandwidth) and
#                                  the torch.topk SparseLoCo baseline, and print a summary
#   kernels/gpu_check.sh --pack    on a build machine with nvcc (no GPU needed): build those
#                                  binaries with --config=cuda, statically linked against LBCC,
#                                  and copy them with the shared libraries they need (beyond
#                                  glibc, the CUDA driver and cuBLAS) into kernels/gpu_bundle/
#                                  (ignored by git), for GPU machines without Bazel or LBCC's
#                                  Debian packages
#   kernels/gpu_check.sh --build   on the GPU machine: build with Bazel even if a bundle exists
#
# Results go to $OUT (default /tmp/lbcc_gpu_check): one log per test, benchmark.json,
# torch_*.json, summary.txt, and kernels_gpu.md (also copied to bench/results/): the summary
# with the date, machine, GPU and command. Exit status: 0 when every step ran and every test passed (figures
# are reported, never judged); 1 when a test failed; 2 when something needed is missing (the
# summary says what).
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
BUNDLE=$ROOT/kernels/gpu_bundle
# shellcheck source=tools/gpu_bundle.sh
source "$ROOT/tools/gpu_bundle.sh"
OUT=${OUT:-/tmp/lbcc_gpu_check}
CUDA=${CUDA_PATH:-/usr/local/cuda}
# package:target of every binary the check runs.
TESTS=(kernels:cuda_runtime_test kernels:device_codec_gpu_test kernels:device_subspace_gpu_test
       comm:device_sparse_allreduce_test)
BENCH=kernels:topk_ef_gpu_benchmark
GPU_CHECK_ARGS="$*"
gpu_check_parse "$0" "$@"

targets() {
  local t
  for t in "${TESTS[@]}" "$BENCH"; do echo "//$t"; done
}

bin_path() {  # package:target -> bazel-bin path
  echo "bazel-bin/${1%%:*}/${1##*:}"
}

bazel_build() {
  # --dynamic_mode=off: LBCC's own libraries are linked into each binary, so a bundle needs
  # only system libraries beside them.
  bazel build --config=cuda --dynamic_mode=off $(targets)
}

if [[ $mode == pack ]]; then
  [[ -x $CUDA/bin/nvcc ]] || { echo "gpu_check.sh --pack: no nvcc at $CUDA/bin/nvcc"; exit 2; }
  bazel_build || { echo "gpu_check.sh --pack: the build failed"; exit 1; }
  files=()
  for t in "${TESTS[@]}" "$BENCH"; do files+=("$(bin_path "$t")"); done
  gpu_bundle_pack "$BUNDLE" "${files[@]}"
  echo "gpu_check.sh --pack: $(du -sh "$BUNDLE" | cut -f1) in $BUNDLE"
  cat "$BUNDLE/MANIFEST"
  exit 0
fi

gpu_check_start "kernels/ GPU check"
missing=0

# The binaries: a bundle made by --pack, or a Bazel build here.
BIN=""
if [[ $mode == check && -d $BUNDLE/bin ]]; then
  BIN=$BUNDLE/bin
  note "binaries: bundle ($(head -1 "$BUNDLE/MANIFEST"); this tree: $(git rev-parse HEAD 2>/dev/null || echo unknown))"
elif command -v bazel >/dev/null 2>&1; then
  note "binaries: bazel build --config=cuda (here)"
  if bazel_build > "$OUT/build.log" 2>&1; then
    BIN=$OUT/bin
    mkdir -p "$BIN"
    for t in "${TESTS[@]}" "$BENCH"; do cp -f "$(bin_path "$t")" "$BIN/"; done
  else
    note "FAILED: bazel build --config=cuda (see $OUT/build.log)"
    tail -20 "$OUT/build.log"
    exit 1
  fi
else
  note "MISSING: no kernels/gpu_bundle and no bazel: run kernels/gpu_check.sh --pack on a build machine with nvcc and carry kernels/gpu_bundle here"
  exit 2
fi

# cuBLAS and the CUDA runtime: the CUDA toolkit's, or the ones PyTorch's wheels carry. Python
# (torch) runs with the caller's library path, never the bundle's older C++ runtime.
PY_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
if [[ $BIN == "$BUNDLE/bin" ]]; then gpu_bundle_env "$BUNDLE"; else gpu_bundle_env "$OUT"; fi
while read -r line; do
  [[ -n $line ]] && { note "MISSING libraries for $line"; missing=1; }
done < <(gpu_bundle_missing "$BIN"/*)

# 1. Correctness: the device codecs against the CPU codecs.
failed=0
for t in "${TESTS[@]}"; do
  name=${t##*:}
  log=$OUT/$name.log
  timeout 150 "$BIN/$name" > "$log" 2>&1
  rc=$?
  passed=$(grep -c '^\[       OK \]' "$log")
  # The *WithoutCuda* tests are meant to skip where a device is present.
  skipped=$(grep '^\[  SKIPPED \] .*(' "$log" | grep -vc 'WithoutCuda')
  fails=$(grep -c '^\[  FAILED  \] .*(' "$log")
  if ((rc == 0)); then
    note "test $name: ok ($passed passed, $skipped skipped)"
    ((skipped > 0)) && note "  WARNING: $name skipped $skipped tests on a GPU machine (see $log)"
  else
    note "test $name: FAILED (exit $rc, $fails failed, $passed passed; see $log)"
    grep -E '^\[  FAILED  \]|Failure|Expected|Which is' "$log" | head -20 | tee -a "$SUMMARY"
    failed=1
  fi
done

# 2. Benchmark: encode throughput against device copy bandwidth, same binary, same run.
timeout 240 "$BIN/topk_ef_gpu_benchmark" --benchmark_out="$OUT/benchmark.json" \
  --benchmark_out_format=json --benchmark_min_time=0.5 > "$OUT/benchmark.log" 2>&1
rc=$?
((rc == 0)) || { note "benchmark: FAILED (exit $rc; see $OUT/benchmark.log)"; failed=1; }
tail -6 "$OUT/benchmark.log" | tee -a "$SUMMARY"

# 3. The torch.topk SparseLoCo baseline on the same GPU.
for shape in 4096x4096 8192x8192; do
  if command -v python3 >/dev/null 2>&1; then
    LD_LIBRARY_PATH=$PY_LD_LIBRARY_PATH timeout 300 python3 kernels/gpu/torch_sparseloco.py --rows "${shape%x*}" --cols "${shape#*x}" \
      --json "$OUT/torch_$shape.json" > "$OUT/torch_$shape.log" 2>&1
    rc=$?
    if ((rc == 2)); then
      note "MISSING: torch with CUDA ($(cat "$OUT/torch_$shape.log" | tail -1))"
      missing=1
      break
    elif ((rc != 0)); then
      note "torch baseline $shape: FAILED (exit $rc; see $OUT/torch_$shape.log)"
    fi
  else
    note "MISSING: python3 (for the torch baseline)"
    missing=1
    break
  fi
done

# 4. Summary: the figures of this run next to the issue's goals.
LD_LIBRARY_PATH=$PY_LD_LIBRARY_PATH python3 kernels/gpu/summarize.py "$OUT" 2>&1 | tee -a "$SUMMARY"

# 5. The results file (the only place kernels/ figures are kept): the summary with the date,
# the machine, the GPU and the command. In $OUT (it comes back from a device machine) and in
# the tree's bench/results/.
{
  echo "# kernels/ GPU check results"
  echo
  echo "Written by \`kernels/gpu_check.sh ${GPU_CHECK_ARGS:-}\`; do not edit by hand."
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "- tree: $(git rev-parse --short HEAD 2>/dev/null || echo unknown); binaries: $(if [[ $BIN == "$BUNDLE/bin" ]]; then head -1 "$BUNDLE/MANIFEST"; else echo "built here"; fi)"
  echo "- machine: \`$(uname -a)\`"
  echo "- cpu: $(lscpu 2>/dev/null | grep 'Model name' | sed 's/Model name: *//')"
  echo "- gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo
  echo '```'
  cat "$SUMMARY"
  echo '```'
} > "$OUT/kernels_gpu.md"
mkdir -p "$ROOT/bench/results" 2>/dev/null && cp -f "$OUT/kernels_gpu.md" "$ROOT/bench/results/kernels_gpu.md" 2>/dev/null
note "results: $OUT/kernels_gpu.md"

if ((failed)); then note "RESULT: a test or the benchmark failed"; exit 1; fi
if ((missing)); then note "RESULT: tests passed; something was missing (see above)"; exit 2; fi
note "RESULT: all GPU tests passed; figures above are from this run"
exit 0
