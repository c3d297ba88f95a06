"""One rank of test_c10d_backend.py: ProcessGroupGlooTest's cases (torch 1.13,
test/distributed/test_c10d_gloo.py) ported one for one to backend="lbcc", plus every op x
dtype and the bad-input cases. Writes {case: "ok" | "skip: why" | "FAIL: ..."} to OUT/rankR.json.

    c10d_worker.py RANK WORLD PORT OUT
"""

import datetime
import json
import os
import re
import sys
import time
import traceback

import torch
import torch.distributed as dist

import lbcc
import lbcc.torch  # registers the backend

RANK, WORLD, PORT, OUT = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
TIMEOUT_S = 20
CASES = []


def case(fn):
    CASES.append(fn)
    return fn


class Skip(Exception):
    pass


def expect_error(fn, *needles):
    try:
        fn()
    except RuntimeError as e:
        for n in needles:
            assert n in str(e), f"{n!r} not in {e}"
        return str(e)
    raise AssertionError("no RuntimeError")


@case
def test_empty_tensors():
    xs = [torch.FloatTensor([])]
    dist.broadcast(xs[0], src=0)
    assert xs[0].numel() == 0
    dist.all_reduce(xs[0])


@case
def test_broadcast_checks():
    t = torch.zeros(1)
    expect_error(lambda: dist.broadcast(t, src=WORLD), "rank", "out of range")


@case
def test_broadcast_basics():
    for root in range(WORLD):
        for dtype in (torch.float32, torch.float64, torch.int64, torch.uint8, torch.bool):
            x = torch.full((3,), root + 1).to(dtype) if RANK == root else torch.zeros(3, dtype=dtype)
            dist.broadcast(x, src=root)
            assert torch.equal(x, torch.full((3,), root + 1).to(dtype)), (root, dtype, x)


@case
def test_broadcast_stress():
    works = []
    xs = [torch.full((100,), float(i if RANK == 0 else -1)) for i in range(50)]
    for x in xs:
        works.append(dist.broadcast(x, src=0, async_op=True))
    for i, (w, x) in enumerate(zip(works, xs)):
        w.wait()
        assert torch.equal(x, torch.full((100,), float(i)))


@case
def test_allreduce_checks():
    expect_error(lambda: dist.all_reduce(torch.zeros(2), op=dist.ReduceOp.BXOR), "INVALID_ARGUMENT",
                 "bxor")


OPS = [(dist.ReduceOp.SUM, lambda v: sum(v)), (dist.ReduceOp.PRODUCT, lambda v: _prod(v)),
       (dist.ReduceOp.MIN, min), (dist.ReduceOp.MAX, max)]


def _prod(v):
    p = 1
    for x in v:
        p *= x
    return p


@case
def test_allreduce_basics():
    for op, ref in OPS:
        x = torch.tensor([float(RANK + 1)])
        dist.all_reduce(x, op=op)
        assert x.item() == ref([r + 1 for r in range(WORLD)]), (op, x)


@case
def test_allreduce_every_dtype_and_op():
    values = [r % 3 + 1 for r in range(WORLD)]
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
                  torch.uint8, torch.int16, torch.int32, torch.int64):
        floating = dtype.is_floating_point
        ops = OPS + ([(dist.ReduceOp.AVG, lambda v: sum(v) / len(v))] if floating else [
            (dist.ReduceOp.BAND, lambda v: _fold(v, lambda a, b: a & b)),
            (dist.ReduceOp.BOR, lambda v: _fold(v, lambda a, b: a | b)),
            (dist.ReduceOp.BXOR, lambda v: _fold(v, lambda a, b: a ^ b))])
        for op, ref in ops:
            x = torch.full((7,), values[RANK]).to(dtype)
            dist.all_reduce(x, op=op)
            want = torch.full((7,), ref(values)).to(dtype)
            assert torch.equal(x, want), (dtype, op, x, want)
    b = torch.tensor([RANK == 0, True])
    dist.all_reduce(b, op=dist.ReduceOp.MIN)
    assert b.tolist() == [False, True]


