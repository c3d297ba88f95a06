"""lbcc.torch.SparseLoCo with overlap="delayed" / "streaming" (docs/overlap.md): ranks as threads
over the loopback transport (real concurrency: the exchanges run on each communicator's worker
thread while the ranks' inner steps compute), against a replay written here from the merge rule.

The replay runs every replica's inner loop itself and does the merge rule in plain torch; only
the compression is LBCC's (lbcc.TopKEfCodec.encode with states of its own, lbcc.decode of every
replica's payload in rank order, which test_core checks equals sparse_all_reduce bit for bit).
Every elementwise step is the same fp32 operation on both sides, so parameters, outer
parameters and error feedback are compared with torch.equal.
"""

import copy

import pytest
import torch

import lbcc
import sparseloco_common as common
from conftest import run_ranks
from lbcc.torch import SparseLoCo

H = common.INNER_STEPS  # 4
TOP_K, BETA, OUTER_LR = 128, 0.95, 1.0
SEED = 3
# common.build_model's tensors: [128, 32], [128], [67, 128], [67] (4096, 128, 8576, 67
# elements); two fragments balanced by elements: tensors 0-1 and 2-3.
FRAGMENTS_OF_2 = [(0, 2), (2, 4)]


def _optimizer(model, comm, **kw):
    return SparseLoCo(torch.optim.AdamW(model.parameters(), lr=common.INNER_LR), comm,
                      inner_steps=H, top_k=TOP_K, beta=BETA, outer_lr=OUTER_LR, value_bits=2,
                      **kw)


