#!/usr/bin/env bash
# Runs the toy model's boundary through the Python path (python/tests/pipeline_payloads.py),
# then the same through the C API (activations_wire_test.cc), which compares the payloads.
#   activations_wire_test.sh WIRE_TEST_BINARY
set -euo pipefail
binary=$(realpath "$1")
root="${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE:-lbcc}"
out="${TEST_TMPDIR:?}/python_payloads"
mkdir -p "$out"
# One thread for torch and OpenBLAS, on both sides (the coefficients come from cblas_sgemm).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1
(cd "$root" && PYTHONPATH="$root/python:$root/python/tests" \
  "${LBCC_PYTHON:-/usr/bin/python3}" python/tests/pipeline_payloads.py "$out")
LBCC_PYTHON_PAYLOADS_DIR="$out" exec "$binary"
