"""The pipeline boundary (lbcc.torch.PipelineBoundary) against plain autograd.

Two stages run as two ranks (threads, loopback transport); the reference is the same model in
one autograd graph. Tolerance: atol 1e-6 + rtol 1e-4 with fp32 coefficients. The boundary
rebuilds h = U (U^T (h - T[y])) + T[y] and U (U^T g): equal in exact arithmetic for a
subspace-constrained model, so only float32 rounding of the two products (sums over d = 32 and
k = 8 terms, ~1e-7 relative each) separates them, carried through two more layers; rtol 1e-4
leaves room for that and fails on any real leak (dropping the out-of-subspace part of an
unconstrained model changes gradients by >1e-2, see test_unconstrained_model_is_not_exact).
"""

import copy

import pytest
import torch
from torch import nn

import lbcc
from conftest import run_ranks
from lbcc.torch import (PipelineBoundary, SubspaceConstraint, SubspaceEmbedding,
                        SubspaceLinear, project_, sync_basis)

V, D, K, HIDDEN = 40, 32, 8, 48
BATCH, SEQ = 4, 6
TOKENS = BATCH * SEQ
ATOL, RTOL = 1e-6, 1e-4


def make_basis(version=0):
    return lbcc.SubspaceBasis.from_seed(model_dim=D, rank=K, vocab_size=V, with_table=True,
                                        table_stddev=0.5, seed=5, version=version)


class Stage0(nn.Module):
    """Embedding and one residual block whose write is in span(U)."""

    def __init__(self, basis, exact, constrained=True):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.embedding = SubspaceEmbedding(basis, low_rank=exact, init_std=0.5, generator=g)
        self.w_in = nn.Linear(D, HIDDEN)
        self.w_o = SubspaceLinear(HIDDEN, basis) if exact else nn.Linear(HIDDEN, D)
        if not exact and constrained:
            project_(self.w_o.weight, basis)
            project_(self.w_o.bias, basis)

    def forward(self, ids):
        h0 = self.embedding(ids)
        return h0 + self.w_o(torch.nn.functional.gelu(self.w_in(h0)))


class Stage1(nn.Module):
    """A full-rank block after the boundary, and the head."""

    def __init__(self):
        super().__init__()
        self.w_in = nn.Linear(D, HIDDEN)
        self.w_o = nn.Linear(HIDDEN, D)
        self.head = nn.Linear(D, V)

    def forward(self, h, targets):
        h = h + self.w_o(torch.tanh(self.w_in(h)))
        return nn.functional.cross_entropy(self.head(h), targets.reshape(-1))


def data(step=0):
    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, V, (BATCH, SEQ), generator=g)
    targets = torch.randint(0, V, (BATCH, SEQ), generator=g)
    return ids, targets


def reference(stage0, stage1, ids, targets):
    s0, s1 = copy.deepcopy(stage0), copy.deepcopy(stage1)
    h = s0(ids)
    loss = s1(h.reshape(TOKENS, D), targets)
    loss.backward()
    return s0, s1, loss.detach()


def pipeline(stage0, stage1, ids, targets, coefficient_dtype="f32"):
    """Runs the two stages on two ranks; returns (stage0, stage1, loss, received ids, bytes)."""
    basis = stage0.embedding_basis

    def body(rank, comm):
        boundary = PipelineBoundary(comm, 1 - rank, basis, coefficient_dtype=coefficient_dtype,
                                    timeout=30)
        if rank == 0:
            s0 = copy.deepcopy(stage0)
            before = comm.link_counters(1)["bytes_sent"]
            handle = boundary.send(s0(ids), ids)
            handle.backward()
            boundary.synchronize()
            sent = comm.link_counters(1)["bytes_sent"] - before
            return s0, sent
        s1 = copy.deepcopy(stage1)
        h, got_ids = boundary.recv(TOKENS)
        loss = s1(h, targets)
        loss.backward()
        boundary.synchronize()
        return s1, loss.detach(), got_ids, boundary.codec.forward_payload_bytes(TOKENS)

    (s0, sent), (s1, loss, got_ids, expected_bytes) = run_ranks(2, body)
    return s0, s1, loss, got_ids, sent, expected_bytes


