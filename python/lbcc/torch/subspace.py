"""Keeping a model subspace-constrained, so pipeline boundaries compress losslessly.

Every write into the residual stream must lie in span(U) (../shared/reference/subspace.md), so
a token's residual h satisfies h - T[y] in span(U):
  - SubspaceEmbedding: h0 = T[y] + E[y], E's rows in span(U) (dense, kept there by
    SubspaceConstraint), or h0 = T[y] + e_low[y] U^T (low_rank=True: by construction);
  - SubspaceLinear: a residual write y = U (Z x + b), by construction;
  - dense nn.Linear writes (W_o, W_2) re-projected W <- U U^T W, b <- U U^T b by
    SubspaceConstraint.apply() after every optimizer or SparseLoCo outer step, which also shifts
    the dense embedding: T <- T + (E - E U U^T), E <- E U U^T (h0 unchanged) and so moves to the
    next basis version (new T).
Adaptations after a SparseLoCo outer step (docs/boundary_modes.md): shift_embedding_
(the embedding shift for a raw [V, d] embedding and its table buffer), project_ (re-projection of
the residual writes), project_pseudo_gradient_ (a replica's pseudo-gradient onto span(U) before
top-k); embedding_update / apply_embedding_update_ give a rank that holds no embedding (a later
pipeline stage) the synced rows, so it computes the same next basis itself.
U and T are buffers: no optimizer or data-parallel sync touches them. The basis must hold the
same bits on every rank: make it from a seed or a file, shift with arithmetic="portable" on
replicas that hold bit-identical weights (SparseLoCo guarantees that), and use sync_basis() /
check_basis() across stages.
"""

import struct

import numpy as np

import torch
import torch.nn.functional as F
from torch import nn

import lbcc


def _u_of(basis):
    if basis.components != 1:
        raise lbcc.errors.make_error(
            "FAILED_PRECONDITION", "subspace layers need a single basis (components == 1)")
    return torch.from_numpy(basis.u)


def _table_of(basis):
    if basis.has_table:
        return torch.from_numpy(basis.table)
    return torch.zeros(basis.vocab_size, basis.model_dim)


class SubspaceEmbedding(nn.Module):
    """Token embedding h0 = T[y] + E[y] with E in span(U) (see the module doc)."""

    def __init__(self, basis, low_rank=False, init_std=0.02, generator=None):
        super().__init__()
        if basis.vocab_size <= 0:
            raise ValueError("SubspaceEmbedding: the basis needs a vocabulary (vocab_size > 0)")
        self.low_rank = low_rank
        self.register_buffer("u", _u_of(basis))
        self.register_buffer("table", _table_of(basis))
        v, d, k = basis.vocab_size, basis.model_dim, basis.rank
        if low_rank:
            self.weight = nn.Parameter(torch.randn(v, k, generator=generator) * init_std)
        else:
            w = torch.randn(v, d, generator=generator) * init_std
            self.weight = nn.Parameter((w @ self.u) @ self.u.t())

    def forward(self, ids):
        h = F.embedding(ids, self.table)
        e = F.embedding(ids, self.weight)
        return h + (F.linear(e, self.u) if self.low_rank else e)

    @torch.no_grad()
    def set_basis(self, basis):
        """Takes the basis' U and T (e.g. after another rank shifted the embedding)."""
        self.u.copy_(_u_of(basis))
        self.table.copy_(_table_of(basis))


class SubspaceLinear(nn.Module):
    """A residual write inside span(U): y = U (Z x + b); Z is [k, in_features]."""

    def __init__(self, in_features, basis, bias=True):
        super().__init__()
        self.register_buffer("u", _u_of(basis))
        self.inner = nn.Linear(in_features, basis.rank, bias=bias)

    def forward(self, x):
        return F.linear(self.inner(x), self.u)


