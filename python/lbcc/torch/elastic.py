"""lbcc.torch.SparseLoCo over an elastic group (lbcc.ElasticGroup): the outer step retries over
the new epoch when members leave, newcomers receive the outer parameters at the step boundary,
and nothing is checkpointed by hand. The group stands in for SparseLoCo's communicator;
SparseLoCo(elastic=True) only needs to call `after_outer_step(self)` at the end of its outer
step; `join(sparseloco, ...)` makes the group from the optimizer's outer parameters.

    opt = lbcc.torch.SparseLoCo(inner, comm=None, elastic=True, sync_initial=False)
    group = lbcc.torch.elastic.join(opt, master_address=..., job_id=...)

With overlap="delayed" (delay = H) the group's blocking exchange runs on the optimizer's one
exchange thread while the next inner steps compute, and the boundary runs after each merge,
before the next post, so a member's group calls still alternate boundary, exchange, boundary
(no two calls of one group at once). Failure rule (docs/overlap.md): an exchange in flight when
a member dies is retried by the group over the next epoch with the same deltas (every failed
try rolled its error feedback back on every member); a failure that is not a membership change
(this member's pipeline replica left, the master lost) drops the exchange on every member of
its epoch alike (the commit is agreed) and raises at its merge; the member then joins again and
takes the members' outer parameters. No member applies a round the others did not.
"""

import torch

from lbcc.elastic import ElasticGroup

__all__ = ["after_outer_step", "boundary", "join", "outer_step"]


def _groups(opt):
    groups = opt._groups
    if len(groups) != 1:
        raise ValueError("elastic SparseLoCo: one parameter group (no sharded communicators)")
    return groups[0]


@torch.no_grad()
def _adopt_outer(group):
    for p, saved in zip(group["params"], group["outer"]):
        p.copy_(saved)
    for start, saved in zip(group.get("start", ()), group["outer"]):
        start.copy_(saved)  # overlap: the local progress is measured from here


def join(opt, **options):
    """Joins the elastic job with `opt`'s outer parameters (fp32 CPU buffers, kept in place) as
    the shared state, takes them from the members if this is a newcomer, and stores the group as
    the optimizer's communicator."""
    group = _groups(opt)
    elastic = ElasticGroup(group["outer"], **options)
    group["comm"] = elastic
    opt._joined_once = False
    boundary(opt)
    return elastic


def boundary(opt):
    """The outer-step boundary: newcomers receive the outer parameters (and load them into the
    model); a newcomer's error feedback starts at zero."""
    group = _groups(opt)
    elastic = group["comm"]
    received = elastic.stats["state_bytes_received"]
    elastic.boundary()
    # Only at the boundary that brought the state: later ones must keep the local progress
    # (with overlap, theta_local differs from the outer parameters between merges).
    if elastic.stats["state_bytes_received"] != received or not getattr(
            opt, "_joined_once", False):
        if elastic.stats["state_bytes_received"]:
            _adopt_outer(group)
    opt._joined_once = True


def outer_step(opt):
    """SparseLoCo's outer step over the elastic group, then the next step's boundary. The
    group stands in for the communicator (lbcc.ElasticGroup.sparse_all_reduce takes SparseLoCo's
    arguments and retries with the same pseudo-gradients until an epoch completes the exchange;
    every failed try rolled its error feedback back), so SparseLoCo's own update runs unchanged.
    With SparseLoCo(elastic=True) wired to call after_outer_step(self) at the end of its
    outer_step, call opt.outer_step() instead."""
    opt.outer_step()
    if not getattr(opt, "elastic", False):
        after_outer_step(opt)


def after_outer_step(opt):
    """What SparseLoCo(elastic=True) runs after its outer update: the next step's boundary."""
    boundary(opt)
