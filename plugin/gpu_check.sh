#!/usr/bin/env bash
# The GPU verification of plugin/ (NCCL_PTR_CUDA staged through pinned host buffers), for a
# machine with an NVIDIA GPU; about two minutes.
#
#   plugin/gpu_check.sh          on a machine with an NVIDIA GPU: take the binaries (from
#                                plugin/gpu_bundle/, or built with Bazel when that is missing),
#                                then run
#                                - plugin_gpu_test: the built .so (v11) must advertise
#                                  NCCL_PTR_CUDA; cudaMalloc'ed buffers registered as
#                                  NCCL_PTR_CUDA cross a self-connection and a two-process
#                                  connection (0 B to 64 MiB, grouped receives, 8 in flight,
#                                  iflush), every byte checked after a copy back;
#                                - plugin_harness_test against the same CUDA build (host memory,
#                                  every version, two processes);
#                                - NCCL itself over the plugin (plugin/gpu/nccl_allreduce.py):
#                                  two torch.distributed processes on the one GPU, told apart by
#                                  NCCL_HOSTID, all-reduce 4 KiB-256 MiB checked exactly, once
#                                  with NCCL's host staging and once with device buffers handed
#                                  to the plugin (NCCL_NET_GDR_LEVEL=SYS), and the same over NCCL's
#                                  own sockets as the peer
#   plugin/gpu_check.sh --pack   on a build machine with nvcc (no GPU needed): build those with
#                                --config=cuda and copy them with the shared libraries they need
#                                into plugin/gpu_bundle/ (ignored by git; tools/gpu_bundle.sh)
#   plugin/gpu_check.sh --build  on the GPU machine: build with Bazel even if a bundle exists
#
# Results go to $OUT (default /tmp/lbcc_plugin_gpu_check): one log per step and summary.txt.
# Exit status: 0 when every step passed; 1 when one failed; 2 when something needed is missing
# (no GPU, no bundle and no bazel, torch without CUDA), with the reason in the summary.
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
BUNDLE=$ROOT/plugin/gpu_bundle
# shellcheck source=tools/gpu_bundle.sh
source "$ROOT/tools/gpu_bundle.sh"
OUT=${OUT:-/tmp/lbcc_plugin_gpu_check}
CUDA=${CUDA_PATH:-/usr/local/cuda}
TESTS=(plugin_gpu_test plugin_harness_test)
PLUGIN=libnccl-net-lbcc.so

gpu_check_parse "$0" "$@"

bazel_build() {
  bazel build --config=cuda --dynamic_mode=off "${TESTS[@]/#/\/\/plugin:}" "//plugin:$PLUGIN"
}

if [[ $mode == pack ]]; then
  [[ -x $CUDA/bin/nvcc ]] || { echo "gpu_check.sh --pack: no nvcc at $CUDA/bin/nvcc"; exit 2; }
  bazel_build || { echo "gpu_check.sh --pack: the build failed"; exit 1; }
  gpu_bundle_pack "$BUNDLE" "${TESTS[@]/#/bazel-bin/plugin/}" "bazel-bin/plugin/$PLUGIN"
  echo "gpu_check.sh --pack: $(du -sh "$BUNDLE" | cut -f1) in $BUNDLE"
  cat "$BUNDLE/MANIFEST"
  exit 0
fi

gpu_check_start "plugin/ GPU check"

PY_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
if [[ $mode == check && -d $BUNDLE/bin ]]; then
  BIN=$BUNDLE/bin
  note "binaries: bundle ($(head -1 "$BUNDLE/MANIFEST"); this tree: $(git rev-parse HEAD 2>/dev/null || echo unknown))"
  gpu_bundle_env "$BUNDLE"
elif command -v bazel >/dev/null 2>&1; then
  note "binaries: bazel build --config=cuda (here)"
  if ! bazel_build > "$OUT/build.log" 2>&1; then
    note "FAILED: bazel build --config=cuda (see $OUT/build.log)"
    tail -20 "$OUT/build.log"
    exit 1
  fi
  BIN=$OUT/bin
  mkdir -p "$BIN"
  for f in "${TESTS[@]}" "$PLUGIN"; do cp -f "bazel-bin/plugin/$f" "$BIN/"; done
  gpu_bundle_env "$OUT"