def _fold(v, f):
    a = v[0]
    for x in v[1:]:
        a = f(a, x)
    return a


@case
def test_allreduce_noncontiguous():
    x = torch.arange(12.).reshape(3, 4).t() * (RANK + 1)
    dist.all_reduce(x)
    assert torch.equal(x, torch.arange(12.).reshape(3, 4).t() * sum(range(1, WORLD + 1)))


@case
def test_allreduce_coalesced_basics():
    xs = [torch.full((2,), float(RANK + i)) for i in range(3)]
    dist.all_reduce_coalesced(xs)
    for i, x in enumerate(xs):
        assert torch.equal(x, torch.full((2,), float(sum(r + i for r in range(WORLD)))))


@case
def test_sparse_allreduce_basics():
    raise Skip("sparse COO tensors: not supported (dense CPU tensors only)")


@case
def test_scatter_basics():
    for root in range(WORLD):
        out = torch.zeros(2)
        ins = [torch.full((2,), float(i)) for i in range(WORLD)] if RANK == root else None
        dist.scatter(out, ins, src=root)
        assert torch.equal(out, torch.full((2,), float(RANK)))


@case
def test_gather_basics():
    for root in range(WORLD):
        outs = [torch.zeros(2) for _ in range(WORLD)] if RANK == root else None
        dist.gather(torch.full((2,), float(RANK)), outs, dst=root)
        if RANK == root:
            assert [o[0].item() for o in outs] == list(map(float, range(WORLD)))


@case
def test_allgather_basics():
    outs = [torch.zeros(3, dtype=torch.int32) for _ in range(WORLD)]
    dist.all_gather(outs, torch.full((3,), RANK, dtype=torch.int32))
    assert [o[0].item() for o in outs] == list(range(WORLD))


@case
def test_allgather_checks():
    expect_error(lambda: dist.all_gather([torch.zeros(3)] * WORLD, torch.zeros(2)), "differ")


@case
def test_allgather_base():
    out = torch.zeros(WORLD * 2)
    dist._all_gather_base(out, torch.full((2,), float(RANK)))
    assert out.tolist() == [float(r) for r in range(WORLD) for _ in range(2)]


@case
def test_allgather_coalesced_basics():
    raise Skip("allgather_coalesced: not implemented by ProcessGroupLBCC")


@case
def test_reduce_checks():
    expect_error(lambda: dist.reduce(torch.zeros(1), dst=-1), "out of range")


@case
def test_reduce_basics():
    for root in range(WORLD):
        for op, ref in OPS:
            x = torch.tensor([float(RANK + 1)])
            dist.reduce(x, dst=root, op=op)
            if RANK == root:
                assert x.item() == ref([r + 1 for r in range(WORLD)]), (op, x)


@case
def test_reduce_scatter():
    out = torch.zeros(2)
    dist.reduce_scatter(out, [torch.full((2,), float(RANK * 10 + i)) for i in range(WORLD)])
    assert torch.equal(out, torch.full((2,), float(sum(r * 10 + RANK for r in range(WORLD)))))
    out = torch.zeros(2, dtype=torch.int64)
    dist._reduce_scatter_base(out, torch.arange(2 * WORLD, dtype=torch.int64),
                              op=dist.ReduceOp.MAX)
    assert out.tolist() == [2 * RANK, 2 * RANK + 1]


@case
def test_alltoall():
    ins = [torch.full((i + 1,), float(RANK * 10 + i)) for i in range(WORLD)]
    outs = [torch.zeros(RANK + 1) for _ in range(WORLD)]
    dist.all_to_all(outs, ins)
    for src, o in enumerate(outs):
        assert torch.equal(o, torch.full((RANK + 1,), float(src * 10 + RANK)))
    inp = torch.arange(WORLD, dtype=torch.float64) + RANK * 100
    out = torch.zeros(WORLD, dtype=torch.float64)
    dist.all_to_all_single(out, inp)
    assert out.tolist() == [float(r * 100 + RANK) for r in range(WORLD)]