def build(exact, constrained=True):
    basis = make_basis()
    stage0 = Stage0(basis, exact, constrained)
    stage0.embedding_basis = basis
    torch.manual_seed(4)
    return stage0, Stage1()


def grads(module):
    return {n: p.grad.clone() for n, p in module.named_parameters()}


def projected(basis, name, grad):
    """The gradient's component the constraint keeps (for constrained dense parameters)."""
    u = torch.from_numpy(basis.u)
    if name.startswith("w_o.weight") or name.startswith("w_o.bias"):
        return u @ (u.t() @ grad.reshape(D, -1))
    if name == "embedding.weight":
        return (grad @ u) @ u.t()
    return grad


def assert_grads_close(actual, expected, basis=None):
    assert actual.keys() == expected.keys()
    for name in expected:
        a, e = actual[name], expected[name]
        if basis is not None:
            a, e = projected(basis, name, a), projected(basis, name, e)
        torch.testing.assert_close(a, e, atol=ATOL, rtol=RTOL, msg=lambda m: f"{name}: {m}")


def test_reparameterised_model_gradients_equal_autograd():
    stage0, stage1 = build(exact=True)
    ids, targets = data()
    r0, r1, ref_loss = reference(stage0, stage1, ids, targets)
    p0, p1, loss, got_ids, sent, expected_bytes = pipeline(stage0, stage1, ids, targets)
    torch.testing.assert_close(loss, ref_loss, atol=ATOL, rtol=RTOL)
    assert torch.equal(got_ids, ids.reshape(-1).to(torch.int32))
    assert_grads_close(grads(p0), grads(r0))
    assert_grads_close(grads(p1), grads(r1))
    # What crossed the link: one forward payload of k fp32 coefficients + a 1-byte id per token.
    assert sent == expected_bytes == 76 + TOKENS * (1 + 4 * K)


def test_dense_projected_model_gradients_equal_autograd_on_the_constraint():
    stage0, stage1 = build(exact=False)
    ids, targets = data()
    r0, r1, ref_loss = reference(stage0, stage1, ids, targets)
    p0, p1, loss, _, _, _ = pipeline(stage0, stage1, ids, targets)
    torch.testing.assert_close(loss, ref_loss, atol=ATOL, rtol=RTOL)
    assert_grads_close(grads(p1), grads(r1))
    # Unconstrained parameters: equal gradients; constrained ones (W_o, b_o, E): equal
    # components inside the constraint, which is all an optimizer step followed by the
    # projection keeps.
    assert_grads_close(grads(p0), grads(r0), basis=stage0.embedding_basis)
    for name in ("w_in.weight", "w_in.bias"):
        torch.testing.assert_close(grads(p0)[name], grads(r0)[name], atol=ATOL, rtol=RTOL)


def test_unconstrained_model_is_not_exact():
    """Control: without the constraint the boundary drops information, and the test sees it."""
    stage0, stage1 = build(exact=False, constrained=False)
    ids, targets = data()
    _, r1, ref_loss = reference(stage0, stage1, ids, targets)
    _, p1, loss, _, _, _ = pipeline(stage0, stage1, ids, targets)
    assert not torch.allclose(grads(p1)["head.weight"], grads(r1)["head.weight"],
                              atol=ATOL, rtol=1e-2)


def test_bf16_coefficients_are_close_and_smaller():
    stage0, stage1 = build(exact=True)
    ids, targets = data()
    r0, _, ref_loss = reference(stage0, stage1, ids, targets)
    p0, _, loss, _, sent, _ = pipeline(stage0, stage1, ids, targets, coefficient_dtype="bf16")
    torch.testing.assert_close(loss, ref_loss, atol=1e-3, rtol=1e-2)
    for name, g in grads(r0).items():
        torch.testing.assert_close(grads(p0)[name], g, atol=1e-3, rtol=5e-2)
    assert sent == 76 + TOKENS * (1 + 2 * K)


class ProjectBackward(torch.autograd.Function):
    """Identity forward, g -> U U^T g backward: the boundary's operator in plain PyTorch."""

    @staticmethod
    def forward(ctx, h, u):
        ctx.save_for_backward(u)
        return h.clone()

    @staticmethod
    def backward(ctx, g):
        (u,) = ctx.saved_tensors
        return (g @ u) @ u.t(), None


