"""The torch.distributed backend "lbcc" and LBCC's own operations on a dist group.

`import lbcc.torch` registers the backend, so

    dist.init_process_group(backend="lbcc", init_method=..., rank=r, world_size=n)

runs every standard collective on CPU tensors through LBCC (ProcessGroupLBCC in
python/torch_backend/, the extension lbcc._c10d_lbcc). Rendezvous goes through the store torch
passes in: no extra port.

LBCC's compressed operations (SparseAllReduce, compressed send/recv) live on lbcc.Communicator.
`communicator(group)` gives the one bound to a dist group: made on first use by every member of
the group (a collective call), through the same store, and kept as long as the group lives.
"""

import os
import threading
import weakref

import torch.distributed as dist

import lbcc

try:
    from lbcc import _c10d_lbcc
except ImportError as e:  # Installed without the backend's extension (it needs libtorch).
    _c10d_lbcc = None
    _missing = e

    class ProcessGroupLBCC:  # noqa: D101 - stands in so that isinstance() checks work
        def __init__(self, *args, **kwargs):
            raise ImportError(
                "the torch.distributed backend 'lbcc' needs lbcc._c10d_lbcc, which this "
                "installation lacks (python/install builds and installs it; "
                f"python/install_files.sh --c10d): {_missing}")
else:
    ProcessGroupLBCC = _c10d_lbcc.ProcessGroupLBCC

_lock = threading.Lock()
# ProcessGroupLBCC -> (store, rank, size, timeout) and -> lbcc.Communicator.
_joins = weakref.WeakKeyDictionary()
_comms = weakref.WeakKeyDictionary()


def _create(store, rank, size, timeout):
    pg = ProcessGroupLBCC(store, rank, size, timeout)
    with _lock:
        _joins[pg] = (store, rank, size, timeout)
    return pg


def register():
    """Registers "lbcc" with torch.distributed (idempotent; `import lbcc.torch` calls it)."""
    if "LBCC" not in dist.Backend._plugins:
        dist.Backend.register_backend("lbcc", _create)


def _group(group):
    pg = dist.distributed_c10d._get_default_group() if group is None else group
    if not isinstance(pg, ProcessGroupLBCC):
        raise TypeError(f"group must be an LBCC process group (backend='lbcc'), got {type(pg)}")
    return pg


def communicator(group=None):
    """The lbcc.Communicator of a dist group (the default group when None); its ranks are the
    group's ranks. Collective on first use: every member must call it (sparse_all_reduce and
    compressed send/recv do)."""
    pg = _group(group)
    with _lock:
        comm = _comms.get(pg)
        if comm is not None:
            return comm
        store, rank, size, timeout = _joins[pg]
    key = "lbcc/python_unique_id"
    seconds = timeout.total_seconds()
    if rank == 0:
        uid = lbcc.create_unique_id(os.environ.get("LBCC_LISTEN_ADDR", "127.0.0.1"),
                                    timeout=seconds)
        store.set(key, uid)
    else:
        uid = store.get(key)
    comm = lbcc.Communicator.init(bytes(uid), size, rank, timeout=seconds)
    with _lock:
        _comms[pg] = comm
    return comm


def sparse_all_reduce(tensors, states, group=None, *, codec, outs=None, **kwargs):
    """SparseLoCo's exchange on a dist group: lbcc.Communicator.sparse_all_reduce of
    communicator(group), in place unless `outs` is given (other keywords as there)."""
    return communicator(group).sparse_all_reduce(
        tensors, tensors if outs is None else outs, codec, states=states, **kwargs)


def link_bytes(group=None):
    """LBCC's link counters of a dist group's process group: bytes sent and received on fast and
    slow links."""
    return _group(group).link_bytes()
