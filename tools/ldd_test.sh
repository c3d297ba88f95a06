#!/usr/bin/env bash
# The dependency list of LBCC's shared objects and tools (their DT_NEEDED entries) stays within
# what they are allowed to need: glibc, the C++ runtime and a feature's library (xxhash for
# payload checksums, OpenBLAS for the subspace codec that the C API's activation calls and the
# Python package use, OpenSSL's libcrypto for the job secret's authentication and encryption of
# links, zstd for the elastic shared-state transfer; libtorch for the torch backend). Abseil is
# inside each object (built from source, statically) and none of them needs a libabsl_*.so; UCX
# is loaded at run time into a link-map namespace of its own (transport/ucx_api.h), so none
# needs libucp/libucs or calls a ucp_* symbol the dynamic linker would bind in the program's
# namespace. And each shared object exports only its API: lbcc* (liblbcc.so), the ncclNetPlugin
# tables (the plugin), PyInit__lbcc and PyInit__c10d_lbcc (the extensions), none of Abseil.
set -euo pipefail
source "$(dirname "$0")/flags.sh"
flags_positional "LIBLBCC PLUGIN PYEXT LBCC LBCC_PERF [C10D]" "the built objects"
flags_parse "$@"
set -- "${FLAGS_ARGS[@]}"
(($# == 5 || $# == 6)) || { echo "ldd_test.sh: needs 5 or 6 objects (see --help)" >&2; exit 2; }
fail() { echo "FAIL: $*" >&2; exit 1; }
base='libc\.so\.6|libm\.so\.6|libstdc\+\+\.so\.6|libgcc_s\.so\.1|ld-linux-x86-64\.so\.2'
features='libxxhash\.so\.0|libopenblas\.so\.0|libcrypto\.so\.3|libzstd\.so\.1'
check() {  # OBJECT EXTRA_ALLOWED EXPORTED
  local object=$1 allowed="^(${base}${2:+|$2})$" exported=$3 needed bad
  needed=$(readelf -d "$object" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  bad=$(grep -vE "$allowed" <<<"$needed" || true)
  [[ -z $bad ]] || fail "$(basename "$object") needs $(echo $bad)"
  bad=$(nm -D --undefined-only "$object" | awk '{print $2}' | grep -E '^(ucp|ucs|uct|ucm)_' || true)
  [[ -z $bad ]] || fail "$(basename "$object") binds UCX in the program's namespace: $(echo $bad | head -c 300)"
  if [[ -n $exported ]]; then  # A shared object (the tools are programs: their symbols are the program's).
    bad=$(nm -D --defined-only "$object" | awk '{print $3}' | grep -E '4absl|^absl' || true)
    [[ -z $bad ]] || fail "$(basename "$object") exports Abseil: $(echo $bad | head -c 300)"
    bad=$(nm -D --defined-only "$object" | awk '{print $3}' | grep -vE "^($exported)$" || true)
    [[ -z $bad ]] || fail "$(basename "$object") exports $(echo $bad | head -c 300)"
  fi
  echo "$(basename "$object"): $(wc -l <<<"$needed") needed: $(echo $needed)"
}
check "$1" "$features" 'lbcc[A-Za-z0-9_]*'
check "$2" 'libcrypto\.so\.3' 'ncclNetPlugin_v[0-9]+'
check "$3" "$features" 'PyInit__lbcc'
check "$4" "$features" ''
check "$5" "$features" ''
if (($# == 6)); then
  check "$6" "$features|libtorch_python\.so\.[0-9.]+|libtorch\.so\.[0-9.]+|libtorch_cpu\.so\.[0-9.]+|libc10\.so\.[0-9.]+" 'PyInit__c10d_lbcc'
fi
echo "ldd_test: dependency lists within bounds"