@torch.no_grad()
def project_(tensor, basis, side="rows", arithmetic="portable"):
    """In place: W <- U U^T W on the model-dim side of `tensor` ("rows": [d, n], e.g. the
    weight of an nn.Linear writing into the residual; "columns": [n, d]); a 1-D tensor [d] (a
    bias) is projected as a column."""
    t = tensor.data if isinstance(tensor, nn.Parameter) else tensor
    view_shape = (t.shape[0], 1) if t.dim() == 1 else t.shape
    if t.dim() == 1:
        side = "rows"
    if t.dtype == torch.float32 and t.is_contiguous() and t.device.type == "cpu":
        lbcc.project_weight(basis, t.view(view_shape), side, arithmetic)
    else:
        work = t.detach().to("cpu", torch.float32).contiguous().view(view_shape)
        lbcc.project_weight(basis, work, side, arithmetic)
        t.copy_(work.view(t.shape))
    return tensor


def _f32_cpu(t, what):
    t = t.data if isinstance(t, nn.Parameter) else t
    if not (t.dtype == torch.float32 and t.is_contiguous() and t.device.type == "cpu"):
        raise ValueError(f"{what} must be a contiguous float32 CPU tensor, got {t.dtype} "
                         f"{'contiguous' if t.is_contiguous() else 'strided'} on {t.device}")
    return t


@torch.no_grad()
def shift_embedding_(basis, weight, table=None, arithmetic="portable"):
    """The embedding shift T <- T + (E - E U U^T), E <- E U U^T in place on a dense [V, d]
    embedding `weight` (and, when given, the [V, d] `table` buffer the model adds, which takes
    the new T). Returns the next basis: same U, the new T, version + 1, a new content hash.
    T[y] + E[y] is unchanged up to one float rounding per element. Ranks holding bit-identical E
    and basis get bit-identical results with arithmetic="portable" (no basis traffic)."""
    e = _f32_cpu(weight, "shift_embedding_: the embedding")
    nxt = lbcc.shift_embedding(basis, e, arithmetic)
    if table is not None:
        table.copy_(torch.from_numpy(nxt.table))
    return nxt


@torch.no_grad()
def project_pseudo_gradient_(param, outer, basis, side="rows", arithmetic="portable"):
    """In place: param <- outer - U U^T (outer - param), i.e. the pseudo-gradient outer - param
    projected onto span(U) on the model-dim side ("rows": [d, n]; "columns": [n, d]; a 1-D [d]
    tensor as a column). Call it on a replica's residual writes just before the SparseLoCo outer
    step, so top-k spends its budget on what the re-projection after the step keeps."""
    p = _f32_cpu(param, "project_pseudo_gradient_: param")
    o = _f32_cpu(outer, "project_pseudo_gradient_: outer")
    if p.shape != o.shape:
        raise ValueError(f"project_pseudo_gradient_: param {tuple(p.shape)} and outer "
                         f"{tuple(o.shape)} differ")
    if p.dim() == 1:
        p, o, side = p.view(-1, 1), o.view(-1, 1), "rows"
    lbcc._lbcc.project_pseudo_gradient(basis, o, p, side, arithmetic)
    return param


def embedding_update(before, after):
    """The elements of `after` whose bits differ from `before` (two float32 tensors of one
    shape) as bytes: count (u32), positions (u32 each), values (f32 each). A SparseLoCo outer
    step changes only the aggregate's selected positions, so this is small."""
    b = _f32_cpu(before, "embedding_update: before").numpy().reshape(-1).view(np.uint32)
    a = _f32_cpu(after, "embedding_update: after").numpy().reshape(-1)
    if b.shape != a.shape:
        raise ValueError("embedding_update: shapes differ")
    idx = np.nonzero(b != a.view(np.uint32))[0].astype("<u4")
    return struct.pack("<I", len(idx)) + idx.tobytes() + a[idx].astype("<f4").tobytes()


