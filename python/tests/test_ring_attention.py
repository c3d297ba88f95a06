"""Ring attention (lbcc.torch.RingAttention) against full attention on the whole sequence.

Ranks are threads over loopback (conftest.run_ranks); rank i holds chunk i of the sequence.
The reference is one autograd graph of full causal attention on the concatenated sequence with
the same K/V as the ring delivers them (raw: the originals; bf16: rounded to bf16; subspace:
K/V built inside the basis' components, which the codec carries exactly up to f32 rounding).
Tolerances: 1e-5 absolute for float32 paths that only reorder sums (online softmax vs one
softmax over 24 keys); the bf16 backward rounds each partial gradient sum to 8 bits of mantissa
per hop (relative 2^-8 per hop, 3 hops), hence 3e-2 relative there.
"""

import numpy as np
import pytest
import torch
from torch import nn

import lbcc
from conftest import run_ranks
from lbcc.torch.ring_attention import RingAttention, full_causal_attention

N, B, T, H, D = 4, 2, 6, 2, 4


def make_qkv(seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, N * T, H, D, generator=g, dtype=dtype) for _ in range(3)]


def chunk(x, rank):
    return x[:, rank * T:(rank + 1) * T]


def reference(q, k, v, w, causal=True):
    q, k, v = (x.clone().requires_grad_(True) for x in (q, k, v))
    out = full_causal_attention(q, k, v, causal=causal)
    (out * w).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


def ring_run(q, k, v, w, codec="raw", causal=True, **kwargs):
    def body(rank, comm):
        qc, kc, vc = (chunk(x, rank).clone().requires_grad_(True) for x in (q, k, v))
        out = RingAttention(comm, codec=codec, causal=causal, **kwargs)(qc, kc, vc)
        (out * chunk(w, rank)).sum().backward()
        return out.detach(), qc.grad, kc.grad, vc.grad

    results = run_ranks(N, body)
    return [torch.cat([r[i] for r in results], dim=1) for i in range(4)]


@pytest.mark.parametrize("causal", [True, False])
def test_raw_ring_matches_full_attention(causal):
    q, k, v = make_qkv(1)
    w = torch.randn(B, N * T, H, D, generator=torch.Generator().manual_seed(2))
    want = reference(q, k, v, w, causal)
    got = ring_run(q, k, v, w, "raw", causal)
    for name, a, b in zip(["out", "dq", "dk", "dv"], got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=name)


def test_dense_bf16_ring_is_exact_on_bf16_kv():
    q, k, v = make_qkv(3)
    w = torch.randn(B, N * T, H, D, generator=torch.Generator().manual_seed(4))
    kr, vr = (x.to(torch.bfloat16).to(torch.float32) for x in (k, v))
    want = reference(q, kr, vr, w)
    got = ring_run(q, k, v, w, "bf16")
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)  # out
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)  # dq: local only
    for a, b in zip(got[2:], want[2:]):  # dk, dv: partial sums rounded to bf16 per hop
        torch.testing.assert_close(a, b, atol=3e-2, rtol=3e-2)


def test_subspace_mixture_ring_is_exact_on_constrained_kv():
    # Every rank's K/V tokens lie in one component of a 3-component mixture (rank % 3), so the
    # codec picks it and carries K/V exactly (f32 coefficients).
    k_dim = 3
    basis = lbcc.SubspaceBasis.from_seed(model_dim=H * D, rank=k_dim, components=3, seed=9)
    u = torch.from_numpy(np.array(basis.u, dtype=np.float32))  # [d, M*k]
    g = torch.Generator().manual_seed(5)
    q = torch.randn(B, N * T, H, D, generator=g)
    k = torch.empty(B, N * T, H, D)
    v = torch.empty(B, N * T, H, D)
    for rank in range(N):
        uc = u[:, (rank % 3) * k_dim:(rank % 3 + 1) * k_dim]  # [d, k]
        for x in (k, v):
            coef = 2 * torch.randn(B, T, k_dim, generator=g)
            x[:, rank * T:(rank + 1) * T] = (coef @ uc.T).reshape(B, T, H, D)
    w = torch.randn(B, N * T, H, D, generator=g)
    want = reference(q, k, v, w)
    got = ring_run(q, k, v, w, basis, coefficient_dtype="float32", mixture_block=T)
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-4)
    # dK, dV as the reparameterized projections see them: projected onto the block's component.
    for a, b in zip(got[2:], want[2:]):
        for rank in range(N):
            uc = u[:, (rank % 3) * k_dim:(rank % 3 + 1) * k_dim]
            pa = chunk(a, rank).reshape(B, T, H * D) @ uc
            pb = chunk(b, rank).reshape(B, T, H * D) @ uc
            torch.testing.assert_close(pa, pb, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck_float64_single_rank(causal):
    # One rank: no link, so the blockwise online softmax and its hand-written backward run
    # entirely in float64 and gradcheck checks them against finite differences.
    def body(rank, comm):
        g = torch.Generator().manual_seed(6)
        q, k, v = (torch.randn(1, 5, 2, 3, generator=g, dtype=torch.float64,
                               requires_grad=True) for _ in range(3))
        attn = RingAttention(comm, codec="raw", causal=causal)
        return torch.autograd.gradcheck(lambda a, b, c: attn(a, b, c), (q, k, v),
                                        eps=1e-6, atol=1e-6)

    assert run_ranks(1, body) == [True]


class TinyLayer(nn.Module):
    """Projections + attention + output projection: the model-level use."""

    def __init__(self, attention):
        super().__init__()
        self.qkv = nn.Linear(H * D, 3 * H * D)
        self.out = nn.Linear(H * D, H * D)
        self.attention = attention
        # Explicit generator: ranks are threads, and torch's global generator is shared.
        g = torch.Generator().manual_seed(8)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) / H)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, H, D).unbind(dim=2)
        return self.out(self.attention(q, k, v).reshape(b, t, H * D))


def test_module_in_a_model_gives_the_full_models_gradients():
    x = torch.randn(B, N * T, H * D, generator=torch.Generator().manual_seed(7))
    ref = TinyLayer(lambda q, k, v: full_causal_attention(q, k, v))
    ref(x).square().mean().mul(N).backward()
    want = {n: p.grad.clone() for n, p in ref.named_parameters()}

    def body(rank, comm):
        model = TinyLayer(RingAttention(comm, codec="raw"))
        model(chunk(x, rank)).square().mean().backward()
        grads = {}
        for n, p in model.named_parameters():  # data-parallel style sum over the chunks
            comm.all_reduce(p.grad, op="sum")
            grads[n] = p.grad
        return grads

    for grads in run_ranks(N, body):
        for n, g in grads.items():
            torch.testing.assert_close(g, want[n], atol=1e-5, rtol=1e-4, msg=n)


def test_mismatched_codecs_fail_on_every_rank():
    q, k, v = make_qkv(10)

    def body(rank, comm):
        attn = RingAttention(comm, codec="bf16" if rank == 1 else "raw")
        with pytest.raises(lbcc.errors.FailedPreconditionError, match="codec"):
            attn(chunk(q, rank), chunk(k, rank), chunk(v, rank))
        return True

    assert run_ranks(N, body) == [True] * N


def test_bad_shapes_are_value_errors():
    def body(rank, comm):
        attn = RingAttention(comm)
        with pytest.raises(ValueError, match=r"\[B, T, H, D\]"):
            attn(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))
        return True

    assert run_ranks(2, body) == [True, True]
