"""One rank of bench/torch_backend_perf.sh: the same torch.distributed script for every backend.

    RANK=r WORLD_SIZE=n MASTER_ADDR=a MASTER_PORT=p \
        python3 bench/torch_backend_perf.py --backend lbcc|gloo --bytes 16777216 --json OUT.json

Times (i) dist.all_reduce of one float32 tensor of --bytes, --iters times after --warmup, each
iteration between barriers, its time the slowest rank's; (ii) the per-call time of an 8-byte
(2 x float32) all-reduce, as --small-calls back-to-back calls, repeated --small-reps times.
Rank 0 writes medians and every sample to --json.
"""

import argparse
import datetime
import json
import os
import statistics
import time

import torch
import torch.distributed as dist


def timed_allreduce(tensor, iters, warmup):
    """Per-iteration seconds of the slowest rank."""
    samples = []
    for i in range(warmup + iters):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        if i >= warmup:
            samples.append(seconds.item())
    return samples


def per_call(calls, reps):
    """Seconds per 8-byte all-reduce, `calls` in a row (the slowest rank's), `reps` times."""
    tiny = torch.ones(2)
    for _ in range(10):
        dist.all_reduce(tiny)
    samples = []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(tiny)
        seconds = torch.tensor([(time.perf_counter() - start) / calls], dtype=torch.float64)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        samples.append(seconds.item())
    return samples


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True)
    parser.add_argument("--bytes", type=int, default=16 << 20)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--small-calls", type=int, default=200)
    parser.add_argument("--small-reps", type=int, default=5)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.backend == "lbcc":
        global lbcc
        import lbcc.torch  # registers the backend
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=600))
    big = torch.ones(args.bytes // 4)
    big_samples = timed_allreduce(big, args.iters, args.warmup)
    assert big[0].item() == float(dist.get_world_size()) ** (args.iters + args.warmup), big[0]
    small_samples = per_call(args.small_calls, args.small_reps) if args.small_calls else []
    links = None
    if args.backend == "lbcc":  # which link class carried the bytes (slow: the scheduler's)
        links = {k: v for k, v in lbcc.torch.link_bytes().items() if isinstance(v, int)}
    if dist.get_rank() == 0:
        seconds = statistics.median(big_samples)
        with open(args.json, "w") as f:
            json.dump({"backend": args.backend, "ranks": dist.get_world_size(),
                       "bytes": args.bytes, "seconds": seconds,
                       "bytes_per_second": args.bytes / seconds, "samples": big_samples,
                       "small_seconds": statistics.median(small_samples) if small_samples
                       else None, "small_samples": small_samples, "link_bytes": links}, f)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
