"""LBCC (Low-Bandwidth Collective Communication) from Python.

The C++ core (`lbcc._lbcc`) is a pybind11 extension over comm/ and codecs/:

    import lbcc
    uid = lbcc.create_unique_id()                      # one rank; send the bytes to the others
    comm = lbcc.Communicator.init(uid, nranks, rank)   # or lbcc.init() under torchrun
    comm.all_reduce(tensor, op="mean")                 # float32/16 CPU tensors, in place
    codec = lbcc.TopKEfCodec(top_k=64, beta=0.95)      # SparseLoCo's compressor
    states = [codec.new_state() for _ in deltas]
    comm.sparse_all_reduce(deltas, outs, codec, states)

Tensors are torch tensors or numpy arrays; contiguous CPU tensors of the right dtype are used in
place (zero-copy), anything else raises TypeError / ValueError naming the requirement. Every
operation blocks until done unless called with async_op=True, which returns an `lbcc.Request`
(test(), wait()). Waiting releases the GIL. Failures raise `lbcc.Error` subclasses carrying the
status code name and message (see lbcc.errors).

PyTorch training integration lives in `lbcc.torch` (SparseLoCo, pipeline boundary, DDP hook).
"""

import numpy as _np

from lbcc import errors
from lbcc.errors import (
    AbortedError,
    ArgumentTypeError,
    CancelledError,
    DataLossError,
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    UnavailableError,
    UnimplementedError,
)
from lbcc._lbcc import (
    Codec,
    CodecState,
    Communicator,
    DenseQuantCodec,
    Request,
    SubspaceBasis,
    SubspaceCodec,
    TopKEfCodec,
    TopKEfState,
    Topology,
    __version__,
    create_unique_id,
    decode,
    fit_basis,
    inspect,
    inspect_subspace,
    project_weight,
    shift_embedding,
    start_root,
    unique_id_address,
    unique_id_from_address,
)

__all__ = [
    "AbortedError", "ArgumentTypeError", "CancelledError", "Codec", "CodecState", "Communicator", "DataLossError",
    "DeadlineExceededError", "DenseQuantCodec", "Error", "FailedPreconditionError",
    "InternalError", "InvalidArgumentError", "NotFoundError", "PermissionDeniedError", "Request",
    "SubspaceBasis", "SubspaceCodec", "TopKEfCodec", "TopKEfState", "Topology",
    "UnavailableError", "UnimplementedError", "broadcast_bytes", "create_unique_id", "decode",
    "errors", "fit_basis", "init", "inspect", "inspect_subspace", "project_weight",
    "shard_communicators", "shift_embedding", "start_root", "unique_id_address",
    "unique_id_from_address",
]


def init(unique_id=None, nranks=None, rank=None, **options):
    """A communicator: from a unique id (with nranks and rank), or, without one, from the
    launcher's environment (torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; LBCC's root
    listens on MASTER_PORT + 1). `options`: backend ("ucx", "loopback"), listen_host, timeout
    (seconds), topology (an lbcc.Topology or the path of a topology JSON file)."""
    if unique_id is None:
        return Communicator.init_from_environment(**options)
    if nranks is None or rank is None:
        raise ValueError("lbcc.init: a unique id needs nranks and rank")
    return Communicator.init(unique_id, nranks, rank, **options)


def broadcast_bytes(comm, data, root=0, timeout=None):
    """`data` (bytes) of rank `root` on every rank of `comm`; other ranks pass None."""
    if comm.rank == root:
        if not isinstance(data, (bytes, bytearray)):
            # The other ranks are posting the size broadcast: take part with an error, so they
            # fail too instead of waiting, and every rank stays in step.
            message = "broadcast_bytes: the root must pass bytes"
            comm._take_part_rejected("Broadcast", message)
            raise TypeError(message)
        size = _np.array([len(data)], dtype=_np.int64)
    else:
        size = _np.zeros(1, dtype=_np.int64)
    comm.broadcast(size, root, timeout=timeout)
    if comm.rank == root:
        buffer = _np.frombuffer(bytes(data), dtype=_np.uint8).copy()
    else:
        buffer = _np.empty(int(size[0]), dtype=_np.uint8)
    if buffer.size:
        comm.broadcast(buffer, root, timeout=timeout)
    return buffer.tobytes()


def shard_communicators(comm):
    """Per-shard communicators for data parallelism over pipeline replicas.

    Shard s holds every full replica and stage s of every pipeline replica (comm.topology). Each
    rank gets {shard: communicator} for the shards it belongs to (a full replica: all of them, a
    pipeline stage: its own), ranks ordered as in topology.shard_ranks(s). Collective: every rank
    of `comm` must call it."""
    topology = comm.topology
    me = comm.global_rank
    members = set(comm.global_ranks)
    result = {}
    for shard in range(topology.num_shards):
        ranks = [r for r in topology.shard_ranks(shard) if r in members]
        color = 0 if me in ranks else -1
        key = ranks.index(me) if me in ranks else 0
        child = comm.split(color, key)
        if child is not None:
            result[shard] = child
    return result
