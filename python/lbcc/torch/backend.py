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


def _group_rank(group, rank, what):
    """`rank` (a global rank, as torch.distributed's src=/dst= are) as a rank of `group`."""
    if group is None or group is dist.distributed_c10d._get_default_group():
        return rank
    try:
        return dist.distributed_c10d.get_group_rank(group, rank)
    except RuntimeError as e:
        raise ValueError(f"{what}: global rank {rank} is not in the group") from e


def communicator(group=None):
    """The lbcc.Communicator of a dist group (the default group when None); its ranks are the
    group's ranks. Collective on first use: every member must call it (sparse_all_reduce does;
    before compressed point-to-point, call it once on every member). An lbcc.Communicator is
    returned as it is."""
    if isinstance(group, lbcc.Communicator):
        return group
    pg = _group(group)
    with _lock:
        comm = _comms.get(pg)
        if comm is not None:
            return comm
        store, rank, size, timeout = _joins[pg]
    key = "lbcc/python_unique_id"
    seconds = timeout.total_seconds()
    if rank == 0:
        # None: LBCC_LISTEN_ADDR, else the interface LBCC_SOCKET_IFNAME chooses (multi-host).
        uid = lbcc.create_unique_id(None, timeout=seconds)
        store.set(key, uid)
    else:
        uid = store.get(key)
    comm = lbcc.Communicator.init(bytes(uid), size, rank, timeout=seconds)
    with _lock:
        _comms[pg] = comm
    return comm


def sparse_all_reduce(tensors, states, group=None, *, codec, outs=None, **kwargs):
    """SparseLoCo's exchange on a dist group (or an lbcc.Communicator):
    lbcc.Communicator.sparse_all_reduce of communicator(group), in place unless `outs` is given
    (other keywords as there: aggregation, async_op, timeout, ...)."""
    return communicator(group).sparse_all_reduce(
        tensors, tensors if outs is None else outs, codec, states=states, **kwargs)


def send_compressed(tensor, dst, group=None, *, codec, state=None, tag=0, async_op=False):
    """Sends `tensor` encoded by `codec` to global rank `dst` of a dist group (torch's dst=)."""
    return communicator(group).send_compressed(
        tensor, _peer(group, dst, "send_compressed"), tag, codec, state, async_op=async_op)


def recv_compressed(out, src, group=None, *, tag=0, async_op=False):
    """Receives and decodes into `out` what global rank `src` sent with send_compressed."""
    return communicator(group).recv_compressed(
        out, _peer(group, src, "recv_compressed"), tag, async_op=async_op)


def _peer(group, rank, what):
    if isinstance(group, lbcc.Communicator):
        return rank
    return _group_rank(group, rank, what)


def link_counters(peer, group=None):
    """Counters of the link to global rank `peer` (bytes, messages, rates, queues, link class)
    of the group's lbcc.Communicator (communicator(group): compressed traffic)."""
    return communicator(group).link_counters(_peer(group, peer, "link_counters"))


def link_bytes(group=None):
    """LBCC's link counters of a dist group: bytes this rank sent and received on fast and slow
    links, by the process group's collectives plus (once made) its communicator's compressed
    operations; "dense" and "compressed" hold the two parts."""
    pg = _group(group)
    dense = dict(pg.link_bytes())
    with _lock:
        comm = _comms.get(pg)
    compressed = dict(comm.bytes_by_class()) if comm is not None and not comm.closed else {
        k: 0 for k in dense}
    total = {k: dense[k] + compressed.get(k, 0) for k in dense}
    total["dense"] = dense
    total["compressed"] = compressed
    return total
