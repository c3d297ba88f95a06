#!/usr/bin/env bash
# The dependency list of LBCC's shared objects and tools (their DT_NEEDED entries) stays within
# what they are allowed to need: glibc, the C++ runtime, UCX, Debian's Abseil (shared: Debian's
# libabsl_*.a are not position-independent, so they cannot go into a shared object) and a
# feature's library (xxhash for payload checksums, OpenBLAS for the subspace codec that the
# C API's activation calls and the Python package use, OpenSSL's libcrypto for the job secret's
# authentication and encryption of links, zstd for the elastic shared-state transfer). And each shared object exports only its API: lbcc* (liblbcc.so), the ncclNetPlugin
# tables (the plugin), PyInit__lbcc (the extension).
set -euo pipefail
source "$(dirname "$0")/flags.sh"
flags_positional "LIBLBCC PLUGIN PYEXT LBCC LBCC_PERF" "the built objects"
flags_parse "$@"
set -- "${FLAGS_ARGS[@]}"
fail() { echo "FAIL: $*" >&2; exit 1; }
base='libc\.so\.6|libm\.so\.6|libstdc\+\+\.so\.6|libgcc_s\.so\.1|ld-linux-x86-64\.so\.2|libucp\.so\.0|libucs\.so\.0|libabsl_[a-z0-9_]+\.so\.20220623'
check() {  # OBJECT EXTRA_ALLOWED EXPORTED
  local object=$1 allowed="^(${base}${2:+|$2})$" exported=$3 needed bad
  needed=$(readelf -d "$object" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  bad=$(grep -vE "$allowed" <<<"$needed" || true)
  [[ -z $bad ]] || fail "$(basename "$object") needs $(echo $bad)"
  echo "$(basename "$object"): $(wc -l <<<"$needed") needed ($(grep -c absl <<<"$needed") Abseil): $(echo $needed | tr ' ' '\n' | grep -v absl | tr '\n' ' ')"
  if [[ -n $exported ]]; then
    bad=$(nm -D --defined-only "$object" | awk '{print $3}' | grep -vE "^($exported)$" || true)
    [[ -z $bad ]] || fail "$(basename "$object") exports $(echo $bad | head -c 300)"
  fi
}
check "$1" 'libxxhash\.so\.0|libopenblas\.so\.0|libcrypto\.so\.3|libzstd\.so\.1' 'lbcc[A-Za-z0-9_]*'
check "$2" 'libcrypto\.so\.3' 'ncclNetPlugin_v[0-9]+'
check "$3" 'libxxhash\.so\.0|libopenblas\.so\.0|libcrypto\.so\.3|libzstd\.so\.1' 'PyInit__lbcc'
check "$4" 'libxxhash\.so\.0|libopenblas\.so\.0|libcrypto\.so\.3|libzstd\.so\.1' ''
check "$5" 'libxxhash\.so\.0|libopenblas\.so\.0|libcrypto\.so\.3|libzstd\.so\.1' ''
echo "ldd_test: dependency lists within bounds"
