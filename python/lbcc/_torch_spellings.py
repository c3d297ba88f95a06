"""torch.distributed's spellings on lbcc.Communicator, beside LBCC's own (which stay).

    comm.size(), comm.get_rank()                 == comm.nranks, comm.rank
    comm.all_reduce(t, op=dist.ReduceOp.SUM)     op: a ReduceOp or "sum" | "mean" | "avg" ...
    comm.broadcast(t, src=0)                     == comm.broadcast(t, 0)  (root= also works)
    comm.send_compressed(t, dst=1, ...), comm.recv_compressed(out, src=0, ...)
    comm.send_subspace(t, dst=1, ...),   comm.recv_subspace(out, src=0, ...)

`reduce_op(op)` turns any spelling into LBCC's op name, which the operation then checks (an op
it does not implement is its lbcc.InvalidArgumentError naming the op). No torch import here:
a ReduceOp is recognised by its `op.name` / `name` attribute (torch 1.13: ReduceOp.SUM.op.name
== "SUM").
"""

import functools

from lbcc import errors

# Every spelling of a reduction, to LBCC's name of it.
_OPS = {
    "sum": "sum", "mean": "mean", "avg": "mean", "average": "mean", "max": "max", "min": "min",
    "product": "product", "prod": "product", "band": "band", "bor": "bor", "bxor": "bxor",
    "premul_sum": "premul_sum",
}


def reduce_op(op, supported=None, what="all_reduce"):
    """LBCC's name ("sum", "mean", "max", ...) of `op`: a string in any case, a
    torch.distributed.ReduceOp or ReduceOp.RedOpType. Raises InvalidArgumentError when `op` is
    no reduction, or not one of `supported` (LBCC names) when that is given."""
    if isinstance(op, str):
        name = op.lower()
    else:
        inner = getattr(op, "op", op)  # ReduceOp wraps a RedOpType, which has .name
        name = getattr(inner, "name", None)
        if not isinstance(name, str):
            raise errors.make_error(
                "INVALID_ARGUMENT",
                f"{what}: op {op!r} is neither a string nor a torch.distributed.ReduceOp")
        name = name.lower()
    lbcc_name = _OPS.get(name)
    if lbcc_name is None and supported is None:
        raise errors.make_error("INVALID_ARGUMENT", f"{what}: unknown op {op!r}")
    if supported is not None and lbcc_name not in supported:
        raise errors.make_error(
            "INVALID_ARGUMENT",
            f"{what}: op {op if isinstance(op, str) else name.upper()!r} is not supported here "
            f"({', '.join(supported)}); every torch op runs on a torch.distributed group with "
            "backend='lbcc'")
    return lbcc_name


def peer_argument(what, positional, keywords, names):
    """The one peer/root among `positional` (None when absent) and keywords `names`
    (e.g. ("root", "src")): exactly one must be given."""
    given = [(n, keywords.pop(n)) for n in names if n in keywords]
    if positional is not None:
        given.insert(0, ("position", positional))
    if len(given) != 1:
        raise TypeError(f"{what}: pass the rank once, as {' or '.join(n + '=' for n in names)} "
                        f"or positionally (got {len(given)})")
    return given[0][1]


def install(communicator_type):
    """Adds the torch spellings to lbcc.Communicator (idempotent)."""
    cls = communicator_type
    if getattr(cls, "_torch_spellings", False):
        return
    cls._torch_spellings = True
    cls.size = lambda self: self.nranks
    cls.size.__doc__ = "The number of ranks (torch's spelling of .nranks)."
    cls.get_rank = lambda self: self.rank
    cls.get_rank.__doc__ = "This rank (torch's spelling of .rank)."

    all_reduce = cls.all_reduce

    @functools.wraps(all_reduce)
    def all_reduce_(self, tensor, out=None, op="sum", **kwargs):
        return all_reduce(self, tensor, out, op=reduce_op(op), **kwargs)

    cls.all_reduce = all_reduce_

    broadcast = cls.broadcast

    @functools.wraps(broadcast)
    def broadcast_(self, tensor, root=None, **kwargs):
        return broadcast(self, tensor, peer_argument("broadcast", root, kwargs, ("root", "src")),
                         **kwargs)

    cls.broadcast = broadcast_

    def point_to_point(method, name, keyword):
        @functools.wraps(method)
        def wrapper(self, tensor, peer=None, *args, **kwargs):
            return method(self, tensor, peer_argument(name, peer, kwargs, ("peer", keyword)),
                          *args, **kwargs)
        return wrapper

    for name, keyword in (("send_compressed", "dst"), ("recv_compressed", "src"),
                          ("send_subspace", "dst"), ("recv_subspace", "src")):
        setattr(cls, name, point_to_point(getattr(cls, name), name, keyword))
