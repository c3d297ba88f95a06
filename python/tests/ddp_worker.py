"""One rank of test_ddp_hook: DDP over gloo, with and without LBCC's compressed all-reduce hook.

Usage: ddp_worker.py RANK WORLD MASTER_PORT OUT_DIR
The LBCC communicator comes from the same torchrun-style environment (root on MASTER_PORT + 1).
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import lbcc
from lbcc.torch import CompressedAllReduceState, compressed_allreduce_hook

STEPS = 60
BATCH = 32
VARIANTS = {
    "plain": None,
    "int8": dict(codec="int8"),
    "topk": dict(codec="topk", top_k=512, beta=1.0, values="bf16"),
}


def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, 4))


def dataset():
    g = torch.Generator().manual_seed(42)
    x = torch.randn(2048, 16, generator=g)
    w = torch.randn(16, 4, generator=g)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(2048, 4, generator=g)
    return x, y


def main():
    # DDP's first bucket holds up to this many bytes (1 MiB by default: the whole toy model);
    # smaller, so the hook sees several buckets per step (and DDP's bucket rebuild after the
    # first iteration).
    dist._DEFAULT_FIRST_BUCKET_BYTES = 8192
    rank, world, port, out_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    comm = lbcc.init(backend="ucx", timeout=60)
    assert (comm.rank, comm.nranks) == (rank, world)
    x, y = dataset()
    record = {}
    for name, options in VARIANTS.items():
        model = DDP(build_model(), bucket_cap_mb=0.01)  # ~2600 floats per bucket
        state = None
        if options is not None:
            state = CompressedAllReduceState(comm, **options)
            model.register_comm_hook(state, compressed_allreduce_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for step in range(STEPS):
            g = torch.Generator().manual_seed(1000 * step + rank)
            idx = torch.randint(0, x.shape[0], (BATCH,), generator=g)
            loss = nn.functional.mse_loss(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            final = nn.functional.mse_loss(model.module(x), y).item()
        record[name] = {"loss": final,
                        "params": [p.detach().clone() for p in model.module.parameters()]}
        if state is not None:
            record[name]["iterations"] = state.iteration
            record[name]["buckets"] = len(state.states)
            record[name]["hook_calls"] = state.calls
            state.close()
    with torch.no_grad():
        record["initial_loss"] = nn.functional.mse_loss(build_model()(x), y).item()

    # Errors surface through DDP: with LBCC's communicator aborted (on every rank, before any
    # operation, so no rank races another), the hook's future fails and backward() raises.
    comm.abort()
    model = DDP(build_model())
    state = CompressedAllReduceState(comm, codec="int8")
    model.register_comm_hook(state, compressed_allreduce_hook)
    try:
        nn.functional.mse_loss(model(x[:BATCH]), y[:BATCH]).backward()
        record["error"] = None
    except Exception as e:  # What DDP raised, for the test to inspect.
        record["error"] = f"{type(e).__name__}: {e}"
    state.close()
    torch.save(record, f"{out_dir}/rank{rank}.pt")
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
