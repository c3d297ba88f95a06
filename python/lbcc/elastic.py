"""Elastic membership (comm/elastic/elastic.h, docs/elastic.md): members join and leave a running
SparseLoCo job. `ElasticMaster` is the membership service (also the `lbcc-master` binary);
`ElasticGroup` is one member, whose calls retry over the new epoch when the membership changed.

    master = lbcc.ElasticMaster("job-7")                  # or: lbcc-master --job_id job-7
    group = lbcc.ElasticGroup([params], master_address=master.address, job_id="job-7")
    while training:
        group.boundary()                 # newcomers receive `params` here
        ... inner steps, deltas ...
        group.sparse_all_reduce(deltas, outs, codec, states)   # retried over new epochs
        ... outer update of params ...
    group.leave()

A retried call has rolled its error-feedback states back, so it is repeated with the same
inputs. Errors other than a membership change raise as usual (lbcc.errors); the master's loss
raises UnavailableError naming it.

Pipeline replicas: the masters of a model's shard jobs share one `ElasticUnits`
(`ElasticMaster(job, units=units)`), and each stage joins its shard's job with
`replica="pipe0", stage=s, replica_stages=n`. A stage that leaves takes its replica out of every
shard's group: the other stages' calls raise FailedPreconditionError (`replica_left(e)` is True);
they join again, and are admitted once every stage is back, all at one outer step. A stage
that notices the loss outside a group call (its link to the other stage failed during inner
steps) asks `group.replica_left_error(timeout)`: the error once the service took its replica
out, None if it is still a member at the timeout (then it leaves itself, which takes the
replica out).
"""

import time

from lbcc import errors
from lbcc._lbcc import ElasticMaster, ElasticUnits, _ElasticGroup

__all__ = ["ElasticGroup", "ElasticMaster", "ElasticUnits", "replica_left", "retrying"]


def replica_left(error):
    """True for the error a pipeline stage's call raises when another stage of its replica
    left (comm::IsReplicaLeft): the stage is out of its group and joins again."""
    return (isinstance(error, errors.FailedPreconditionError) and
            "left the data-parallel group" in str(error) and "pipeline replica" in str(error))


def retrying(call, retries=1000, on_retry=None):
    """Runs `call()` until it does not raise AbortedError (a membership change), at most
    `retries` more times; `on_retry(error)` sees each retried error."""
    for attempt in range(retries + 1):
        try:
            return call()
        except errors.AbortedError as e:
            if attempt == retries:
                raise
            if on_retry is not None:
                on_retry(e)
    return None


class ElasticGroup:
    """One member of an elastic job. `shared_state`: float32 CPU tensors or arrays every member
    holds identically (parameters, outer-optimizer state), kept referenced and overwritten in a
    newcomer's first boundary(). Keyword options: master_address (default LBCC_MASTER_ADDR),
    job_id, name, backend ("ucx", "loopback"), op_timeout and join_timeout (seconds),
    peer_timeout_ms (default LBCC_PEER_TIMEOUT_MS), state_step (the committed step whose state
    this member holds; another step is refused as stale), replica, stage and replica_stages (a
    pipeline stage: see the module doc). `exchange_epoch`: the epoch in which the last
    successful sparse_all_reduce committed (None before one), for logs: `epoch` may have moved
    on by the time the caller looks (a member came or went, a newcomer was admitted at that
    commit)."""

    def __init__(self, shared_state, *, job_id, retries=1000, on_retry=None, **options):
        self._group = _ElasticGroup(list(shared_state), job_id=job_id, **options)
        self.retries = retries
        self.on_retry = on_retry
        self.membership_changes = []  # messages of the retried calls, for logs and plots
        self.exchange_epoch = None

    def _retry(self, call):
        def note(e):
            self.membership_changes.append(str(e))
            if self.on_retry is not None:
                self.on_retry(e)
        return retrying(call, self.retries, note)

    def boundary(self):
        """The start of an outer step: newcomers receive the shared state."""
        self._retry(self._group.boundary)

    def sparse_all_reduce(self, deltas, outs, codec, states, aggregation="sparseloco", **_):
        """SparseLoCo's exchange over the current epoch's members, retried over new epochs."""
        self._retry(lambda: self._group.sparse_all_reduce(list(deltas), list(outs), codec,
                                                          list(states), aggregation))
        self.exchange_epoch = self._group.stats["committed_epoch"]

    def leave(self):
        self._group.leave()

    def await_epoch(self, n, timeout):
        """Waits up to `timeout` seconds until the epoch is at least `n`; False at the timeout
        and, at once, when the group failed (its next call raises why)."""
        return self._group.await_epoch(n, timeout)

    def replica_left_error(self, timeout):
        """For a pipeline stage whose link to another stage of its replica failed outside a
        group call: waits up to `timeout` seconds (the peer timeout covers a silent stage) for
        the membership service to take the replica out, and returns the error its calls now
        raise (`replica_left(error)` is True; another failure, e.g. the master's loss, is
        returned as it is). None: still a member at the timeout (the stage link failed, not the
        stage): leave() then takes the replica out. Makes no group call while a member, so it
        may run between boundary() and sparse_all_reduce()."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if self._group.await_epoch(self._group.epoch + 1, left):
                continue  # another member came or went: keep waiting
            if time.monotonic() >= deadline:
                return None
            # The group failed (await_epoch returns at once then): its calls return why at
            # once, without a phase.
            try:
                self._group.boundary()
            except errors.Error as e:
                return e
            return None

    epoch = property(lambda self: self._group.epoch)
    rank = property(lambda self: self._group.rank)
    size = property(lambda self: self._group.size)
    step = property(lambda self: self._group.step)
    stats = property(lambda self: self._group.stats)
