"""A pipeline-stage boundary that moves subspace-compressed activations through LBCC.

Forward, the sending stage ships c = U^T (h - T[y]) plus the token ids y (k numbers and one id
per token instead of d numbers); the receiving stage rebuilds h = U c + T[y]. Backward, the
receiver ships g_c = U^T g_h and the sender uses U g_c. For a model whose residual writes lie in
span(U) (see lbcc.torch.subspace) this is exact up to the coefficients' rounding (fp32
coefficients: float32 rounding; bf16: about 3 significant digits).

    # stage 0 (rank a)                          # stage 1 (rank b)
    boundary = PipelineBoundary(comm, b, basis)   boundary = PipelineBoundary(comm, a, basis)
    h = stage0(ids)                               h, ids = boundary.recv(tokens)
    handle = boundary.send(h, ids)                loss = stage1(h, ids, targets)
    handle.backward()   # receives the gradient   loss.backward()  # sends the gradient
    boundary.synchronize()                        boundary.synchronize()

send() returns a scalar tensor whose backward receives the activation gradient and continues
into stage 0's graph; recv() returns activations that require grad and whose backward sends
the gradient. Ranks must post sends and receives in the same order per boundary (the schedule's
job; messages with one tag arrive in order).

Basis changes (after an embedding shift): call update_basis() on both sides between steps; the
previous bases stay known for decoding until drop_previous_bases(), so backward passes of
microbatches whose forward used the old basis (1F1B) still decode. A payload of a basis neither
side knows fails with lbcc.FailedPreconditionError.
"""

import torch

import lbcc
from lbcc.torch import backend


class _Send(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, ids, boundary):
        tokens = h.reshape(-1, h.shape[-1])
        request = boundary.comm.send_subspace(
            tokens.detach().to("cpu", torch.float32).contiguous(), boundary.peer, boundary.tag,
            boundary.codec, ids=ids, direction="forward", async_op=True)
        boundary._track(request)
        ctx.boundary = boundary
        ctx.codecs = boundary.codecs
        ctx.request = request
        ctx.shape = h.shape
        ctx.dtype = h.dtype
        ctx.device = h.device
        return h.new_zeros(())

    @staticmethod
    def backward(ctx, unused_grad):
        b = ctx.boundary
        ctx.request.wait()
        shape = ctx.shape
        grad = torch.empty(shape.numel() // shape[-1], shape[-1], dtype=torch.float32)
        request = b.comm.recv_subspace(grad, b.peer, b.tag, ctx.codecs, direction="backward",
                                       async_op=True)
        request.wait(b.timeout)
        return grad.view(shape).to(device=ctx.device, dtype=ctx.dtype), None, None


class _Recv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, boundary, tokens, device):
        d = boundary.codec.basis.model_dim
        h = torch.empty(tokens, d, dtype=torch.float32)
        ids = torch.empty(tokens, dtype=torch.int32)
        request = boundary.comm.recv_subspace(h, boundary.peer, boundary.tag, boundary.codecs,
                                              ids_out=ids, direction="forward", async_op=True)
        selectors = request.wait(boundary.timeout)
        ctx.boundary = boundary
        ctx.codec = boundary.codec
        ctx.selectors = selectors
        ctx.mark_non_differentiable(ids)
        if device is not None:
            h, ids = h.to(device), ids.to(device)
        return h, ids

    @staticmethod
    def backward(ctx, grad_h, unused_grad_ids):
        b = ctx.boundary
        grad = grad_h.to("cpu", torch.float32).contiguous()
        request = b.comm.send_subspace(grad, b.peer, b.tag, ctx.codec, direction="backward",
                                       selectors=ctx.selectors, async_op=True)
        b._track(request)
        return None, None, None, None


class PipelineBoundary:
    """The boundary between this rank's stage and the stage at `peer` (a rank of `comm`).

    Args:
      comm: an lbcc.Communicator holding both stages, or a torch.distributed group with backend
        "lbcc" (None: the default group); its lbcc.torch.communicator() is made on first use, a
        collective: construct the boundaries on every member of the group.
      peer: the other stage's rank in `comm`; for a dist group, its global rank (torch's dst=).
      basis: the lbcc.SubspaceBasis shared by both stages (identical bits; see sync_basis).
      coefficient_dtype: "f32", "bf16", "f16" or "i8" for the coefficients on the wire.
      tag: tells apart several boundaries between the same two ranks.
      timeout: seconds a receive may wait (None: forever; a lost peer still fails it).
    """

    def __init__(self, comm, peer, basis, *, coefficient_dtype="f32", tag=0, int8_block=32,
                 mixture_block=64, timeout=None):
        if not isinstance(comm, lbcc.Communicator):
            peer = backend._peer(comm, peer, "PipelineBoundary")
            comm = backend.communicator(comm)
        self.comm = comm
        self.peer = peer
        self.tag = tag
        self.timeout = timeout
        self._options = dict(coefficient_dtype=coefficient_dtype, int8_block=int8_block,
                             mixture_block=mixture_block)
        self.codec = lbcc.SubspaceCodec(basis, **self._options)
        self._previous = []
        self._pending = []
        self._anchor = torch.zeros((), requires_grad=True)

    @property
    def basis(self):
        return self.codec.basis

    @property
    def codecs(self):
        """The current codec first, then those of previous bases still accepted."""
        return [self.codec] + self._previous

    def send(self, h, ids):
        """Sends activations h [..., d] (their residual minus T[ids] in span(U)) and the token
        ids (same leading shape). Returns a scalar whose backward() receives the gradient of h
        and propagates it into h's graph."""
        ids32 = ids.reshape(-1).to("cpu", torch.int32).contiguous()
        return _Send.apply(h, ids32, self)

    def recv(self, tokens, device=None):
        """Receives `tokens` activations: returns (h [tokens, d] float32 requiring grad, ids
        int32), on `device` (default: the CPU, where LBCC receives)."""
        return _Recv.apply(self._anchor, self, tokens, device)

    def update_basis(self, basis, keep_previous=1):
        """Switches to `basis` (both sides must, between the same two messages); the last
        `keep_previous` bases stay accepted for payloads still in flight."""
        if basis == self.codec.basis:
            return
        self._previous = ([self.codec] + self._previous)[:keep_previous]
        self.codec = lbcc.SubspaceCodec(basis, **self._options)

    def drop_previous_bases(self):
        self._previous = []

    def synchronize(self):
        """Waits for every send posted so far (raises the first failure)."""
        pending, self._pending = self._pending, []
        for request in pending:
            request.wait(self.timeout)

    def _track(self, request):
        still = []
        for r in self._pending:
            if r.test():
                r.wait()  # Raises if that send failed.
            else:
                still.append(r)
        self._pending = still + [request]
