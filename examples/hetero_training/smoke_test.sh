#!/usr/bin/env bash
# Smoke variant of the heterogeneous training demo, with its checks (check_smoke.py): loss
# decreases, every replica holds the same bits after each outer step, slow-link bytes match the
# payload accounting.
set -euo pipefail
root="${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE:-lbcc}"
cd "$root"
export LBCC_PYTHONPATH="$root/python"
out="${TEST_TMPDIR:-/tmp}/hetero_smoke"
python="${LBCC_PYTHON:-/usr/bin/python3}"
"$python" examples/hetero_training/hetero.py --preset smoke --account --timeout 240 --out "$out"
"$python" examples/hetero_training/check_smoke.py "$out"