@torch.no_grad()
def apply_embedding_update_(tensor, data):
    """Applies embedding_update() bytes to `tensor` in place: afterwards it holds the same bits
    as the sender's `after`, provided it held `before`."""
    t = _f32_cpu(tensor, "apply_embedding_update_: tensor").view(-1)
    if len(data) < 4:
        raise ValueError("apply_embedding_update_: truncated update")
    (n,) = struct.unpack_from("<I", data)
    if len(data) != 4 + 8 * n:
        raise ValueError(f"apply_embedding_update_: {len(data)} bytes for {n} elements")
    idx = np.frombuffer(data, dtype="<u4", count=n, offset=4).astype(np.int64)
    vals = np.frombuffer(data, dtype="<f4", count=n, offset=4 + 4 * n)
    if n and idx.max() >= t.numel():
        raise ValueError(f"apply_embedding_update_: position {int(idx.max())} outside "
                         f"{t.numel()} elements")
    t[torch.from_numpy(idx)] = torch.from_numpy(vals.copy())
    return tensor


class SubspaceConstraint:
    """Re-projects a model's dense residual writes and shifts its dense embedding.

    Args:
      basis: the current lbcc.SubspaceBasis (with vocabulary when an embedding is given).
      writes: nn.Linear modules whose outputs are added to the residual (weight [d, n], bias
        [d]), or (tensor, side) pairs.
      embedding: a dense SubspaceEmbedding to shift, or None.
      arithmetic: "portable" (identical bits on every machine: required when several ranks
        compute the next basis themselves) or "blas" (faster).
    """

    def __init__(self, basis, writes=(), embedding=None, arithmetic="portable"):
        self.basis = basis
        self.writes = list(writes)
        self.embedding = embedding
        self.arithmetic = arithmetic
        if embedding is not None and embedding.low_rank:
            raise ValueError("SubspaceConstraint: a low-rank embedding is constrained already")

    @torch.no_grad()
    def apply(self):
        """Projects every write, shifts the embedding; returns the (possibly new) basis."""
        for w in self.writes:
            if isinstance(w, nn.Linear):
                project_(w.weight, self.basis, "rows", self.arithmetic)
                if w.bias is not None:
                    project_(w.bias, self.basis, "rows", self.arithmetic)
            else:
                tensor, side = w
                project_(tensor, self.basis, side, self.arithmetic)
        if self.embedding is not None:
            weight = self.embedding.weight.data
            if not (weight.dtype == torch.float32 and weight.is_contiguous()):
                raise ValueError("SubspaceConstraint: the embedding must be contiguous float32")
            self.basis = lbcc.shift_embedding(self.basis, weight, self.arithmetic)
            self.embedding.set_basis(self.basis)
        return self.basis


def sync_basis(comm, basis=None, root=0, timeout=None):
    """The basis of rank `root` on every rank of `comm` (others pass None or their own): the
    root's serialized basis is broadcast (d x k + V x d floats) and parsed, then check_basis()
    confirms every rank holds the same id."""
    data = basis.serialize() if comm.rank == root else None
    received = lbcc.broadcast_bytes(comm, data, root, timeout=timeout)
    result = basis if comm.rank == root else lbcc.SubspaceBasis.parse(received)
    check_basis(comm, result, timeout=timeout)
    return result


def check_basis(comm, basis, timeout=None):
    """Raises lbcc.FailedPreconditionError on every rank unless every rank of `comm` holds a
    basis with the same id (content hash and version)."""
    mine = struct.pack("<QI", basis.hash, basis.version)
    ids = [struct.unpack("<QI", b) for b in comm.all_gather_bytes(mine, timeout=timeout)]
    if any(i != ids[0] for i in ids):
        listing = ", ".join(f"rank {r}: {h:016x}/v{v}" for r, (h, v) in enumerate(ids))
        raise lbcc.errors.make_error("FAILED_PRECONDITION",
                                     f"subspace bases differ between ranks: {listing}")
