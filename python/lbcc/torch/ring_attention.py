"""Ring attention over LBCC's context-parallel ring (comm/context_ring.h, lbcc.ContextRing).

Each rank of a communicator holds one chunk of a long sequence: rank i holds positions
[i T, (i + 1) T). Attention runs block by block with the online softmax (FlashAttention's
running max m, normaliser l and weighted sum): first the rank's own K/V block, then the block
of rank i - r in round r = 1 .. n-1 as the ring hands it out (the ring's worker has already
relayed it to the next rank, so the link carries block r+1 while this rank computes on block
r). Causal attention needs only the blocks of ranks j <= i; later blocks still pass through
(every rank relays every block).

Backward (FlashAttention's recomputation from the saved log-sum-exp): dQ from every block this
rank attended to, and this rank's dK_j, dV_j for every block j, which travel back to j's owner
as partial sums through the ring's backward pass (round r: block i + r). The gradient for the
rank's own k and v is its own contribution plus the others' sum.

Codecs ("raw", "bf16", "fp16", or an lbcc.SubspaceBasis): the forward uses the K/V blocks as
they travel (K~ = decode(encode(K)); for the own block too, so every rank uses the same bits),
i.e. attention is exact against full attention on the constrained K~/V~ up to float rounding.
Gradients arriving from other ranks pass the backward codec (bf16 rounding, or with a subspace
basis the projection onto the components the block's forward used); the rank's own
contribution is not projected. With K/V inside the basis' span (a reparameterized W_k, W_v:
lbcc.torch.mixture) both agree.

Memory: the received K/V blocks of a forward are kept for its backward (n-1 blocks per rank).
Every rank must run the same sequence of ring attentions (forwards and backwards) in the same
order, as with every collective.
"""

import math

import torch
from torch import nn

import lbcc

__all__ = ["RingAttention", "ring_attention", "full_causal_attention"]


def _f32(t):
    return t.detach().to(torch.float32).contiguous()


class _State:
    """Online-softmax accumulators for [B, H, T] rows."""

    def __init__(self, q):
        b, h, t, d = q.shape
        self.m = torch.full((b, h, t), -math.inf, dtype=q.dtype)
        self.l = torch.zeros((b, h, t), dtype=q.dtype)
        self.acc = torch.zeros((b, h, t, d), dtype=q.dtype)

    def update(self, s, v):
        # s: scores [B, H, T, Tk] (masked entries -inf), v: [B, H, Tk, D].
        m_new = torch.maximum(self.m, s.amax(dim=-1))
        alpha = torch.exp(self.m - m_new)
        alpha = torch.where(torch.isfinite(self.m), alpha, torch.zeros_like(alpha))
        p = torch.exp(s - m_new.unsqueeze(-1))
        self.l = self.l * alpha + p.sum(dim=-1)
        self.acc = self.acc * alpha.unsqueeze(-1) + p @ v
        self.m = m_new


def _heads(x, b, t, h, d):
    # [B*T, H*D] (ring layout) or [B, T, H, D] -> [B, H, T, D]
    return x.reshape(b, t, h, d).permute(0, 2, 1, 3)


def _flat(x):
    # [B, H, T, D] -> [B*T, H*D] contiguous float32 (the ring's layout)
    b, h, t, d = x.shape
    return x.permute(0, 2, 1, 3).reshape(b * t, h * d).to(torch.float32).contiguous()


