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

Basis changes: call update_basis() on both sides between steps; the previous bases stay known
for decoding until drop_previous_bases(), so backward passes of microbatches whose forward used
the old basis (1F1B) still decode. A payload of a basis neither side knows fails with
lbcc.FailedPreconditionError.

The table T and the two boundary designs (mode=, ../shared/reference/subspace.md):
  "lossy" (the seed paper's authors'): no weight is constrained; T is the token embedding as
      synced at the last outer step, so h - T[y] is what the stage computed on top of the
      embedding and its part outside span(U) is lost at this boundary only (gradients come back
      as U U^T g). After every outer step, sync_table() refreshes T = E on both stages.
  "constrained" (Protocol Models): the model keeps stage 0's residual writes in span(U), so the
      boundary is exact; sync_table() applies the embedding shift T <- T + (E - E U U^T),
      E <- E U U^T (E modified in place on the stage that holds it).
Either way the next basis (version + 1) is computed by both stages from the same synced E, and
the stage that holds no embedding rebuilds that E from the elements the outer step changed
(lbcc.encode_table_delta: positions and new values), never from a dense copy.
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
      tag: tells apart several boundaries between the same two ranks (below 2**30).
      timeout: seconds a receive may wait (None: forever; a lost peer still fails it).
      mode: "lossy" or "constrained": what refresh_table() / sync_table() compute (module doc).
      table: this stage's copy of the synced token embedding [V, d] (float32; the boundary
        keeps a clone): the state both stages share, against which sync_table() sends only the
        changed elements. Needed for refresh_table() / sync_table(); both stages must start
        from the same bits (e.g. the same seeded initialisation).
    """

    MODES = ("lossy", "constrained")
    # Table updates travel on their own tag, so they never meet an activation receive.
    TABLE_TAG_BIT = 1 << 30

    def __init__(self, comm, peer, basis, *, mode="lossy", table=None, coefficient_dtype="f32",
                 tag=0, int8_block=32, mixture_block=64, timeout=None):
        if not isinstance(comm, lbcc.Communicator):
            peer = backend._peer(comm, peer, "PipelineBoundary")
            comm = backend.communicator(comm)
        if mode not in self.MODES:
            raise ValueError(f"PipelineBoundary: mode {mode!r} (expected one of {self.MODES})")
        if not 0 <= tag < self.TABLE_TAG_BIT:
            raise ValueError(f"PipelineBoundary: tag {tag} (expected 0 <= tag < 2**30: the "
                             f"table updates use tag | 2**30)")
        self.comm = comm
        self.peer = peer
        self.tag = tag
        self.mode = mode
        self._table = None
        if table is not None:
            t = table.detach().to("cpu", torch.float32).contiguous().clone()
            if t.shape != (basis.vocab_size, basis.model_dim):
                raise ValueError(f"PipelineBoundary: table {tuple(t.shape)}, expected "
                                 f"[{basis.vocab_size}, {basis.model_dim}] (the basis' V x d)")
            self._table = t
        self.table_bytes_sent = 0      # table updates this stage sent (sync_table)
        self.table_bytes_received = 0
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

    @property
    def table(self):
        """This stage's copy of the synced embedding (None without one)."""
        return self._table

    def refresh_table(self, embedding=None):
        """The next basis from the synced embedding (default: the boundary's own copy), made
        current on this side (the previous one stays accepted): lossy T = E; constrained the
        embedding shift (E modified in place). Every stage that calls it with the same bits
        gets the same basis id. Returns the new basis."""
        e = self._table if embedding is None else embedding
        if e is None:
            raise ValueError("PipelineBoundary.refresh_table: no embedding (pass one, or give "
                             "the boundary a table=)")
        e = e.data if isinstance(e, torch.nn.Parameter) else e
        # LBCC computes on host float32; a model's embedding elsewhere (a GPU, bf16) is copied
        # there and back (the constrained shift changes it).
        host = (e if e.device.type == "cpu" and e.dtype == torch.float32 and e.is_contiguous()
                else e.detach().to("cpu", torch.float32).contiguous())
        nxt = lbcc.refresh_table(self.codec.basis, host, self.mode)
        if host is not e and self.mode == "constrained":
            e.copy_(host)
        if self._table is not None and host is not self._table:
            self._table.copy_(host)
        self.update_basis(nxt)
        return nxt

    def sync_table(self, embedding=None):
        """After an outer step, on both stages at the same point of the schedule: the stage
        that holds the synced embedding passes it and sends the elements that changed since
        the last sync; the other passes None and applies them to its copy. Both then
        refresh_table(). Returns the new basis; table_bytes_sent / _received count the
        traffic."""
        if self._table is None:
            raise ValueError("PipelineBoundary.sync_table: the boundary holds no table (table=)")
        tag = self.tag | self.TABLE_TAG_BIT
        if embedding is not None:
            e = embedding.data if isinstance(embedding, torch.nn.Parameter) else embedding
            self.table_bytes_sent += self.comm.send_table_update(
                self._table, e.detach().to("cpu", torch.float32).contiguous(), self.peer, tag,
                timeout=self.timeout)
            return self.refresh_table(embedding)
        self.table_bytes_received += self.comm.recv_table_update(self._table, self.peer, tag,
                                                                 timeout=self.timeout)
        return self.refresh_table()

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
