"""lbcc.torch.SparseLoCo over an elastic group (lbcc.ElasticGroup): the outer step retries over
the new epoch when members leave, newcomers receive the outer parameters at the step boundary,
and nothing is checkpointed by hand. SparseLoCo(elastic=True) calls `outer_step(self)` instead
of its own exchange; `join(sparseloco, ...)` makes the group from the optimizer's outer
parameters.

    opt = lbcc.torch.SparseLoCo(inner, comm=None, elastic=True, sync_initial=False)
    group = lbcc.torch.elastic.join(opt, master_address=..., job_id=...)
"""

import torch

import lbcc
from lbcc.elastic import ElasticGroup

__all__ = ["join", "boundary", "outer_step"]


def _groups(opt):
    groups = opt._groups
    if len(groups) != 1:
        raise ValueError("elastic SparseLoCo: one parameter group (no sharded communicators)")
    return groups[0]


@torch.no_grad()
def _adopt_outer(group):
    for p, saved in zip(group["params"], group["outer"]):
        p.copy_(saved)


def join(opt, **options):
    """Joins the elastic job with `opt`'s outer parameters (fp32 CPU buffers, kept in place) as
    the shared state, takes them from the members if this is a newcomer, and stores the group as
    the optimizer's communicator."""
    group = _groups(opt)
    elastic = ElasticGroup(group["outer"], **options)
    group["comm"] = elastic
    boundary(opt)
    return elastic


def boundary(opt):
    """The outer-step boundary: newcomers receive the outer parameters (and load them into the
    model); a newcomer's error feedback starts at zero."""
    group = _groups(opt)
    elastic = group["comm"]
    elastic.boundary()
    if elastic.stats["state_bytes_received"]:
        _adopt_outer(group)


@torch.no_grad()
def outer_step(opt):
    """SparseLoCo's outer step over the elastic group: the exchange is retried with the same
    pseudo-gradients until an epoch completes it (its error feedback was rolled back on every
    failed try), then the outer SGD update, then the next step's boundary."""
    o = opt.options
    group = _groups(opt)
    params, outer, states = group["params"], group["outer"], group["states"]
    deltas = [(saved - p.detach().to("cpu", torch.float32)).contiguous()
              for p, saved in zip(params, outer)]
    aggregates = [torch.empty_like(d) for d in deltas]
    group["comm"].sparse_all_reduce(deltas, aggregates, opt.codec, states,
                                    aggregation=o["aggregation"])
    for p, saved, g in zip(params, outer, aggregates):
        if o["weight_decay"]:
            saved.mul_(1.0 - o["outer_lr"] * o["weight_decay"])
        if o["sign"]:
            saved.sub_(torch.sign(g).mul_(o["outer_lr"]))
        else:
            saved.sub_(g)
        p.copy_(saved)
    opt.outer_step_count += 1
    boundary(opt)