class Replay:
    """Every replica of an overlapped SparseLoCo at once: the rule of docs/overlap.md."""

    def __init__(self, replicas, fragments, delay, initial):
        self.models = [common.build_model(SEED) for _ in range(replicas)]
        with torch.no_grad():
            for m in self.models:
                for p, t in zip(m.parameters(), initial):
                    p.copy_(t)
        self.inner = [torch.optim.AdamW(m.parameters(), lr=common.INNER_LR) for m in self.models]
        self.theta = [p.detach().clone() for p in self.models[0].parameters()]
        self.start = [[t.clone() for t in self.theta] for _ in self.models]
        self.codec = lbcc.TopKEfCodec(top_k=TOP_K, beta=BETA, lr=OUTER_LR, values="binmean2")
        self.states = [[self.codec.new_state() for _ in self.theta] for _ in self.models]
        self.fragments, self.delay = fragments, delay
        self.pending = []  # (due step, fragment, aggregates)
        self.steps = 0
        self.posts = []  # (step, fragment)
        # Error-feedback mass, per replica and tensor, in float64: what went in
        # (sum beta^(T-t) lr delta_t) and what left (sum beta^(T-t) D(c_t)).
        self.mass_in = [[torch.zeros(t.shape, dtype=torch.float64) for t in self.theta]
                        for _ in self.models]
        self.mass_out = copy.deepcopy(self.mass_in)

    def step(self, rank_of_data):
        self.steps += 1
        s = self.steps
        for r, (m, o) in enumerate(zip(self.models, self.inner)):
            common.inner_step(m, o, SEED, rank_of_data(r), (s - 1) // H, (s - 1) % H)
            o.step()
        nfrag = len(self.fragments)
        posts = []
        for f, (b, e) in enumerate(self.fragments):
            offset = f * H // nfrag
            if s >= offset and (s - offset) % H == 0:
                posts.append((f, [[self.start[r][t] - list(m.parameters())[t].detach()
                                   for t in range(b, e)] for r, m in enumerate(self.models)]))
        with torch.no_grad():
            for due, f, aggregates in [x for x in self.pending if x[0] == s]:
                b, e = self.fragments[f]
                for t, g in zip(range(b, e), aggregates):
                    self.theta[t] = self.theta[t] - g
                    for r, m in enumerate(self.models):
                        p = list(m.parameters())[t]
                        p.copy_(self.theta[t] + (p.detach() - self.start[r][t]))
                        self.start[r][t] = self.theta[t].clone()
            self.pending = [x for x in self.pending if x[0] != s]
            for f, deltas in posts:
                b, e = self.fragments[f]
                aggregates = []
                for i, t in enumerate(range(b, e)):
                    payloads = []
                    for r in range(len(self.models)):
                        before = (torch.from_numpy(self.states[r][t].error).double()
                                  if self.states[r][t].initialized else 0)
                        payloads.append(self.codec.encode(deltas[r][i].contiguous(),
                                                          self.states[r][t]))
                        own = torch.zeros(deltas[r][i].shape)
                        lbcc.decode(payloads[-1], own)
                        # e_new + D(c) == beta e_old + lr delta, in the codec's fp32.
                        after = torch.from_numpy(self.states[r][t].error).double()
                        torch.testing.assert_close(
                            after + own.double(), BETA * before + OUTER_LR * deltas[r][i].double(),
                            atol=1e-6, rtol=1e-5)
                        self.mass_in[r][t] = self.mass_in[r][t] * BETA + OUTER_LR * deltas[r][
                            i].double()
                        self.mass_out[r][t] = self.mass_out[r][t] * BETA + own.double()
                    out = torch.empty(deltas[0][i].shape)
                    lbcc.decode(payloads, out, aggregation="sparseloco")
                    aggregates.append(out)
                self.pending.append((s + self.delay, f, aggregates))
                self.posts.append((s, f))
                for r, m in enumerate(self.models):
                    for t in range(b, e):
                        self.start[r][t] = list(m.parameters())[t].detach().clone()


def _train(rank, comm, steps, **kw):
    torch.set_num_threads(1)
    model = common.build_model(SEED)
    opt = _optimizer(model, comm, **kw)
    # Rank 0's initial parameters, broadcast (the ranks' threads share torch's global RNG, so
    # build_model's seeding races between them).
    initial = [p.detach().clone() for p in model.parameters()]
    posted = []
    for s in range(1, steps + 1):
        common.inner_step(model, opt, SEED, rank, (s - 1) // H, (s - 1) % H)
        before = opt.exchanges_posted
        opt.step()
        if opt.exchanges_posted != before:
            posted.append(s)
    return {"params": [p.detach().clone() for p in model.parameters()],
            "outer": [t.clone() for t in opt.outer_parameters()],
            "ef": opt.error_feedback(), "posted": posted, "merged": opt.exchanges_merged,
            "fragments": opt._groups[0]["fragments"], "outer_steps": opt.outer_step_count,
            "initial": initial}


@pytest.mark.parametrize("overlap,fragments,delay,expected_fragments", [
    ("delayed", None, None, [(0, 4)]),            # merged one outer step later (delay H)
    ("delayed", None, 1, [(0, 4)]),               # merged one inner step after the post
    ("streaming", 2, None, FRAGMENTS_OF_2),       # fragment 1 at offset H/2, delay H/2
    ("streaming", 2, H, FRAGMENTS_OF_2),          # two fragments in flight at once
])
def test_overlap_matches_the_replay_bit_for_bit(overlap, fragments, delay, expected_fragments):
    """Three replicas, 3.5 outer steps: model parameters, outer parameters and error feedback
    of every rank equal the replay's (same posts at the same steps, one encode per posted
    delta: a delta lost or encoded twice would change the error feedback); the outer
    parameters are bit-identical across ranks; and the replay's error-feedback mass balances:
    everything that went in (decayed lr * delta) is either in the buffer or was sent."""
    steps = 3 * H + H // 2 + 1
    results = run_ranks(3, lambda rank, comm: _train(rank, comm, steps, overlap=overlap,
                                                     fragments=fragments, delay=delay))
    o = results[0]
    assert o["fragments"] == expected_fragments
    replay = Replay(3, expected_fragments, delay if delay is not None else (
        H if overlap == "delayed" else H // len(expected_fragments)), o["initial"])
    for _ in range(steps):
        replay.step(lambda r: r)
    assert o["posted"] == sorted({s for s, _ in replay.posts})
    for r, res in enumerate(results):
        for t, (a, b) in enumerate(zip(res["outer"], results[0]["outer"])):
            assert torch.equal(a, b), f"rank {r}: outer parameter {t} differs from rank 0's"
        for t, (a, b) in enumerate(zip(res["params"], replay.models[r].parameters())):
            assert torch.equal(a, b.detach()), f"rank {r}: parameter {t} differs from the replay"
        for t, (a, b) in enumerate(zip(res["outer"], replay.theta)):
            assert torch.equal(a, b), f"rank {r}: outer parameter {t} differs from the replay"
        for t, (a, st) in enumerate(zip(res["ef"], replay.states[r])):
            assert torch.equal(a, torch.from_numpy(st.error)), f"rank {r}: error feedback {t}"
        for t in range(4):
            ef = torch.from_numpy(replay.states[r][t].error).double()
            torch.testing.assert_close(ef + replay.mass_out[r][t], replay.mass_in[r][t],
                                       atol=1e-5, rtol=1e-5)
    # Some posted rounds are still in flight at the end: merged = posted - in flight.
    in_flight = sum(1 for due, _, _ in replay.pending)
    assert o["merged"] == len(replay.posts) - in_flight
    # The exchange moved the outer parameters, and the replicas' local parameters differ
    # (each keeps its own progress since its last post).
    assert not torch.equal(o["outer"][0], o["initial"][0])
    assert not torch.equal(results[0]["params"][0], results[1]["params"][0])


def test_state_dict_with_an_exchange_in_flight_resumes_like_an_uninterrupted_run():
    """Save right after an exchange was posted (it is in flight), go on two more outer steps;
    a fresh model and optimizer loaded from the save and run the same steps end with the same
    bits: parameters, outer parameters, error feedback, counters. The save holds the exchange's
    aggregate, merged at its due step after the resume."""

    def body(rank, comm):
        torch.set_num_threads(1)
        results = {}
        for overlap, fragments in (("delayed", None), ("streaming", 2)):
            model = common.build_model(SEED)
            opt = _optimizer(model, comm, overlap=overlap, fragments=fragments)
            saved = None
            for s in range(1, 3 * H + 1):
                common.inner_step(model, opt, SEED, rank, (s - 1) // H, (s - 1) % H)
                opt.step()
                if s == H:
                    saved = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))
            assert len(saved[1]["sparseloco"]["overlap"]["pending"]) == 1 if overlap == (
                "delayed") else 2
            model2 = common.build_model(SEED + 1)
            opt2 = _optimizer(model2, comm, overlap=overlap, fragments=fragments)
            model2.load_state_dict(saved[0])
            opt2.load_state_dict(saved[1])
            for s in range(H + 1, 3 * H + 1):
                common.inner_step(model2, opt2, SEED, rank, (s - 1) // H, (s - 1) % H)
                opt2.step()
            for a, b in zip(model.parameters(), model2.parameters()):
                assert torch.equal(a, b), overlap
            for a, b in zip(opt.outer_parameters(), opt2.outer_parameters()):
                assert torch.equal(a, b), overlap
            for a, b in zip(opt.error_feedback(), opt2.error_feedback()):
                assert torch.equal(a, b), overlap
            assert (opt2.inner_step_count, opt2.outer_step_count, opt2.exchanges_posted,
                    opt2.exchanges_merged) == (opt.inner_step_count, opt.outer_step_count,
                                               opt.exchanges_posted, opt.exchanges_merged)
            # A save without overlap does not load into an overlapped optimizer.
            plain = _optimizer(common.build_model(SEED), comm)
            with pytest.raises(ValueError, match="option overlap"):
                plain.load_state_dict(saved[1])
            opt.flush()
            opt2.flush()
            results[overlap] = [t.clone() for t in opt.outer_parameters()]
        return results

    a, b = run_ranks(2, body)
    for key in a:
        assert all(torch.equal(x, y) for x, y in zip(a[key], b[key]))


def test_flush_merges_what_is_in_flight_and_blocking_is_unchanged():
    """flush() merges every exchange in flight (the model then holds every posted round and
    equals theta_global plus the progress since the last post); overlap=None keeps the blocking
    rule (the local parameters equal the outer ones after each outer step)."""

    def body(rank, comm):
        torch.set_num_threads(1)
        model = common.build_model(SEED)
        opt = _optimizer(model, comm, overlap="delayed")
        for s in range(1, 2 * H + 1):
            common.inner_step(model, opt, SEED, rank, (s - 1) // H, (s - 1) % H)
            opt.step()
        assert opt.exchanges_posted == 2 and opt.exchanges_merged == 1
        opt.flush()
        assert opt.exchanges_merged == 2 and opt.outer_step_count == 2
        # Flushed right at a post: no progress since, the model is the outer parameters.
        for p, o in zip(model.parameters(), opt.outer_parameters()):
            assert torch.equal(p.detach(), o)
        with pytest.raises(ValueError, match="step\\(\\) posts and merges"):
            opt.outer_step()
        model_b = common.build_model(SEED)
        blocking = _optimizer(model_b, comm)
        for s in range(1, H + 1):
            common.inner_step(model_b, blocking, SEED, rank, 0, s - 1)
            blocking.step()
        blocking.flush()  # nothing in flight: no-op
        for p, o in zip(model_b.parameters(), blocking.outer_parameters()):
            assert torch.equal(p.detach(), o)
        return [t.clone() for t in opt.outer_parameters()]

    a, b = run_ranks(2, body)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_rejects_bad_overlap_options():
    model = common.build_model(0)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    for kw, match in [(dict(overlap="async"), "overlap must be"),
                      (dict(fragments=2), "need overlap"),
                      (dict(overlap="delayed", fragments=2), "fragments=1"),
                      (dict(overlap="streaming", fragments=5), "fragments must be in"),
                      (dict(overlap="delayed", delay=0), "delay must be in"),
                      (dict(overlap="delayed", delay=H + 1), "delay must be in"),
                      (dict(overlap="streaming", fragments=2, elastic=True), "elastic")]:
        with pytest.raises(ValueError, match=match):
            SparseLoCo(inner, None, inner_steps=H, sync_initial=False, **kw)


def test_elastic_exchange_in_flight_when_a_member_leaves_is_retried_without_it():
    """overlap="delayed" over an elastic group (members as threads, loopback): three members
    post round 1; member 2 merges it and leaves while the others' round 2 is in flight (posted,
    waiting for member 2's part, which never comes). Round 2 is retried over the next epoch by
    the two that stay, who end bit-identical in their outer parameters; member 2 applied round
    1 and nothing after, as the others did before round 2 (no member applies a round the others
    did not)."""
    import threading

    import lbcc.torch.elastic

    from test_elastic import run_threads

    master = lbcc.ElasticMaster("ov-job", min_members=3, peer_timeout_ms=2000)
    posted_round_2 = threading.Barrier(3)

    def member(i):
        torch.set_num_threads(1)
        torch.manual_seed(100 + i)  # different initial weights: the group's rank 0's win
        model = torch.nn.Linear(16, 8)
        opt = SparseLoCo(torch.optim.SGD(model.parameters(), lr=0.1), None, inner_steps=2,
                         elastic=True, overlap="delayed")
        lbcc.torch.elastic.join(opt, master_address=master.address, job_id="ov-job",
                                name=f"m{i}", backend="loopback", peer_timeout_ms=2000,
                                op_timeout=30, join_timeout=30)
        group = opt._groups[0]["comm"]
        x = torch.randn(32, 16, generator=torch.Generator().manual_seed(i))
        after_round_1 = None
        steps = 2 if i == 2 else 8
        for s in range(1, steps + 1):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            if s == 4:  # round 1 merged, round 2 posted
                after_round_1 = [t.clone() for t in opt.outer_parameters()]
                posted_round_2.wait(60)
        if i == 2:
            opt.flush()  # round 1 merged
            after_round_1 = [t.clone() for t in opt.outer_parameters()]
            posted_round_2.wait(60)
            group.leave()
            return after_round_1, after_round_1, opt.exchanges_merged, []
        opt.flush()
        outer = [t.clone() for t in opt.outer_parameters()]
        group.leave()
        return outer, after_round_1, opt.exchanges_merged, group.membership_changes

    results = run_threads([lambda i=i: member(i) for i in range(3)])
    (o0, r0, m0, c0), (o1, r1, m1, c1), (o2, r2, m2, _) = results
    assert m0 == m1 == 4 and m2 == 1
    assert all(torch.equal(a, b) for a, b in zip(o0, o1))
    assert all(torch.equal(a, b) for a, b in zip(r0, r2)) and all(
        torch.equal(a, b) for a, b in zip(r1, r2))
    assert not torch.equal(o0[0], r0[0])  # rounds 2-4 moved the survivors on
    assert master.members == 0
    master.stop()


def test_streaming_between_processes_over_ucx_matches_the_replay(tmp_path):
    """The same check with 3 processes over UCX (each rank's exchanges on its own
    communicator's worker thread and the UCX transport, inner steps in its own process)."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    steps = 2 * H + H // 2
    uid = lbcc.create_unique_id("127.0.0.1", timeout=120)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here] + sys.path))
    procs = [subprocess.Popen([sys.executable, os.path.join(here, "sparseloco_overlap_worker.py"),
                               uid.hex(), "3", str(r), str(tmp_path), "streaming", "2",
                               str(steps)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) for r in range(3)]
    logs = [p.communicate(timeout=240)[0].decode(errors="replace") for p in procs]
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} failed:\n{logs[r]}"
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(3)]
    replay = Replay(3, FRAGMENTS_OF_2, H // 2, results[0]["initial"])
    for _ in range(steps):
        replay.step(lambda r: r)
    for r, res in enumerate(results):
        assert res["posted"] == sorted({s for s, _ in replay.posts})
        for a, b in zip(res["params"], replay.models[r].parameters()):
            assert torch.equal(a, b.detach()), f"rank {r}"
        for a, b in zip(res["outer"], replay.theta):
            assert torch.equal(a, b), f"rank {r}"
        for a, st in zip(res["ef"], replay.states[r]):
            assert torch.equal(a, torch.from_numpy(st.error)), f"rank {r}"


def test_a_failed_exchange_in_flight_is_dropped_by_every_rank():
    """Rank 0 posts its round-1 exchange; rank 1 aborts its communicator instead of posting (as
    a dying member would), so rank 0's exchange, in flight, can only fail. Every rank raises
    (rank 0 at the merge), and no rank applies the round: the outer parameters are the
    initial ones everywhere and rank 0's error feedback was rolled back (zero)."""

    def body(rank, comm):
        torch.set_num_threads(1)
        model = common.build_model(SEED)
        opt = _optimizer(model, comm, overlap="delayed")
        initial = [t.clone() for t in opt.outer_parameters()]
        raised = None
        try:
            for s in range(1, 2 * H + 1):
                common.inner_step(model, opt, SEED, rank, (s - 1) // H, (s - 1) % H)
                if rank == 1 and s == H:
                    comm.abort()
                opt.step()
            opt.flush()
        except lbcc.Error as e:
            raised = e
        assert raised is not None, f"rank {rank}: the failed exchange did not raise"
        assert opt.exchanges_merged == 0 and not opt._pending
        for a, b in zip(opt.outer_parameters(), initial):
            assert torch.equal(a, b), f"rank {rank} applied a failed round"
        if rank == 0:
            assert opt.exchanges_posted == 1
            # Rolled back to what it held before the round: nothing (never encoded) or zeros
            # (encoded, then aborted), depending on where the exchange failed.
            assert all(e is None or not e.any() for e in opt.error_feedback())
        return raised.code

    codes = run_ranks(2, body)
    assert codes[0] in ("UNAVAILABLE", "CANCELLED", "ABORTED"), codes
