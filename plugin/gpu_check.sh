#!/usr/bin/env bash
# The GPU verification of plugin/ (NCCL_PTR_CUDA staged through pinned host buffers), for a
# machine with an NVIDIA GPU; a few minutes. It cannot run on a machine without one.
#
#   plugin/gpu_check.sh        build the plugin and its tests with --config=cuda, then run
#                              - plugin_gpu_test: the built .so (v11) must advertise NCCL_PTR_CUDA;
#                                cudaMalloc'ed buffers registered as NCCL_PTR_CUDA cross a
#                                self-connection and a two-process connection (0 B to 64 MiB,
#                                grouped receives, 8 in flight, iflush), every byte checked on the
#                                host after a copy back, bytes past each message untouched;
#                              - plugin_harness_test against the same CUDA build (host memory,
#                                every version, two processes), so the CUDA build changes nothing
#                                for host buffers;
#                              - net_test under --config=cuda (staging logic on the emulated GPU).
#
# Results go to $OUT (default /tmp/lbcc_plugin_gpu_check): one log per step and summary.txt.
# Exit status: 0 when every step passed; 1 when one failed; 2 when something needed is missing
# (no GPU, no nvcc, no bazel), with the reason in the summary.
set -uo pipefail

cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/lbcc_plugin_gpu_check}
CUDA=${CUDA_PATH:-/usr/local/cuda}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

note "== LBCC plugin/ GPU check, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  note "GPU: $(nvidia-smi -L | head -1); driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
else
  note "MISSING: no NVIDIA GPU visible (nvidia-smi -L failed); nothing to check"
  exit 2
fi
[[ -x $CUDA/bin/nvcc ]] || { note "MISSING: no nvcc at $CUDA/bin/nvcc (set CUDA_PATH)"; exit 2; }
command -v bazel >/dev/null 2>&1 || { note "MISSING: bazel"; exit 2; }

TARGETS=(//plugin:plugin_gpu_test //plugin:plugin_harness_test //plugin:net_test)
if ! bazel build --config=cuda "${TARGETS[@]}" > "$OUT/build.log" 2>&1; then
  note "FAILED: bazel build --config=cuda (see $OUT/build.log)"
  tail -20 "$OUT/build.log"
  exit 1
fi
note "built: $(ldd bazel-bin/plugin/libnccl-net-lbcc.so | awk '/cudart/{print $1, $3}')"

failed=0
run() {  # name, then the bazel test arguments
  local name=$1
  shift
  if bazel test --config=cuda --test_output=all "$@" > "$OUT/$name.log" 2>&1; then
    note "test $name: ok ($(grep -c '^\[       OK \]' "$OUT/$name.log") passed, $(grep -c '^\[  SKIPPED \] .*(' "$OUT/$name.log") skipped)"
    if grep -q '^\[  SKIPPED \] .*(' "$OUT/$name.log"; then
      note "  WARNING: skipped tests on a GPU machine (see $OUT/$name.log)"
    fi
  else
    note "test $name: FAILED (see $OUT/$name.log)"
    grep -E 'FAILED|Failure|Expected' "$OUT/$name.log" | head -20 | tee -a "$SUMMARY"
    failed=1
  fi
}
run plugin_gpu_test //plugin:plugin_gpu_test
grep -E 'messages each way checked' "$OUT/plugin_gpu_test.log" | tee -a "$SUMMARY"
run plugin_harness_test //plugin:plugin_harness_test
run net_test //plugin:net_test

if ((failed)); then note "RESULT: a step failed"; exit 1; fi
note "RESULT: the CUDA path passed on this GPU"
note "Not covered here: NCCL itself over the plugin (NCCL_NET_PLUGIN=lbcc with nccl-tests or"
note "torch.distributed across two GPUs or hosts); see plugin/README.md."
exit 0