def test_training_with_constraint_and_basis_sync_tracks_the_reference():
    """Three SGD steps of the dense model; after each, the constraint re-projects W_o, shifts
    the embedding into a new basis version on stage 0, and sync_basis() ships it to stage 1.

    The reference is one autograd graph with the boundary's operator written in PyTorch
    (ProjectBackward), not plain autograd: the dense embedding's gradient differs from plain
    autograd outside span(U) (the boundary carries U U^T g), and the embedding shift keeps that
    part (it moves E's out-of-subspace part into T), so training differs from plain autograd by
    design; the step-0 tests above compare with plain autograd where the two must agree."""
    stage0, stage1 = build(exact=False)
    basis = stage0.embedding_basis
    steps = 3

    ref0, ref1 = copy.deepcopy(stage0), copy.deepcopy(stage1)
    ref_constraint = SubspaceConstraint(basis, writes=[ref0.w_o], embedding=ref0.embedding)
    ref_opt = torch.optim.SGD(list(ref0.parameters()) + list(ref1.parameters()), lr=0.5)
    ref_losses = []
    u = torch.from_numpy(basis.u)
    for step in range(steps):
        ids, targets = data(step)
        ref_opt.zero_grad()
        loss = ref1(ProjectBackward.apply(ref0(ids).reshape(TOKENS, D), u), targets)
        loss.backward()
        ref_opt.step()
        ref_constraint.apply()
        ref_losses.append(loss.item())

    def body(rank, comm):
        b = basis
        boundary = PipelineBoundary(comm, 1 - rank, b, timeout=30)
        if rank == 0:
            s = copy.deepcopy(stage0)
            constraint = SubspaceConstraint(b, writes=[s.w_o], embedding=s.embedding)
        else:
            s = copy.deepcopy(stage1)
        opt = torch.optim.SGD(s.parameters(), lr=0.5)
        losses, versions = [], []
        for step in range(steps):
            ids, targets = data(step)
            opt.zero_grad()
            if rank == 0:
                boundary.send(s(ids), ids).backward()
            else:
                h, _ = boundary.recv(TOKENS)
                loss = s(h, targets)
                loss.backward()
                losses.append(loss.item())
            boundary.synchronize()
            opt.step()
            b = sync_basis(comm, constraint.apply() if rank == 0 else None, root=0)
            boundary.update_basis(b)
            versions.append(b.version)
        return s, losses, versions, b

    (s0, _, v0, b0), (s1, losses, v1, b1) = run_ranks(2, body)
    assert v0 == v1 == [1, 2, 3]
    assert b0 == b1
    for a, e in zip(losses, ref_losses):
        assert a == pytest.approx(e, rel=1e-5, abs=1e-6)
    for (name, a), e in zip(s0.named_parameters(), ref0.parameters()):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")
    for (name, a), e in zip(s1.named_parameters(), ref1.parameters()):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")
    torch.testing.assert_close(torch.from_numpy(b0.table), ref0.embedding.table,
                               atol=1e-5, rtol=1e-4)


def test_backward_after_a_basis_change_uses_the_previous_basis():
    """1F1B: the basis changes between a microbatch's forward and its backward."""
    stage0, stage1 = build(exact=True)
    ids, targets = data()
    r0, _, _ = reference(stage0, stage1, ids, targets)
    old = stage0.embedding_basis
    new = old.with_table(old.table * 1.5, old.version + 1)

    def body(rank, comm):
        boundary = PipelineBoundary(comm, 1 - rank, old, timeout=30)
        if rank == 0:
            s = copy.deepcopy(stage0)
            handle = boundary.send(s(ids), ids)
            boundary.update_basis(new)
            handle.backward()
            boundary.synchronize()
            return s
        s = copy.deepcopy(stage1)
        h, _ = boundary.recv(TOKENS)
        boundary.update_basis(new)
        s(h, targets).backward()
        boundary.synchronize()
        return None

    s0, _ = run_ranks(2, body)
    assert_grads_close(grads(s0), grads(r0))