else
  note "MISSING: no plugin/gpu_bundle and no bazel: run plugin/gpu_check.sh --pack on a build machine with nvcc and carry plugin/gpu_bundle here"
  exit 2
fi
missing=0
while read -r line; do
  [[ -n $line ]] && { note "MISSING libraries for $line"; missing=1; }
done < <(gpu_bundle_missing "$BIN"/*)
note "plugin: $(ldd "$BIN/$PLUGIN" | awk '/cudart/{print $1, $3}')"

# One device on 127.0.0.1 over UCX's tcp, pinned fast (as plugin/BUILD.bazel runs the tests).
export LBCC_PLUGIN_DEVICES=127.0.0.1=fast UCX_TLS=tcp UCX_MEM_EVENTS=no
failed=0
run_test() {  # name, then its arguments
  local name=$1 log=$OUT/$1.log
  shift
  LBCC_DEBUG=INFO timeout 240 "$BIN/$name" "$@" > "$log" 2>&1
  local rc=$?
  local passed skipped
  passed=$(grep -c '^\[       OK \]' "$log")
  skipped=$(grep -c '^\[  SKIPPED \] .*(' "$log")
  if ((rc == 0)); then
    note "test $name: ok ($passed passed, $skipped skipped)"
    ((skipped > 0)) && note "  WARNING: skipped tests on a GPU machine (see $log)"
  else
    note "test $name: FAILED (exit $rc; see $log)"
    grep -E 'FAILED|Failure|Expected' "$log" | head -20 | tee -a "$SUMMARY"
    failed=1
  fi
}
run_test plugin_gpu_test "--plugin=$BIN/$PLUGIN"
grep -E 'messages each way checked' "$OUT/plugin_gpu_test.log" | tee -a "$SUMMARY"
run_test plugin_harness_test "--plugin=$BIN/$PLUGIN" "--gtest_filter=-PluginTestbedTest.*"

# NCCL over the plugin. Python keeps its own C++ runtime: the bundle's lib/ without lib/cxx.
# The peer, in the same run: NCCL's own sockets over the same loopback.
for variant in host gdr socket; do
  log=$OUT/nccl_$variant.log
  case $variant in
    host) flag=(--plugin "$BIN/$PLUGIN") ;;
    gdr) flag=(--plugin "$BIN/$PLUGIN" --gdr) ;;
    socket) flag=(--net Socket) ;;
  esac
  (LD_LIBRARY_PATH=$PY_LD_LIBRARY_PATH
   if [[ $BIN == "$BUNDLE/bin" ]]; then gpu_bundle_env "$BUNDLE" nocxx; fi
   timeout 300 python3 plugin/gpu/nccl_allreduce.py "${flag[@]}" \
     --json "$OUT/nccl_$variant.json") > "$log" 2>&1
  rc=$?
  if ((rc == 0)); then
    note "NCCL all-reduce, $variant: ok"
    grep -E ' B .*algbw' "$log" | sed 's/^/  /' | tee -a "$SUMMARY"
    grep -m1 -E 'NET/Plugin.*(Loaded|Using)|Using network LBCC' "$log" | sed 's/^/  /' | tee -a "$SUMMARY"
  elif ((rc == 2)); then
    note "$(tail -1 "$log")"
    missing=1
  else
    note "NCCL all-reduce, $variant: FAILED (exit $rc; see $log)"
    grep -E 'WARN|Error|error|mismatch' "$log" | head -15 | tee -a "$SUMMARY"
    failed=1
  fi
done

if ((failed)); then note "RESULT: a step failed"; exit 1; fi
if ((missing)); then note "RESULT: tests passed; something was missing (see above)"; exit 2; fi
note "RESULT: the CUDA path and NCCL over the plugin passed on this GPU"
exit 0
