"""One rank of test_c10d_backend.py: ProcessGroupGlooTest's cases (torch 1.13,
test/distributed/test_c10d_gloo.py) ported one for one to backend="lbcc", plus every op x
dtype and the bad-input cases. Writes {case: "ok" | "skip: why" | "FAIL: ..."} to OUT/rankR.json.

    c10d_worker.py RANK WORLD PORT OUT
"""

import datetime
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

import lbcc.torch  # noqa: F401  (registers the backend)

RANK, WORLD, PORT, OUT = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
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
    raise Skip("recv from any source: the transport has no wildcard receive (UNIMPLEMENTED)")


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


@case
def test_dead_peer_fails_within_timeout():
    # Last case: rank WORLD-1 leaves; the others' all-reduce must fail, not hang.
    if RANK == WORLD - 1:
        os._exit(0)
    msg = expect_error(lambda: dist.all_reduce(torch.ones(1 << 16)), "LBCC")
    print(f"rank {RANK}: dead peer -> {msg[:200]}", flush=True)


def main():
    dist.init_process_group("lbcc", init_method=f"tcp://127.0.0.1:{PORT}", rank=RANK,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=20))
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
