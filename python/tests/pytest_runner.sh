#!/usr/bin/env bash
# Runs pytest on LBCC's Python tests with the `lbcc` package from the Bazel runfiles
# (python/lbcc/*.py next to the built python/lbcc/_lbcc.so).
#   pytest_runner.sh python/tests/test_x.py [pytest args]
# One thread per process for torch and OpenBLAS: the tests start several ranks on few cores.
set -euo pipefail
root="${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE:-lbcc}"
cd "$root"
export PYTHONPATH="$root/python:$root/python/tests"
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
python="${LBCC_PYTHON:-/usr/bin/python3}"
exec "$python" -m pytest -p no:cacheprovider -q --durations=5 \
  --basetemp="${TEST_TMPDIR:-/tmp}/pytest" -o "junit_family=xunit1" \
  ${XML_OUTPUT_FILE:+--junitxml="$XML_OUTPUT_FILE"} "$@"
