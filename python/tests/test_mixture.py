"""Learned mixtures of subspaces for K/V (lbcc.torch.mixture) through the ring.

The projection's output must lie in the component it chose, and the subspace codec must pick
the same component, so K/V travel exactly (f32 coefficients: 1e-5; float rounding of the two
products only). Bases are versioned: a refresh between a forward and its backward leaves that
backward on the basis it encoded with; ranks on different versions fail on every rank.
"""

import numpy as np
import pytest
import torch

import lbcc
from conftest import run_ranks
from lbcc.torch.mixture import MixtureKV, MixtureProjection
from lbcc.torch.ring_attention import RingAttention, full_causal_attention

N, B, T, H, D = 4, 2, 8, 2, 8
DM, RANK, M, BLOCK = 12, 3, 4, 4


def test_output_lies_in_the_chosen_component_and_the_codec_agrees():
    proj = MixtureProjection(DM, H * D, RANK, M, BLOCK, seed=3)
    x = torch.randn(B, T, DM, generator=torch.Generator().manual_seed(1))
    y = proj(x).detach()
    sel = proj.selectors(x @ proj.a).flatten().tolist()
    assert len(set(sel)) > 1, "the test wants blocks on several components"
    codec = lbcc.SubspaceCodec(proj.basis(), coefficient_dtype="float32", mixture_block=BLOCK)
    payload, selectors = codec.encode_forward(y.reshape(B * T, H * D).contiguous())
    assert list(selectors[1]) == sel
    out = torch.empty(B * T, H * D)
    codec.decode_forward(payload, out)
    torch.testing.assert_close(out, y.reshape(B * T, H * D), atol=1e-5, rtol=1e-5)
    # k = 3 f32 coefficients per token instead of d = 16 f32 values (plus selectors and the
    # payload's 76-byte envelope).
    assert len(payload) < 0.3 * (B * T * H * D * 4)


def test_refresh_keeps_components_orthonormal_and_moves_the_version():
    proj = MixtureProjection(DM, H * D, RANK, M, BLOCK, seed=4)
    first = proj.basis()
    with torch.no_grad():
        proj.u.add_(0.05 * torch.randn_like(proj.u))
    second = proj.refresh_basis_()
    assert (second.version, first.version) == (1, 0)
    assert second.hash != first.hash
    u = torch.from_numpy(np.array(second.u))
    for m in range(M):
        um = u[:, m * RANK:(m + 1) * RANK].double()
        torch.testing.assert_close(um.T @ um, torch.eye(RANK, dtype=torch.float64), atol=1e-5,
                                   rtol=0)
    # Identical weights give identical bits (every replica reaches the same basis id).
    torch.manual_seed(0)
    a = MixtureProjection(DM, H * D, RANK, M, BLOCK, seed=6)
    b = MixtureProjection(DM, H * D, RANK, M, BLOCK, seed=6)
    step = 0.05 * torch.randn(a.u.shape, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        a.u.add_(step)
        b.u.add_(step)
    assert a.refresh_basis_().hash == b.refresh_basis_().hash


def layer(seed=0):
    # Explicit generators: ranks are threads, and torch's global generator is shared.
    kv = MixtureKV(DM, H * D, RANK, M, BLOCK, seed=seed)
    wq = torch.nn.Linear(DM, H * D)
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        wq.weight.copy_(torch.randn(H * D, DM, generator=g) / DM ** 0.5)
        wq.bias.copy_(0.1 * torch.randn(H * D, generator=g))
    return kv, wq


def test_ring_attention_on_learned_mixtures_matches_full_attention():
    x = torch.randn(B, N * T, DM, generator=torch.Generator().manual_seed(2))
    w = torch.randn(B, N * T, H, D, generator=torch.Generator().manual_seed(3))
    kv, wq = layer()
    k, v = kv(x)
    q = wq(x)
    out = full_causal_attention(q.reshape(B, N * T, H, D), k.reshape(B, N * T, H, D),
                                v.reshape(B, N * T, H, D))
    (out * w).sum().backward()
    want_out = out.detach()
    want = {"a_k": kv.k.a.grad, "a_v": kv.v.a.grad, "wq": wq.weight.grad}

    def body(rank, comm):
        kv, wq = layer()
        xs = x[:, rank * T:(rank + 1) * T]
        k, v = kv(xs)
        q = wq(xs)
        ring = RingAttention(comm, coefficient_dtype="float32", mixture_block=BLOCK)
        o = ring(q.reshape(B, T, H, D), k.reshape(B, T, H, D), v.reshape(B, T, H, D),
                 codec=kv.codecs())
        (o * w[:, rank * T:(rank + 1) * T]).sum().backward()
        grads = {"a_k": kv.k.a.grad, "a_v": kv.v.a.grad, "wq": wq.weight.grad}
        for g in grads.values():
            comm.all_reduce(g, op="sum")
        assert kv.k.u.grad is not None and kv.k.u.grad.abs().sum() > 0
        return o.detach(), grads

    results = run_ranks(N, body)
    got_out = torch.cat([r[0] for r in results], dim=1)
    torch.testing.assert_close(got_out, want_out, atol=1e-5, rtol=1e-4)
    # The coefficient maps' gradients only need U^T dK, which is what the ring carries: exact.
    for name in want:
        torch.testing.assert_close(results[0][1][name], want[name], atol=1e-4, rtol=1e-4,
                                   msg=name)


def test_refresh_between_forward_and_backward_and_version_mismatch():
    x = torch.randn(B, N * T, DM, generator=torch.Generator().manual_seed(5))

    def body(rank, comm):
        kv, wq = layer(1)
        xs = x[:, rank * T:(rank + 1) * T]
        ring = RingAttention(comm, coefficient_dtype="bf16", mixture_block=BLOCK)

        def step():
            k, v = kv(xs)
            return ring(wq(xs).reshape(B, T, H, D), k.reshape(B, T, H, D),
                        v.reshape(B, T, H, D), codec=kv.codecs())

        o = step()
        kv.refresh_basis_()  # version 1 on every rank, before the version-0 forward's backward
        o.square().sum().backward()
        assert kv.codecs()[0].version == 1
        step().sum().backward()  # a whole step on version 1
        if rank == 2:
            kv.refresh_basis_()  # rank 2 alone moves on: every rank's next pass fails
        with pytest.raises(lbcc.errors.FailedPreconditionError, match="codec"):
            step()
        return True

    assert run_ranks(N, body) == [True] * N
