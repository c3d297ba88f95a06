"""The boundary traffic of a two-stage toy model through the Python path, as bytes on the wire.

tests/activations_wire_test runs the same model through the C API and compares its payloads
with the ones this script writes, byte for byte; test_pipeline.py runs it too.

The model: stage 0 outputs h = T[y] + r (T the basis's token table, r a fixed pattern), stage 1
takes the loss 0.5 ||h - target||^2, so the gradient of h is h - target (exact in float32, as
in C). Schedule, per side: F0 F1 B0 | basis v0 -> v1 | F2 B1 B2, so B1 is the backward of a
v0 forward sent after the change. Senders are lbcc.torch.PipelineBoundary on both sides;
receivers capture what arrived with comm.recv_subspace(return_payload=True): run "forward"
captures the forwards (stage 1 sends its gradients with comm.send_subspace, as the boundary
does), run "backward" the backwards (stage 1 is a PipelineBoundary, stage 0 captures).

    python3 pipeline_payloads.py OUT_DIR

writes OUT_DIR/payloads.txt ("forward|backward <microbatch> <hex>" per line) and
OUT_DIR/basis_v1.lbccb (the changed basis, for lbccBasisLoad).
"""

import os
import sys

import numpy as np
import torch

import lbcc
from conftest import run_ranks
from lbcc.torch import PipelineBoundary

# Keep in step with tests/activations_wire_test.cc.
D, K, V, TOKENS, SEED, TAG = 32, 8, 40, 24, 11, 4
MICROBATCHES = 3
CHANGE_BEFORE = 2  # microbatch 2's forward is the first with basis v1
COEFFICIENTS = "bf16"  # the C API's default


def bases():
    v0 = lbcc.SubspaceBasis.from_seed(model_dim=D, rank=K, vocab_size=V, with_table=True,
                                      table_stddev=0.5, seed=SEED, version=0)
    return v0, v0.with_table(v0.table * np.float32(1.5), 1)


def ids_of(mb):
    return torch.tensor([(t * 7 + mb * 3) % V for t in range(TOKENS)], dtype=torch.int32)


def pattern(mb, a, b, modulo, scale, offset):
    t = torch.arange(TOKENS).reshape(-1, 1)
    j = torch.arange(D).reshape(1, -1)
    return ((t * a + j * b + mb) % modulo).to(torch.float32) / scale - offset


def stage0_output(basis, mb):
    """h = T[y] + r, leaf of stage 0's graph."""
    table = torch.from_numpy(basis.table)
    h = table[ids_of(mb).long()] + pattern(mb, 5, 3, 11, 8.0, 0.5)
    return h.requires_grad_()


def target(mb):
    return pattern(2 * mb, 3, 1, 13, 16.0, 0.25)


def forward_basis(mb, v0, v1):
    return v0 if mb < CHANGE_BEFORE else v1


def capture(direction):
    """Runs the schedule; returns the payloads of `direction` as received, per microbatch."""
    v0, v1 = bases()
    schedule = ["F0", "F1", "B0", "change", "F2", "B1", "B2"]

    def stage0(comm):
        boundary = PipelineBoundary(comm, 1, v0, coefficient_dtype=COEFFICIENTS, tag=TAG,
                                    timeout=30)
        handles, got = {}, {}
        for step in schedule:
            if step == "change":
                boundary.update_basis(v1)
            elif step[0] == "F":
                mb = int(step[1])
                handles[mb] = boundary.send(stage0_output(boundary.basis, mb), ids_of(mb))
            elif direction == "forward":
                handles[int(step[1])].backward()
            else:
                g = torch.empty(TOKENS, D)
                _, got[int(step[1])] = comm.recv_subspace(
                    g, 1, TAG, boundary.codecs, direction="backward", return_payload=True)
        boundary.synchronize()
        return got

    def stage1(comm):
        if direction == "backward":
            boundary = PipelineBoundary(comm, 0, v0, coefficient_dtype=COEFFICIENTS, tag=TAG,
                                        timeout=30)
            received = {}
            for step in schedule:
                if step == "change":
                    boundary.update_basis(v1)
                elif step[0] == "F":
                    received[int(step[1])] = boundary.recv(TOKENS)[0]
                else:
                    mb = int(step[1])
                    (0.5 * ((received[mb] - target(mb)) ** 2).sum()).backward()
            boundary.synchronize()
            return {}
        codecs = {b: lbcc.SubspaceCodec(b, coefficient_dtype=COEFFICIENTS) for b in (v0, v1)}
        accepted = [codecs[v0]]
        got, h, selectors, requests = {}, {}, {}, []
        for step in schedule:
            if step == "change":
                accepted = [codecs[v1], codecs[v0]]
            elif step[0] == "F":
                mb = int(step[1])
                h[mb] = torch.empty(TOKENS, D)
                ids = torch.empty(TOKENS, dtype=torch.int32)
                selectors[mb], got[mb] = comm.recv_subspace(
                    h[mb], 0, TAG, accepted, ids_out=ids, direction="forward",
                    return_payload=True)
                assert torch.equal(ids, ids_of(mb))
            else:
                mb = int(step[1])
                codec = codecs[forward_basis(mb, v0, v1)]
                requests.append(comm.send_subspace(h[mb] - target(mb), 0, TAG, codec,
                                                   direction="backward",
                                                   selectors=selectors[mb], async_op=True))
        for r in requests:
            r.wait()
        return got

    got0, got1 = run_ranks(2, lambda rank, comm: stage0(comm) if rank == 0 else stage1(comm))
    return got1 if direction == "forward" else got0


def main(out_dir):
    _, v1 = bases()
    v1.save(os.path.join(out_dir, "basis_v1.lbccb"))
    lines = []
    for direction in ("forward", "backward"):
        got = capture(direction)
        assert sorted(got) == list(range(MICROBATCHES)), got.keys()
        lines += [f"{direction} {mb} {got[mb].hex()}" for mb in range(MICROBATCHES)]
    with open(os.path.join(out_dir, "payloads.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
