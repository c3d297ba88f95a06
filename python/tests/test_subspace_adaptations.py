"""The subspace adaptations after a SparseLoCo outer step (lbcc.torch.subspace;
docs/boundary_modes.md): the embedding shift keeps the model's function, every rank computes
the same next basis on its own (including a later pipeline stage that holds no embedding), the
version goes up by one per shift, and the pseudo-gradient projection keeps exactly the in-subspace
part of the delta.

fp32 bound of the shift: T' = fl(T + fl(E - fl(P E))) and E' = fl(P E) with P E computed in double
and rounded once, so each element of T'[y] + E'[y] differs from T[y] + E[y] by at most a few
roundings of magnitude max(|T|, |E|, |P E|): |delta| <= 4 eps32 (|T| + |E| + |P E|) elementwise,
eps32 = 2^-24 (asserted below). Through a LayerNorm and two linear layers of width 32 that
perturbation stays below 1e-5 absolute for outputs of order 1.
"""

import hashlib
import struct

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lbcc
from conftest import run_ranks
from lbcc.torch import project_
from lbcc.torch.subspace import (apply_embedding_update_, embedding_update,
                                 project_pseudo_gradient_, shift_embedding_)

V, D, K = 30, 32, 6
EPS32 = 2.0 ** -24


def make_basis():
    return lbcc.SubspaceBasis.from_seed(model_dim=D, rank=K, vocab_size=V, with_table=True,
                                        table_stddev=0.5, seed=9, version=3)


class TinyModel(nn.Module):
    """h0 = T[y] + E[y], one residual write (W_o), LayerNorm, head."""

    def __init__(self, basis, seed=1):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("table", torch.from_numpy(basis.table).clone())
        self.tok = nn.Parameter(torch.randn(V, D, generator=g) * 0.5)
        self.mix = nn.Linear(D, D)
        self.proj = nn.Linear(D, D)
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, V)
        with torch.no_grad():
            for lin in (self.mix, self.proj, self.head):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * 0.2)
                lin.bias.zero_()

    def h0(self, ids):
        return F.embedding(ids, self.table) + F.embedding(ids, self.tok)

    def forward(self, ids):
        h = self.h0(ids)
        h = h + self.proj(torch.tanh(self.mix(h)))
        return self.head(self.ln(h))


def test_shift_keeps_the_function_and_moves_the_rest_into_the_table():
    basis = make_basis()
    model = TinyModel(basis)
    ids = torch.arange(V).repeat(3)
    with torch.no_grad():
        before_h0, before = model.h0(ids).clone(), model(ids).clone()
        t0, e0 = model.table.clone(), model.tok.detach().clone()
    u = torch.from_numpy(basis.u).double()
    pe = (e0.double() @ u) @ u.t()
    nxt = shift_embedding_(basis, model.tok, model.table)
    with torch.no_grad():
        after_h0, after = model.h0(ids), model(ids)
    bound = 4 * EPS32 * (t0.abs() + e0.abs() + pe.abs().float())
    assert ((after_h0 - before_h0).abs() <= bound[ids]).all()
    assert (after - before).abs().max().item() < 1e-5
    # E is now in span(U); the table took the rest; the basis is the next version.
    assert torch.allclose(model.tok.detach().double(), pe, atol=1e-6)
    assert torch.allclose(model.table.double(), t0.double() + e0.double() - pe, atol=1e-6)
    assert torch.equal(torch.from_numpy(nxt.table), model.table)
    assert nxt.version == basis.version + 1 and nxt.hash != basis.hash
    assert torch.equal(torch.from_numpy(nxt.u), torch.from_numpy(basis.u))
    # The codec of the next basis rebuilds h0 exactly (up to rounding); the old basis' codec
    # refuses the new basis' payloads.
    codec = lbcc.SubspaceCodec(nxt, coefficient_dtype="f32")
    payload, _ = codec.encode_forward(after_h0.contiguous(), ids.to(torch.int32))
    out = torch.empty_like(after_h0)
    codec.decode_forward(payload, out)
    assert (out - after_h0).abs().max().item() < 1e-5
    with pytest.raises(lbcc.FailedPreconditionError):
        lbcc.SubspaceCodec(basis, coefficient_dtype="f32").decode_forward(payload, out)