def test_unknown_basis_is_failed_precondition():
    stage0, _ = build(exact=True)
    ids, _ = data()
    old = stage0.embedding_basis
    new = old.with_table(old.table * 1.5, old.version + 1)

    def body(rank, comm):
        if rank == 0:
            boundary = PipelineBoundary(comm, 1, new, timeout=30)
            with torch.no_grad():
                boundary.send(copy.deepcopy(stage0)(ids), ids)
            boundary.synchronize()
            return None
        boundary = PipelineBoundary(comm, 0, old, timeout=30)
        with pytest.raises(lbcc.FailedPreconditionError) as e:
            boundary.recv(TOKENS)
        return e.value.code, e.value.message

    _, (code, message) = run_ranks(2, body)
    assert code == "FAILED_PRECONDITION"
    assert f"{new.hash:016x}/v1" in message


def test_check_basis_detects_different_bases():
    def body(rank, comm):
        basis = make_basis(version=rank)
        with pytest.raises(lbcc.FailedPreconditionError):
            lbcc.torch.check_basis(comm, basis)
        lbcc.torch.check_basis(comm, make_basis())  # Same everywhere: no error.
        return True

    assert run_ranks(3, body) == [True] * 3


def test_recv_subspace_returns_the_payload_the_codec_makes():
    """The toy boundary of pipeline_payloads.py (what //tests:activations_wire_test compares
    the C API with): every payload received equals what lbcc.SubspaceCodec encodes from the
    same inputs, and the backward sent after the basis change still names the old basis."""
    import pipeline_payloads as pp

    v0, v1 = pp.bases()
    forwards, backwards = pp.capture("forward"), pp.capture("backward")
    assert sorted(forwards) == sorted(backwards) == list(range(pp.MICROBATCHES))
    for mb in range(pp.MICROBATCHES):
        basis = pp.forward_basis(mb, v0, v1)
        codec = lbcc.SubspaceCodec(basis, coefficient_dtype=pp.COEFFICIENTS)
        payload, _ = codec.encode_forward(pp.stage0_output(basis, mb).detach(), pp.ids_of(mb))
        assert forwards[mb] == payload
        h = torch.empty(pp.TOKENS, pp.D)
        codec.decode_forward(payload, h)
        assert backwards[mb] == codec.encode_backward(h - pp.target(mb))
        assert lbcc.inspect_subspace(backwards[mb])["basis_version"] == basis.version


def changed(table, fraction, seed):
    """A copy of `table` with about `fraction` of its elements moved (a sparse outer step)."""
    g = torch.Generator().manual_seed(seed)
    out = table.clone()
    mask = torch.rand(out.shape, generator=g) < fraction
    out[mask] += torch.randn(int(mask.sum()), generator=g) * 0.1
    return out


@pytest.mark.parametrize("mode", ["lossy", "constrained"])
def test_sync_table_gives_both_stages_one_table_and_one_basis(mode):
    """The stage holding the synced embedding sends what changed; the other rebuilds the same
    table, and both compute the same next basis (version + 1) from it, for far fewer bytes than
    the dense V x d table."""
    g = torch.Generator().manual_seed(11)
    e0 = torch.randn(V, D, generator=g)
    basis = lbcc.SubspaceBasis.from_seed(model_dim=D, rank=K, vocab_size=V, with_table=True,
                                         table_stddev=0.5, seed=5)
    e1 = changed(e0, 0.03, 12)

    def body(rank, comm):
        boundary = PipelineBoundary(comm, 1 - rank, basis, mode=mode, table=e0, timeout=30)
        if rank == 0:
            mine = e1.clone()
            nxt = boundary.sync_table(mine)
            return nxt, mine, boundary.table.clone(), boundary.table_bytes_sent
        nxt = boundary.sync_table()
        return nxt, None, boundary.table.clone(), boundary.table_bytes_received

    (b0, e_after, t0, sent), (b1, _, t1, received) = run_ranks(2, body)
    assert (b0.hash, b0.version) == (b1.hash, b1.version)
    assert b0.version == basis.version + 1
    assert torch.equal(t0.view(torch.int32), t1.view(torch.int32))
    assert sent == received and 0 < sent < V * D * 4 / 5
    table = torch.from_numpy(b0.table)
    if mode == "lossy":
        assert torch.equal(e_after, e1)  # the embedding itself is untouched
        assert torch.equal(table, e1)    # T is the synced embedding
    else:
        u = torch.from_numpy(b0.u)
        torch.testing.assert_close(e_after @ u @ u.t(), e_after, atol=1e-5, rtol=1e-5)
        # T + E is unchanged by the shift.
        torch.testing.assert_close(table + e_after, torch.from_numpy(basis.table) + e1,
                                   atol=1e-5, rtol=1e-5)
        assert torch.equal(t0, e_after)


