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
    ContextRing,
    DenseQuantCodec,
    Request,
    SubspaceBasis,
    SubspaceCodec,
    TopKEfCodec,
    TopKEfState,
    Topology,
    __version__,
    apply_table_delta,
    create_unique_id,
    decode,
    encode_table_delta,
    fit_basis,
    inspect,
    inspect_subspace,
    inspect_table_delta,
    project_weight,
    refresh_table,
    shift_embedding,
    start_root,
    unique_id_address,
    unique_id_from_address,
)
from lbcc import _torch_spellings

_torch_spellings.install(Communicator)  # size(), get_rank(), op=ReduceOp, src=/dst= (see there)
from lbcc.elastic import ElasticGroup, ElasticMaster, ElasticUnits

__all__ = [
    "AbortedError", "ArgumentTypeError", "CancelledError", "Codec", "CodecState", "Communicator", "ContextRing", "DataLossError",
    "DeadlineExceededError", "DenseQuantCodec", "ElasticGroup", "ElasticMaster", "ElasticUnits", "Error", "FailedPreconditionError",
    "InternalError", "InvalidArgumentError", "NotFoundError", "PermissionDeniedError", "Request",
    "SubspaceBasis", "SubspaceCodec", "TopKEfCodec", "TopKEfState", "Topology",
    "UnavailableError", "UnimplementedError", "apply_table_delta", "broadcast_bytes",
    "create_unique_id", "decode", "encode_table_delta", "errors", "fit_basis", "init", "inspect",
    "inspect_subspace", "inspect_table_delta", "project_weight", "refresh_table",
    "shard_communicators", "shift_embedding", "start_root", "unique_id_address",
    "unique_id_from_address",
]


_init_counts = {}  # rank -> lbcc.init calls through a store (threads may be ranks in tests).


def init(unique_id=None, nranks=None, rank=None, *, store=None, **options):
    """A communicator, from a unique id (with nranks and rank) or from the launcher.

    Without a unique id:
      - under torchrun (or any env:// launch: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), rank
        0's unique id travels through torch's own store, so LBCC opens no rendezvous port of its
        own: `store` if given, else the default process group's store when one is initialised,
        else a torch.distributed.TCPStore client of MASTER_ADDR:MASTER_PORT (torchrun's agent
        hosts it; without the agent, rank 0 hosts it as torch's env:// does);
      - under mpirun (MPI_Bcast), Slurm's srun (a root on the first host of
        SLURM_STEP_NODELIST) or with LBCC_BOOTSTRAP_ADDR: the C++ rendezvous
        (Communicator.init_from_environment, comm/rendezvous.h).
    `options`: backend ("ucx", "loopback"), listen_host (an address or an interface name),
    timeout (seconds), topology (an lbcc.Topology or the path of a topology JSON file)."""
    if unique_id is not None:
        if nranks is None or rank is None:
            raise ValueError("lbcc.init: a unique id needs nranks and rank")
        return Communicator.init(unique_id, nranks, rank, **options)
    if store is None and not _torch_launch():
        return Communicator.init_from_environment(**options)
    return _init_through_store(store, nranks, rank, options)


def _torch_launch():
    """True when the environment is an env:// launch whose store LBCC can use."""
    import os
    env = os.environ
    if env.get("LBCC_BOOTSTRAP_ADDR") or "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
        return False
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return False
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        return False
    return True


def _init_through_store(store, nranks, rank, options):
    import datetime
    import os

    import torch.distributed as dist

    env = os.environ
    timeout = options.get("timeout")
    seconds = float(timeout if timeout is not None else env.get("LBCC_TIMEOUT_S", 300))
    if store is None and dist.is_available() and dist.is_initialized():
        store = dist.distributed_c10d._get_default_store()
        rank = dist.get_rank() if rank is None else rank
        nranks = dist.get_world_size() if nranks is None else nranks
    for name, value in (("RANK", rank), ("WORLD_SIZE", nranks)):
        if value is None and not env.get(name, "").isdigit():
            raise errors.make_error("INVALID_ARGUMENT", f"lbcc.init: {name}={env.get(name)!r} "
                                    "is not a non-negative integer")
    rank = int(env["RANK"]) if rank is None else rank
    nranks = int(env["WORLD_SIZE"]) if nranks is None else nranks
    if store is None:
        host, port = env["MASTER_ADDR"], env["MASTER_PORT"]
        if not port.isdigit():
            raise errors.make_error(
                "INVALID_ARGUMENT", f"lbcc.init: MASTER_PORT={port!r} is not a port number")
        import socket
        try:
            socket.getaddrinfo(host, None)
        except socket.gaierror as e:
            raise errors.make_error(
                "INVALID_ARGUMENT", f"lbcc.init: MASTER_ADDR host '{host}' does not resolve "
                f"({e.strerror}); check the name, /etc/hosts or DNS") from None
        # torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE); a plain env:// launch
        # has rank 0 host it, as torch's env:// rendezvous does.
        is_master = rank == 0 and env.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        store = dist.TCPStore(host, int(port), nranks, is_master,
                              datetime.timedelta(seconds=seconds), wait_for_workers=False)
    # Keys are per (restart of the worker group, call): ranks call init in the same order.
    count = _init_counts.get(rank, 0)
    _init_counts[rank] = count + 1
    key = (f"lbcc/unique_id/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
           f"{env.get('TORCHELASTIC_RUN_ID', '')}/{count}")
    if rank == 0:
        uid = create_unique_id(options.get("listen_host"), timeout=seconds)
        store.set(key, uid)
    else:
        store.wait([key], datetime.timedelta(seconds=seconds))
        uid = bytes(store.get(key))
    return Communicator.init(uid, nranks, rank, **options)


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
