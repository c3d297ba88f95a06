"""One torchrun rank of test_ddp_backend.py: the same DDP training (default hook, fp32) on the
default group (backend "lbcc") and on a Gloo group; saves both final parameters to OUT/rankR.pt.

    torchrun --nproc_per_node 4 ... ddp_backend_worker.py OUT
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import lbcc.torch  # noqa: F401


def train(group):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(20):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randn(8, 4, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def main():
    dist.init_process_group("lbcc", timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    result = {"lbcc": train(None), "gloo": train(gloo)}
    torch.save(result, os.path.join(sys.argv[1], f"rank{dist.get_rank()}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
