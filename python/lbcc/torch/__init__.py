"""PyTorch integration of LBCC.

  SparseLoCo                    outer optimizer around any inner optimizer (sparseloco.py)
  PipelineBoundary              subspace-compressed activations and gradients between pipeline
                                stages, as autograd functions (pipeline.py)
  SubspaceEmbedding, SubspaceLinear, SubspaceConstraint, project_, sync_basis, check_basis
                                keeping a model subspace-constrained and the basis identical on
                                every rank (subspace.py)
  RingAttention, ring_attention
                                blockwise causal attention over LBCC's context-parallel ring
                                (K/V blocks raw, bf16 or as subspace coefficients;
                                ring_attention.py)
  MixtureKV, MixtureProjection  K/V projections onto learned, versioned mixtures of subspaces
                                that the ring carries as coefficients (mixture.py)
  CompressedAllReduceState, compressed_allreduce_hook
                                DDP communication hook: compressed all-reduce through LBCC
                                (ddp.py)
  backend "lbcc" for torch.distributed (registered on import), ProcessGroupLBCC, communicator,
  sparse_all_reduce, send_compressed, recv_compressed, link_bytes, link_counters
                                LBCC on a dist group (backend.py); SparseLoCo, PipelineBoundary
                                and CompressedAllReduceState take a dist group too
Tensors cross into LBCC as contiguous float32 CPU tensors (the wrappers convert); LBCC's own
calls take them without copying.
"""

from lbcc.torch import backend
from lbcc.torch.backend import (
    ProcessGroupLBCC,
    communicator,
    link_bytes,
    link_counters,
    recv_compressed,
    send_compressed,
    sparse_all_reduce,
)
from lbcc.torch.ddp import CompressedAllReduceState, compressed_allreduce_hook
from lbcc.torch.pipeline import PipelineBoundary
from lbcc.torch.mixture import MixtureKV, MixtureProjection
from lbcc.torch.ring_attention import RingAttention, ring_attention
from lbcc.torch.sparseloco import SparseLoCo
from lbcc.torch.subspace import (
    SubspaceConstraint,
    SubspaceEmbedding,
    SubspaceLinear,
    check_basis,
    project_,
    sync_basis,
)

backend.register()

__all__ = [
    "CompressedAllReduceState", "ProcessGroupLBCC", "communicator", "link_bytes",
    "link_counters", "recv_compressed", "send_compressed", "sparse_all_reduce", "MixtureKV", "MixtureProjection", "PipelineBoundary", "RingAttention", "SparseLoCo", "SubspaceConstraint",
    "SubspaceEmbedding", "SubspaceLinear", "check_basis", "compressed_allreduce_hook",
    "project_", "sync_basis",
]