@case
def test_send_recv_all_to_all():
    works, outs = [], []
    for peer in range(WORLD):
        if peer == RANK:
            continue
        outs.append((peer, torch.zeros(4)))
        works.append(dist.irecv(outs[-1][1], src=peer))
        works.append(dist.isend(torch.full((4,), float(RANK)), dst=peer))
    for w in works:
        w.wait()
    for peer, t in outs:
        assert torch.equal(t, torch.full((4,), float(peer)))


@case
def test_recv_anysource():
    # After torch's distributed_test test_send_recv_any_source: every rank sends two messages
    # (its rank, k) to every other rank and receives WORLD - 1 of them naming no source
    # (dist.recv returns the sender, irecv's work its _source_rank()), then the rest from each
    # peer by name: every message arrives once, each peer's in its order.
    def message(rank, k):
        return torch.full((3,), float(rank * 1000 + k))
    sends = []
    for peer in range(WORLD):
        if peer != RANK:
            sends += [dist.isend(message(RANK, k), dst=peer, tag=4) for k in range(2)]
    next_k = [0] * WORLD
    for i in range(WORLD - 1):
        t = torch.zeros(3)
        if i == 0:
            work = dist.irecv(t, tag=4)
            work.wait()
            src = work._source_rank()
        else:
            src = dist.recv(t, tag=4)
        assert src != RANK and torch.equal(t, message(src, next_k[src])), (src, t)
        next_k[src] += 1
    for peer in range(WORLD):
        while peer != RANK and next_k[peer] < 2:
            t = torch.zeros(3)
            dist.recv(t, src=peer, tag=4)
            assert torch.equal(t, message(peer, next_k[peer])), (peer, t)
            next_k[peer] += 1
    for w in sends:
        w.wait()
    # A message of another size than the buffer: that receive fails, the group stays usable.
    if RANK == 1:
        dist.send(torch.zeros(5), dst=0, tag=6)
    if RANK == 0:
        expect_error(lambda: dist.recv(torch.zeros(3), tag=6), "LBCC DATA_LOSS", "bytes")
    dist.barrier()


@case
def test_barrier_implies_wait():
    works = [dist.all_reduce(torch.full((10,), 1.0), async_op=True) for _ in range(5)]
    dist.barrier()
    for w in works:
        assert w.is_completed() or w.wait()


@case
def test_monitored_barrier():
    # torch 1.13's dist.monitored_barrier admits only Gloo; the process group's own method is
    # what it would call.
    pg = dist.distributed_c10d._get_default_group()
    pg.monitored_barrier(datetime.timedelta(seconds=10))


@case
def test_work_future():
    x = torch.ones(3)
    fut = dist.all_reduce(x, async_op=True).get_future()
    assert torch.equal(fut.wait()[0], torch.full((3,), float(WORLD)))


@case
def test_new_group():
    g = dist.new_group([0, 1])
    if RANK in (0, 1):
        x = torch.ones(1)
        dist.all_reduce(x, group=g)
        assert x.item() == 2
        assert lbcc.torch.link_bytes(g)["fast_sent"] > 0


@case
def test_round_robin():
    raise Skip("ProcessGroupRoundRobin: not exposed in Python 1.13 for plugins")


@case
def test_multi_device_constructor():
    raise Skip("CUDA devices: CPU tensors only")


# --- LBCC's own operations on a dist group (issue 22, item 3). ---

def _gathered(t, group=None):
    """Every rank's copy of `t` (through the group's dense all-gather)."""
    n = dist.get_world_size(group)
    outs = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(outs, t, group=group)
    return outs


