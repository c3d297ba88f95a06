#!/usr/bin/env bash
# Churn variant of the heterogeneous training demo (hetero.py --churn), tiny model: the pipeline
# replica's stage is killed at a random step and restarted a few steps later; the membership
# services (sharing lbcc.ElasticUnits) take the pipeline replica out and admit it back as a unit
# through lbcc.torch.SparseLoCo(elastic=True). Checks (check_churn.py, from the ranks' logs): the
# surviving stage was told replica_left, both shards lost and regained the replica at the same
# outer steps, every committed outer step and the final parameters are bit-identical on the
# members of its epoch, the loss keeps decreasing.
set -euo pipefail
root="${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE:-lbcc}"
cd "$root"
export LBCC_PYTHONPATH="$root/python"
out="${TEST_TMPDIR:-/tmp}/hetero_churn"
python="${LBCC_PYTHON:-/usr/bin/python3}"
"$python" examples/hetero_training/hetero.py --preset smoke --churn --steps 80 --inner-steps 5 \
    --d 32 --layers 2 --seq 16 --timeout 120 --out "$out"
"$python" examples/hetero_training/check_churn.py "$out"
