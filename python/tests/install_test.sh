#!/usr/bin/env bash
# python/install_files.sh installs an importable package: a fresh interpreter with only the
# install folder on its path imports lbcc and lbcc.torch from there and uses them.
set -euo pipefail
root="${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE:-lbcc}"
dest="${TEST_TMPDIR:-/tmp}/site"
"$root/python/install_files.sh" --c10d "$root/python/lbcc/_c10d_lbcc.so" "$root/python/lbcc" \
  "$root/python/lbcc/_lbcc.so" "$dest"
cd "${TEST_TMPDIR:-/tmp}"
PYTHONPATH="$dest" PYTHONDONTWRITEBYTECODE=1 "${LBCC_PYTHON:-/usr/bin/python3}" - "$dest" <<'PY'
import os
import sys

import torch

import lbcc
import lbcc.torch

dest = os.path.realpath(sys.argv[1])
assert lbcc.torch.backend._c10d_lbcc is not None, "the backend's extension was not installed"
for module in (lbcc, lbcc.torch, lbcc._lbcc, lbcc.torch.backend._c10d_lbcc):
    assert os.path.realpath(module.__file__).startswith(dest), module.__file__
codec = lbcc.DenseQuantCodec("bf16")
x = torch.linspace(-1, 1, 256)
out = torch.empty(256)
lbcc.decode(codec.encode(x), out)
assert (out - x).abs().max() < 1e-2
uid = lbcc.create_unique_id()
comm = lbcc.Communicator.init(uid, 1, 0, backend="loopback", timeout=10)
t = torch.ones(4)
comm.all_reduce(t)
assert t.tolist() == [1.0] * 4
comm.close()
print("lbcc", lbcc.__version__, "imported from", os.path.dirname(lbcc.__file__))
PY