@case
def test_sparse_all_reduce_on_default_group():
    codec = lbcc.TopKEfCodec(top_k=4096, values="fp32")  # every value selected: lossless
    gen = torch.Generator().manual_seed(RANK)
    deltas = [torch.randn(64, 32, generator=gen), torch.randn(67, generator=gen)]
    outs = [torch.empty_like(d) for d in deltas]
    states = [codec.new_state() for _ in deltas]
    lbcc.torch.sparse_all_reduce(deltas, states, codec=codec, outs=outs, aggregation="sum")
    for out in outs:
        assert all(torch.equal(out, o) for o in _gathered(out)), "ranks differ"
    torch.testing.assert_close(outs[0], _reference_sum(0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[1], _reference_sum(1), atol=1e-5, rtol=1e-5)
    counters = lbcc.torch.link_bytes()
    assert counters["compressed"]["fast_sent"] > 0 and counters["dense"]["fast_sent"] > 0
    assert counters["fast_sent"] == (counters["compressed"]["fast_sent"] +
                                     counters["dense"]["fast_sent"])
    peer = (RANK + 1) % WORLD
    assert lbcc.torch.link_counters(peer)["bytes_sent"] > 0
    assert lbcc.torch.communicator() is lbcc.torch.communicator(None)


def _reference_sum(i):
    total = None
    for r in range(WORLD):
        g = torch.Generator().manual_seed(r)
        parts = [torch.randn(64, 32, generator=g), torch.randn(67, generator=g)]
        total = parts[i] if total is None else total + parts[i]
    return total


@case
def test_sparse_all_reduce_on_new_group():
    g = dist.new_group([0, 2], backend="lbcc")
    if RANK not in (0, 2):
        return
    codec = lbcc.TopKEfCodec(top_k=4096, values="fp32")
    x = torch.full((128,), float(RANK + 1))
    lbcc.torch.sparse_all_reduce([x], [codec.new_state()], g, codec=codec, aggregation="mean")
    assert torch.equal(x, torch.full((128,), 2.0)), x[:4]
    assert lbcc.torch.communicator(g).size() == 2
    assert lbcc.torch.communicator(g).get_rank() == (0 if RANK == 0 else 1)


@case
def test_compressed_send_recv_on_groups():
    codec = lbcc.DenseQuantCodec(format="bf16")
    sent = torch.linspace(-1, 1, 96) * (RANK + 1)
    # Default group: rank 0 -> rank WORLD-1 (global ranks, torch's dst=/src=).
    lbcc.torch.communicator()  # made collectively before point-to-point
    if RANK == 0:
        lbcc.torch.send_compressed(sent, WORLD - 1, codec=codec, tag=5)
    elif RANK == WORLD - 1:
        got = torch.empty(96)
        lbcc.torch.recv_compressed(got, 0, tag=5)
        torch.testing.assert_close(got, torch.linspace(-1, 1, 96), atol=1e-2, rtol=1e-2)
    # A new group of ranks 1 and 3: peers named by their global ranks.
    g = dist.new_group([1, 3], backend="lbcc")
    if RANK in (1, 3):
        lbcc.torch.communicator(g)
        if RANK == 1:
            req = lbcc.torch.send_compressed(sent, 3, g, codec=codec, async_op=True)
            req.wait()
        else:
            got = torch.empty(96)
            lbcc.torch.recv_compressed(got, 1, g)
            torch.testing.assert_close(got, torch.linspace(-1, 1, 96) * 2, atol=2e-2, rtol=1e-2)
        try:
            lbcc.torch.send_compressed(sent, 0, g, codec=codec)
            raise AssertionError("a rank outside the group was accepted")
        except ValueError as e:
            assert "not in the group" in str(e), e


@case
def test_pipeline_boundary_on_default_group():
    # Stage 0 on global rank 0, stage 1 on global rank 1; the boundary named by the dist group.
    lbcc.torch.communicator()  # collective: every rank, before the two stages pair up
    if RANK not in (0, 1):
        return
    tokens, d = 12, 16
    basis = lbcc.SubspaceBasis.from_seed(model_dim=d, rank=4, vocab_size=20, with_table=True,
                                         seed=5)
    boundary = lbcc.torch.PipelineBoundary(None, 1 - RANK, basis, timeout=30)
    ids = torch.arange(tokens) % 20
    if RANK == 0:
        h = torch.randn(tokens, d, generator=torch.Generator().manual_seed(1),
                        requires_grad=True)
        boundary.send(h, ids).backward()
        boundary.synchronize()
        assert h.grad is not None and h.grad.abs().sum() > 0
    else:
        h, got = boundary.recv(tokens)
        assert torch.equal(got.reshape(-1).long(), ids), got
        (h * torch.linspace(-1, 1, d)).sum().backward()
        boundary.synchronize()
        assert h.shape == (tokens, d)


@case
def test_sparseloco_on_default_group():
    # The SparseLoCo worker's model and schedule (sparseloco_common), on the default dist group
    # (comm=None); test_c10d_backend checks the result against the pure-PyTorch reference.
    import sparseloco_common as common
    from lbcc.torch import SparseLoCo

    torch.set_num_threads(1)
    model = common.build_model(1)
    opt = SparseLoCo(torch.optim.AdamW(model.parameters(), lr=common.INNER_LR), None,
                     inner_steps=common.INNER_STEPS, top_k=128, beta=0.95, outer_lr=1.0,
                     value_bits=2)
    steps = []
    for outer in range(common.OUTER_STEPS):
        for i in range(common.INNER_STEPS):
            common.inner_step(model, opt, 1, RANK, outer, i)
            opt.step()
        steps.append({"params": [p.detach().clone() for p in model.parameters()],
                      "ef": opt.error_feedback()})
    torch.save(steps, os.path.join(OUT, f"sparseloco_rank{RANK}.pt"))


@case
def test_ddp_compressed_hook_on_lbcc_group():
    from torch.nn.parallel import DistributedDataParallel as DDP

    def train(hook):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                    torch.nn.Linear(32, 4))
        ddp = DDP(model)
        state = None
        if hook:
            state = lbcc.torch.CompressedAllReduceState(None, codec="int8")
            ddp.register_comm_hook(state, lbcc.torch.compressed_allreduce_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(100 + RANK)
        for _ in range(10):
            x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        if state is not None:
            assert state.calls > 0
            state.close()
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    plain, hooked = train(False), train(True)
    assert all(torch.equal(hooked, o) for o in _gathered(hooked)), "replicas differ"
    # int8 blockwise quantization of the gradients: close to plain DDP, not equal.
    torch.testing.assert_close(hooked, plain, atol=2e-2, rtol=0)
    assert not torch.equal(hooked, plain)


@case
def test_torch_spellings_on_lbcc_communicator():
    comm = lbcc.torch.communicator()
    assert (comm.size(), comm.get_rank()) == (WORLD, RANK)
    x = torch.full((3,), float(RANK))
    comm.all_reduce(x, op=dist.ReduceOp.SUM)
    assert x.tolist() == [float(sum(range(WORLD)))] * 3
    comm.all_reduce(x, op=dist.ReduceOp.AVG)
    comm.all_reduce(x, op="avg")
    assert x.tolist() == [float(sum(range(WORLD)))] * 3
    b = torch.full((2,), float(RANK))
    comm.broadcast(b, src=WORLD - 1)
    assert b.tolist() == [float(WORLD - 1)] * 2
    b.fill_(float(RANK))
    comm.broadcast(b, root=0)
    assert b.tolist() == [0.0, 0.0]
    b.fill_(float(RANK))
    comm.broadcast(b, 1)
    assert b.tolist() == [1.0, 1.0]
    for op, name in ((dist.ReduceOp.MAX, "max"), ("min", "min"), ("PRODUCT", "product")):
        try:
            comm.all_reduce(x, op=op)
            raise AssertionError(f"{op} accepted")
        except lbcc.InvalidArgumentError as e:  # the extension's: "unknown op 'max' (sum, mean)"
            assert e.code == "INVALID_ARGUMENT" and f"'{name}'" in str(e), e


# --- Bad input (issue 22): each case on a fresh group, since a failed group stays failed. ---

def _fresh_group(verify=False):
    if verify:
        os.environ["LBCC_VERIFY_COLLECTIVES"] = "1"
    try:
        return dist.new_group(backend="lbcc")
    finally:
        os.environ.pop("LBCC_VERIFY_COLLECTIVES", None)


_CODE = re.compile(r"LBCC [A-Z_]+: ")


@case
def test_wrong_device_or_layout_is_refused_at_once():
    # A sparse tensor reaches ProcessGroupLBCC, which refuses it; a meta tensor (the only other
    # device this CPU build of torch has) is refused by torch's dispatcher before any backend.
    for fn in (lambda t: dist.all_reduce(t), lambda t: dist.broadcast(t, src=0),
               lambda t: dist.send(t, dst=(RANK + 1) % WORLD)):
        msg = expect_error(lambda: fn(torch.zeros(2).to_sparse()), "LBCC INVALID_ARGUMENT",
                           "dense CPU tensors")
        assert _CODE.match(msg), msg
        try:
            fn(torch.zeros(2, device="meta"))
            raise AssertionError("a meta tensor was accepted")
        except (RuntimeError, NotImplementedError) as e:
            assert "Meta" in str(e), e
    dist.barrier()  # the group is still usable: nothing was posted


@case
def test_size_mismatch_across_ranks_fails_every_rank():
    g = _fresh_group()
    n = 1024 if RANK == 0 else 2048
    msg = expect_error(lambda: dist.all_reduce(torch.ones(n), group=g), "LBCC")
    assert _CODE.match(msg), msg
    print(f"rank {RANK}: size mismatch -> {msg[:160]}", flush=True)


@case
def test_dtype_mismatch_across_ranks_fails_every_rank():
    # Same bytes, other dtype: the operation header (comm/signature.h) is checked always.
    g = _fresh_group()
    t = torch.ones(8, dtype=torch.float32 if RANK != 1 else torch.int32)
    msg = expect_error(lambda: dist.all_reduce(t, group=g), "LBCC FAILED_PRECONDITION")
    assert "dtype: float32 vs int32" in msg, msg
    print(f"rank {RANK}: dtype mismatch -> {msg[:160]}", flush=True)
    dist.all_reduce(torch.ones(2), group=g)  # a detected mismatch leaves the group usable


@case
def test_shape_mismatch_across_ranks_fails_every_rank():
    g = _fresh_group()
    t = torch.ones(8) if RANK != 2 else torch.ones(9)
    msg = expect_error(lambda: dist.broadcast(t, src=0, group=g), "LBCC FAILED_PRECONDITION")
    assert _CODE.match(msg), msg
    assert "bytes: 32 vs 36" in msg or "bytes: 36 vs 32" in msg, msg
    dist.broadcast(torch.ones(2), src=0, group=g)  # still usable


@case
def test_dead_peer_fails_within_timeout():
    # Last case: rank WORLD-1 leaves; the others' all-reduce must fail, not hang.
    if RANK == WORLD - 1:
        os._exit(0)
    start = time.monotonic()
    msg = expect_error(lambda: dist.all_reduce(torch.ones(1 << 16)), "LBCC")
    assert _CODE.match(msg), msg
    print(f"rank {RANK}: dead peer -> after {time.monotonic() - start:.1f} s (timeout "
          f"{TIMEOUT_S} s): {msg[:200]}", flush=True)


def main():
    dist.init_process_group("lbcc", init_method=f"tcp://127.0.0.1:{PORT}", rank=RANK,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    results = {}
    for fn in CASES:
        if fn.__name__ == "test_dead_peer_fails_within_timeout":
            with open(os.path.join(OUT, f"rank{RANK}.json"), "w") as f:
                json.dump(results, f)
        try:
            fn()
            results[fn.__name__] = "ok"
        except Skip as e:
            results[fn.__name__] = f"skip: {e}"
        except Exception:  # noqa: BLE001  (recorded for the test to report)
            results[fn.__name__] = "FAIL: " + traceback.format_exc()
    with open(os.path.join(OUT, f"rank{RANK}.json"), "w") as f:
        json.dump(results, f)
    os._exit(0)


if __name__ == "__main__":
    main()