def test_every_rank_computes_the_same_next_basis_without_basis_traffic():
    """Four ranks: ranks 0-2 hold the embedding (full replicas / stage 0), rank 3 is a later
    pipeline stage holding none. Each outer step changes the same few synced rows; rank 0 sends
    rank 3 the changed elements (embedding_update), and every rank shifts on its own. After three
    shifts every rank holds the same basis id (version + 3), table and embedding bits."""
    base = make_basis()
    shifts = 3

    def body(rank, comm):
        pair = comm.split(0 if rank in (0, 3) else -1, 0 if rank == 0 else 1)
        basis = base
        e = TinyModel(base).tok.detach().clone()  # the same initial bits everywhere
        project_(e, basis, "columns")
        shadow = e.clone()
        versions = []
        for step in range(shifts):
            if rank != 3:
                g = torch.Generator().manual_seed(100 + step)
                rows = torch.randint(0, V, (5,), generator=g)
                e[rows] -= 0.1 * torch.randn(5, D, generator=g)  # the synced outer update
            if rank == 0:
                pair.all_gather_bytes(embedding_update(shadow, e))
            elif rank == 3:
                apply_embedding_update_(e, pair.all_gather_bytes(b"")[0])
            basis = shift_embedding_(basis, e)
            shadow.copy_(e)
            versions.append(basis.version)
        digest = hashlib.sha256(e.numpy().tobytes() + basis.table.tobytes()).digest()
        ids = comm.all_gather_bytes(struct.pack("<QI", basis.hash, basis.version) + digest)
        lbcc.torch.check_basis(comm, basis)
        return versions, ids

    results = run_ranks(4, body)
    for versions, ids in results:
        assert versions == [base.version + 1 + i for i in range(shifts)]
        assert len(set(ids)) == 1


def test_embedding_update_round_trip_and_errors():
    before = torch.randn(7, 5)
    after = before.clone()
    after[2, 3] = 4.0
    after[6, 0] = -0.0 if before[6, 0] != 0 else 1.0
    blob = embedding_update(before, after)
    assert len(blob) == 4 + 8 * 2
    copy = before.clone()
    apply_embedding_update_(copy, blob)
    assert copy.numpy().tobytes() == after.numpy().tobytes()
    assert len(embedding_update(after, after)) == 4
    with pytest.raises(ValueError, match="truncated"):
        apply_embedding_update_(copy, b"\x01")
    with pytest.raises(ValueError, match="bytes for"):
        apply_embedding_update_(copy, blob[:-1])
    with pytest.raises(ValueError, match="outside"):
        apply_embedding_update_(torch.zeros(3), blob)
    with pytest.raises(ValueError, match="shapes differ"):
        embedding_update(before, after[:3])


def test_pseudo_gradient_projection():
    basis = make_basis()
    u = torch.from_numpy(basis.u).double()
    g = torch.Generator().manual_seed(4)
    outer = torch.randn(D, 50, generator=g)   # a residual write [d, n]: "rows"
    local = torch.randn(D, 50, generator=g)
    delta = (outer - local).double()
    project_pseudo_gradient_(local, outer, basis, "rows")
    assert torch.allclose((outer - local).double(), u @ (u.t() @ delta), atol=1e-5)
    # A bias [d]; and when outer is already in span(U) it equals projecting the weight.
    b_outer = project_(torch.randn(D, generator=g), basis, "rows")
    b_local = torch.randn(D, generator=g)
    expected = project_(b_local.clone(), basis, "rows")
    project_pseudo_gradient_(b_local, b_outer, basis, "rows")
    assert torch.allclose(b_local, expected, atol=1e-5)
    # Columns orientation ([n, d]).
    o, w = torch.randn(9, D, generator=g), torch.randn(9, D, generator=g)
    d0 = (o - w).double()
    project_pseudo_gradient_(w, o, basis, "columns")
    assert torch.allclose((o - w).double(), (d0 @ u) @ u.t(), atol=1e-5)
    with pytest.raises(ValueError, match="differ"):
        project_pseudo_gradient_(torch.zeros(D, 3), torch.zeros(D, 4), basis)
    with pytest.raises(ValueError, match="contiguous float32"):
        project_pseudo_gradient_(torch.zeros(D, 3, dtype=torch.float64), torch.zeros(D, 3), basis)
    with pytest.raises(lbcc.InvalidArgumentError):
        project_pseudo_gradient_(torch.zeros(5, 3), torch.zeros(5, 3), basis, "rows")