class _RingAttentionFn(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, module, codecs):
        comm = module.comm
        b, t, h, d = q.shape
        n, me = comm.nranks, comm.rank
        # One ring per forward: it keeps the bases (and the mixture selectors) this forward
        # encoded with for its backward, whatever the module's codecs are by then.
        ring = lbcc.ContextRing(comm, list(codecs), tokens=b * t, dim=h * d,
                                coefficient_dtype=module.coefficient_dtype,
                                mixture_block=module.mixture_block, timeout=module.timeout)
        kf, vf = _f32(k.reshape(b * t, h * d)), _f32(v.reshape(b * t, h * d))
        exact_own = all(isinstance(c, str) and c == "raw" for c in codecs)
        k_own = torch.empty_like(kf)
        v_own = torch.empty_like(vf)
        ring.begin_forward([kf, vf], None if exact_own else [k_own, v_own])
        qh = q.detach().permute(0, 2, 1, 3)  # [B, H, T, D]
        dtype = q.dtype
        if exact_own:  # the block as sent: the original values (float64 stays float64)
            kh, vh = k.detach().permute(0, 2, 1, 3), v.detach().permute(0, 2, 1, 3)
        else:
            kh, vh = _heads(k_own, b, t, h, d).to(dtype), _heads(v_own, b, t, h, d).to(dtype)
        scale = 1.0 / math.sqrt(d)
        state = _State(qh)
        causal = module.causal
        mask = torch.ones(t, t, dtype=torch.bool).tril() if causal else None
        blocks = {me: (kh, vh)}

        def attend(src, kb, vb):
            if causal and src > me:
                return
            s = (qh @ kb.transpose(-1, -2)) * scale
            if causal and src == me:
                s = s.masked_fill(~mask, -math.inf)
            state.update(s, vb)

        attend(me, kh, vh)
        for _ in range(ring.rounds):
            kb = torch.empty_like(kf)
            vb = torch.empty_like(vf)
            src = ring.next_forward([kb, vb])
            kb, vb = _heads(kb, b, t, h, d).to(dtype), _heads(vb, b, t, h, d).to(dtype)
            blocks[src] = (kb, vb)
            attend(src, kb, vb)
        ring.end_forward()
        o = state.acc / state.l.unsqueeze(-1)
        lse = state.m + torch.log(state.l)
        ctx.ring = ring
        ctx.blocks = blocks
        ctx.module = module
        ctx.shape = (b, t, h, d)
        ctx.save_for_backward(qh, o, lse)
        return o.permute(0, 2, 1, 3).contiguous()

    @staticmethod
    def backward(ctx, grad_out):
        qh, o, lse = ctx.saved_tensors
        ring, blocks, module = ctx.ring, ctx.blocks, ctx.module
        b, t, h, d = ctx.shape
        n, me = ring.nranks, ring.rank
        causal = module.causal
        scale = 1.0 / math.sqrt(d)
        do = grad_out.permute(0, 2, 1, 3).to(qh.dtype)
        delta = (do * o).sum(dim=-1, keepdim=True)  # [B, H, T, 1]
        dq = torch.zeros_like(qh)
        mask = torch.ones(t, t, dtype=torch.bool).tril() if causal else None

        def grads(src):
            """dK, dV of block `src` (zeros for a block this rank did not attend to)."""
            nonlocal dq
            kb, vb = blocks[src]
            if causal and src > me:
                return torch.zeros_like(kb), torch.zeros_like(vb)
            s = (qh @ kb.transpose(-1, -2)) * scale
            if causal and src == me:
                s = s.masked_fill(~mask, -math.inf)
            p = torch.exp(s - lse.unsqueeze(-1))
            dv = p.transpose(-1, -2) @ do
            dp = do @ vb.transpose(-1, -2)
            ds = p * (dp - delta)
            dq = dq + (ds @ kb) * scale
            dk = (ds.transpose(-1, -2) @ qh) * scale
            return dk, dv

        dk_own, dv_own = grads(me)
        ring.begin_backward()
        for r in range(1, n):
            dk, dv = grads((me + r) % n)
            ring.pass_gradient([_flat(dk), _flat(dv)])
        dk_in = torch.empty(b * t, h * d, dtype=torch.float32)
        dv_in = torch.empty(b * t, h * d, dtype=torch.float32)
        ring.end_backward([dk_in, dv_in])
        dk_all = dk_own + _heads(dk_in, b, t, h, d).to(qh.dtype)
        dv_all = dv_own + _heads(dv_in, b, t, h, d).to(qh.dtype)
        return (dq.permute(0, 2, 1, 3), dk_all.permute(0, 2, 1, 3),
                dv_all.permute(0, 2, 1, 3), None, None)


class RingAttention(nn.Module):
    """Blockwise (causal) attention of this rank's chunk of the sequence against every rank's
    K/V, over an lbcc.Communicator's context ring.

    forward(q, k, v, codec=None): [B, T, H, D] each (this rank's chunk: positions
    rank*T .. rank*T + T - 1); returns [B, T, H, D]. `codec`: "raw" (bit-exact f32), "bf16",
    "fp16" or an lbcc.SubspaceBasis (d = H*D, V = 0) with `coefficient_dtype` and
    `mixture_block`; or a pair (K's, V's). forward's `codec` overrides the module's for one call
    (learned bases: MixtureKV.codecs())."""

    def __init__(self, comm, codec="raw", causal=True, coefficient_dtype="bf16",
                 mixture_block=64, timeout=None):
        super().__init__()
        self.comm = comm
        self.codec = codec
        self.causal = causal
        self.coefficient_dtype = coefficient_dtype
        self.mixture_block = mixture_block
        self.timeout = timeout

    def forward(self, q, k, v, codec=None):
        if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
            raise ValueError(f"q, k, v must all be [B, T, H, D]; got {tuple(q.shape)}, "
                             f"{tuple(k.shape)}, {tuple(v.shape)}")
        codec = self.codec if codec is None else codec
        codecs = tuple(codec) if isinstance(codec, (tuple, list)) else (codec, codec)
        if len(codecs) != 2:
            raise ValueError("codec: one codec, or a pair (K's, V's)")
        return _RingAttentionFn.apply(q, k, v, self, codecs)


def ring_attention(comm, q, k, v, codec="raw", causal=True, **kwargs):
    """RingAttention(comm, codec, causal, **kwargs)(q, k, v)."""
    return RingAttention(comm, codec=codec, causal=causal, **kwargs)(q, k, v)


def full_causal_attention(q, k, v, causal=True):
    """The reference: softmax(q k^T / sqrt(D)) v over the whole sequence, [B, S, H, D] each."""
    qh, kh, vh = (x.permute(0, 2, 1, 3) for x in (q, k, v))
    s = (qh @ kh.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
    return (torch.softmax(s, dim=-1) @ vh).permute(0, 2, 1, 3)
