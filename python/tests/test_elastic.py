"""lbcc.ElasticGroup / lbcc.ElasticMaster and lbcc.torch.elastic with members as threads over
the loopback transport: a group forms and steps bit-identically, a newcomer receives the outer
parameters at the boundary, a member leaving makes the others retry, a wrong job id is refused,
and SparseLoCo's outer step over the elastic group matches on every member."""

import threading

import pytest
import torch

import lbcc
import lbcc.elastic
import lbcc.torch
import lbcc.torch.elastic

N = 4096


def run_threads(bodies, timeout=120.0):
    results, errors = [None] * len(bodies), [None] * len(bodies)

    def main(i):
        try:
            results[i] = bodies[i]()
        except BaseException as e:  # re-raised in the test's thread
            errors[i] = e

    threads = [threading.Thread(target=main, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a member did not finish"
    for e in errors:
        if e is not None:
            raise e
    return results


def member(master, shared, name):
    return lbcc.ElasticGroup([shared], master_address=master.address, job_id="py-job",
                             name=name, backend="loopback", peer_timeout_ms=2000,
                             op_timeout=30, join_timeout=30)


def steps(group, params, seed, n, codec, state):
    hashes = []
    for _ in range(n):
        group.boundary()
        step = group.step
        delta = torch.randn(N, generator=torch.Generator().manual_seed(seed * 1000 + step))
        out = torch.empty(N)
        group.sparse_all_reduce([delta], [out], codec, [state])
        params.add_(out)
        hashes.append((step, out.clone()))
    return hashes


def test_group_steps_bit_identically_and_a_newcomer_gets_the_state():
    master = lbcc.ElasticMaster("py-job", min_members=2, peer_timeout_ms=2000)
    codec = lbcc.TopKEfCodec(top_k=64)
    params = [torch.full((N,), float(i)) for i in range(3)]
    states = [codec.new_state() for _ in range(3)]
    groups = run_threads([lambda i=i: member(master, params[i], f"m{i}") for i in range(2)])
    assert all(g.exchange_epoch is None for g in groups)  # no exchange committed yet
    first = run_threads([lambda i=i: steps(groups[i], params[i], i, 3, codec, states[i])
                         for i in range(2)])
    for (s0, o0), (s1, o1) in zip(first[0], first[1]):
        assert s0 == s1 and torch.equal(o0, o1)
    assert torch.equal(params[0], params[1])
    assert groups[0].exchange_epoch == groups[1].exchange_epoch is not None
    two_member_epoch = groups[0].exchange_epoch
    # Members commit at once; the master's decision follows. Once step 2 is decided, the next
    # boundary a newcomer can be admitted at is the end of step 3.
    assert master.await_committed_steps(3)

    # A newcomer joins while the two run one more step; it is admitted at its commit.
    def newcomer():
        return member(master, params[2], "m2")
    joined = run_threads([newcomer] + [lambda i=i: steps(groups[i], params[i], i, 1, codec,
                                                         states[i]) for i in range(2)])
    groups.append(joined[0])
    run_threads([lambda i=i: steps(groups[i], params[i], i, 2, codec, states[i])
                 for i in range(3)])
    assert torch.equal(params[2], params[0]) and torch.equal(params[1], params[0])
    assert groups[2].stats["state_bytes_received"] >= N * 4
    # The last exchanges ran with the newcomer: one epoch, newer than the two members' one.
    assert len({g.exchange_epoch for g in groups}) == 1
    assert groups[2].exchange_epoch > two_member_epoch
    three_member_epoch = groups[2].exchange_epoch

    # One leaves: the other two go on (retrying a step in flight at most once).
    groups[2].leave()
    run_threads([lambda i=i: steps(groups[i], params[i], i, 2, codec, states[i])
                 for i in range(2)])
    assert torch.equal(params[0], params[1])
    assert master.members == 2
    assert groups[0].exchange_epoch == groups[1].exchange_epoch > three_member_epoch
    for g in groups[:2]:
        g.leave()
    master.stop()


def test_wrong_job_id_is_refused_with_invalid_argument():
    master = lbcc.ElasticMaster("py-job")
    with pytest.raises(lbcc.InvalidArgumentError, match="other-job"):
        lbcc.ElasticGroup([torch.zeros(4)], master_address=master.address, job_id="other-job",
                          backend="loopback")
    master.stop()


def test_sparseloco_outer_step_over_an_elastic_group():
    master = lbcc.ElasticMaster("py-job", min_members=2, peer_timeout_ms=2000)

    def train(seed):
        torch.manual_seed(seed)  # different initial weights: the group's rank 0 wins
        model = torch.nn.Linear(16, 8)
        opt = lbcc.torch.SparseLoCo(torch.optim.SGD(model.parameters(), lr=0.1), None,
                                    inner_steps=2, elastic=True)
        lbcc.torch.elastic.join(opt, master_address=master.address, job_id="py-job",
                                name=f"t{seed}", backend="loopback", peer_timeout_ms=2000)
        x = torch.randn(32, 16, generator=torch.Generator().manual_seed(seed))
        for _ in range(3):
            for _ in range(2):
                opt.zero_grad()
                model(x).square().mean().backward()
                opt.inner.step()
            opt.outer_step()  # elastic=True: retried over the new epoch, then the boundary
        outer = [t.clone() for t in opt.outer_parameters()]
        opt._groups[0]["comm"].leave()
        return outer

    a, b = run_threads([lambda: train(1), lambda: train(2)])
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    master.stop()


def test_a_pipeline_replica_leaves_and_rejoins_as_a_unit():
    """Two shard jobs whose masters share ElasticUnits; a full replica in both, a two-stage
    pipeline replica (stage 0 in shard 0, stage 1 in shard 1). Stage 1 leaves: stage 0 is
    told (replica_left) and is out of shard 0's group; new stages are admitted together, at
    one outer step, while the full replica keeps stepping."""
    units = lbcc.ElasticUnits()
    masters = [lbcc.ElasticMaster(f"shard{s}", min_members=2, peer_timeout_ms=2000, units=units)
               for s in (0, 1)]
    codec = lbcc.TopKEfCodec(top_k=64)

    def join(shard, name, stage=None, params=None):
        kw = {} if stage is None else dict(replica="pipe", stage=stage, replica_stages=2)
        return lbcc.ElasticGroup([params if params is not None else torch.zeros(N)],
                                 master_address=masters[shard].address, job_id=f"shard{shard}",
                                 name=name, backend="loopback", peer_timeout_ms=2000,
                                 op_timeout=30, join_timeout=30, **kw)

    def step(group, seed, state, record):
        group.boundary()
        s = group.step
        delta = torch.randn(N, generator=torch.Generator().manual_seed(seed * 1000 + s))
        out = torch.empty(N)
        group.sparse_all_reduce([delta], [out], codec, [state])
        record[s] = out.clone()

    full, stage = {}, {}
    full_states = [codec.new_state(), codec.new_state()]
    seen = {"full": ({}, {}), "stage0": {}, "stage1": {}}

    def full_join():
        full["g"] = [join(0, "full/0"), join(1, "full/1")]

    def stage_join(i):
        stage[f"s{i}"] = join(i, f"stage{i}", i)
    run_threads([full_join, lambda: stage_join(0), lambda: stage_join(1)])
    st = [codec.new_state(), codec.new_state()]

    def full_steps(n):
        for _ in range(n):
            for s in (0, 1):
                step(full["g"][s], 0 + s, full_states[s], seen["full"][s])

    def stage_steps(i, n):
        for _ in range(n):
            step(stage[f"s{i}"], 10 + i, st[i], seen[f"stage{i}"])

    run_threads([lambda: full_steps(2), lambda: stage_steps(0, 2), lambda: stage_steps(1, 2)])
    stage["s1"].leave()
    # Stage 0 asks without a group call (as after a failed stage link): told at once.
    told = stage["s0"].replica_left_error(30)
    assert lbcc.elastic.replica_left(told), repr(told)
    assert "its stage 1 (stage1) left" in str(told)
    # A full replica is still a member: nothing to tell at the timeout.
    assert full["g"][0].replica_left_error(0.5) is None
    with pytest.raises(lbcc.FailedPreconditionError) as left:
        stage_steps(0, 1)
    assert lbcc.elastic.replica_left(left.value), str(left.value)
    assert "its stage 1 (stage1) left" in str(left.value)
    stage["s0"].leave()
    full_steps(2)  # shards 0 and 1 go on with the full replica alone
    assert masters[0].members == 1 and masters[1].members == 1

    # The replica comes back as a unit: both stages are admitted at one outer step.
    done = threading.Event()
    st[:] = [codec.new_state(), codec.new_state()]
    both = threading.Barrier(2)

    def full_until_done():
        while not done.is_set():
            full_steps(1)

    def back(i):
        stage_join(i)
        admitted = stage[f"s{i}"].step
        stage_steps(i, 2)
        both.wait(60)
        stage[f"s{i}"].leave()  # the full replica's step in flight retries without them
        return admitted

    def back_last(i):
        try:
            return back(i)
        finally:
            done.set()
    results = run_threads([full_until_done, lambda: back(0), lambda: back_last(1)])
    assert results[1] == results[2], f"stages admitted at outer steps {results[1:]}"
    for i in (0, 1):
        for s, out in seen[f"stage{i}"].items():
            if s in seen["full"][i]:
                assert torch.equal(out, seen["full"][i][s]), (i, s)
    for g in full["g"]:
        g.leave()
    for m in masters:
        m.stop()