def test_lossy_boundary_keeps_the_subspace_part_of_what_the_stage_added():
    """Lossy design, an unconstrained stage: the receiver gets E[y] + U U^T (h - E[y]), and the
    sender's activations get the gradient projected, U U^T g."""
    g = torch.Generator().manual_seed(21)
    e = torch.randn(V, D, generator=g)
    basis = lbcc.SubspaceBasis.from_seed(model_dim=D, rank=K, vocab_size=V, seed=5)
    ids, _ = data()
    h = torch.randn(TOKENS, D, generator=g)
    upstream = torch.randn(TOKENS, D, generator=g)

    def body(rank, comm):
        boundary = PipelineBoundary(comm, 1 - rank, basis, mode="lossy", table=e, timeout=30)
        nxt = boundary.refresh_table()
        if rank == 0:
            x = h.clone().requires_grad_(True)
            boundary.send(x, ids).backward()
            boundary.synchronize()
            return nxt, x.grad
        got, _ = boundary.recv(TOKENS)
        (got * upstream).sum().backward()
        boundary.synchronize()
        return nxt, got.detach()

    (b, grad), (_, got) = run_ranks(2, body)
    u = torch.from_numpy(b.u)
    base = e[ids.reshape(-1)]
    torch.testing.assert_close(got, base + (h - base) @ u @ u.t(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad, upstream @ u @ u.t(), atol=1e-5, rtol=1e-5)
    # Lossy: what lies outside span(U) is gone.
    assert float((got - h).norm()) > 0.1 * float(h.norm())


def test_boundary_mode_and_table_are_checked():
    basis = make_basis()

    def body(rank, comm):
        with pytest.raises(ValueError, match="mode"):
            PipelineBoundary(comm, 1 - rank, basis, mode="exact")
        with pytest.raises(ValueError, match="table"):
            PipelineBoundary(comm, 1 - rank, basis, table=torch.zeros(V + 1, D))
        with pytest.raises(ValueError, match="no table"):
            PipelineBoundary(comm, 1 - rank, basis).sync_table()
        with pytest.raises(ValueError, match="no embedding"):
            PipelineBoundary(comm, 1 - rank, basis).refresh_table()
        with pytest.raises(ValueError, match="tag"):
            PipelineBoundary(comm, 1 - rank, basis, tag=1 << 30)
        return True

    assert run_ranks(2, body) == [True, True]


def test_refresh_table_takes_an_embedding_in_another_dtype():
    """A bf16 (or GPU) embedding is refreshed through a host float32 copy: lossy T is its
    float32 value; constrained shifts the caller's tensor itself."""
    basis = lbcc.SubspaceBasis.from_seed(model_dim=D, rank=K, vocab_size=V, with_table=True,
                                         table_stddev=0.5, seed=5)
    e = torch.randn(V, D, generator=torch.Generator().manual_seed(31)).to(torch.bfloat16)

    def body(rank, comm):
        lossy = PipelineBoundary(comm, 1 - rank, basis, mode="lossy").refresh_table(e)
        mine = e.clone()
        constrained = PipelineBoundary(comm, 1 - rank, basis, mode="constrained",
                                       tag=1).refresh_table(mine)
        return lossy, constrained, mine

    (lossy, constrained, shifted), _ = run_ranks(2, body)
    assert torch.equal(torch.from_numpy(lossy.table), e.to(torch.float32))
    assert constrained.version == basis.version + 1
    u = torch.from_numpy(basis.u)
    s = shifted.to(torch.float32)
    torch.testing.assert_close(s @ u @ u.t(), s, atol=2e-2, rtol=2e-2)  # bf16 rounding
    assert not torch.equal(shifted, e)
