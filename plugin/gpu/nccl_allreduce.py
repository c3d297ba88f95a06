#!/usr/bin/env python3
"""NCCL itself over libnccl-net-lbcc.so: two torch.distributed processes on one GPU.

NCCL refuses two ranks on one GPU of one host, so each process gets its own NCCL_HOSTID: NCCL
then sees two hosts and carries every byte between them through its network plugin, which
NCCL_NET=LBCC pins to this plugin (NCCL fails instead of falling back to its own sockets).
Every all-reduce result is checked against the exact sum of both ranks' inputs; times are
reported as nccl-tests' algbw/busbw, never judged.

  plugin/gpu/nccl_allreduce.py --plugin PATH/libnccl-net-lbcc.so [--gdr] [--json FILE]
  plugin/gpu/nccl_allreduce.py --net Socket [--json FILE]     the peer: NCCL's own sockets

Everything stays on 127.0.0.1 (NCCL_SOCKET_IFNAME=lo for NCCL's bootstrap and sockets).
--gdr sets NCCL_NET_GDR_LEVEL=SYS so that NCCL hands the plugin device buffers (NCCL_PTR_CUDA,
staged through pinned host memory by the plugin); without it NCCL stages in host memory itself.
Exit status: 0 every result matched; 1 a mismatch or a failed process; 2 no CUDA torch.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

SIZES = [1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 26]  # fp32 elements: 4 KiB .. 256 MiB
ITERS = 5


def child(args):
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda:0"))
    results = []
    for n in SIZES:
        gen = torch.Generator(device="cuda").manual_seed(1234)
        inputs = [torch.randint(-1000, 1000, (n,), generator=gen, device="cuda").float()
                  for _ in range(2)]
        expected = inputs[0] + inputs[1]  # exact: small integers in fp32
        x = inputs[rank].clone()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        mismatches = int((x != expected).sum().item())
        dist.barrier()
        start = time.perf_counter()
        for _ in range(ITERS):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / ITERS
        algbw = n * 4 / seconds / 1e9
        results.append({"elements": n, "bytes": n * 4, "mismatches": mismatches,
                        "seconds": seconds, "algbw_GBps": algbw, "busbw_GBps": algbw})  # 2 ranks: busbw = algbw
        if rank == 0:
            print(f"{n * 4:>12} B  {seconds * 1e3:9.3f} ms  algbw {algbw:7.3f} GB/s  "
                  f"mismatches {mismatches}", flush=True)
    dist.destroy_process_group()
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump({"net": args.net, "gdr": args.gdr, "results": results}, f, indent=1)
    return 0 if all(r["mismatches"] == 0 for r in results) else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plugin", help="path of libnccl-net-lbcc.so (with --net LBCC)")
    parser.add_argument("--net", default="LBCC", choices=["LBCC", "Socket"],
                        help="NCCL network: the plugin, or NCCL's own sockets as the peer")
    parser.add_argument("--gdr", action="store_true", help="hand the plugin device buffers")
    parser.add_argument("--json", help="write rank 0's results here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    if args.net == "LBCC" and not args.plugin:
        parser.error("--net LBCC needs --plugin")
    try:
        import torch
        if not torch.cuda.is_available():
            print("MISSING: torch sees no CUDA device")
            return 2
    except ImportError as e:
        print(f"MISSING: torch ({e})")
        return 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   NCCL_HOSTID=f"lbcc-gpu-check-host{rank}", NCCL_NET=args.net,
                   NCCL_NET_PLUGIN=os.path.abspath(args.plugin) if args.net == "LBCC" else "none",
                   NCCL_IB_DISABLE="1", NCCL_SOCKET_IFNAME="lo",
                   NCCL_DEBUG=os.environ.get("NCCL_DEBUG", "INFO"),
                   NCCL_DEBUG_SUBSYS=os.environ.get("NCCL_DEBUG_SUBSYS", "INIT,NET"))
        if args.gdr:
            env.update(NCCL_NET_GDR_LEVEL="SYS", NCCL_NET_GDR_READ="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--child", "--net", args.net] +
                                      (["--gdr"] if args.gdr else []) +
                                      (["--json", args.json] if args.json else []), env=env))
    codes = []
    deadline = time.monotonic() + 240
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append("timeout")
    print(f"exit codes {codes}")
    return 0 if codes == [0, 0] else 1


if __name__ == "__main__":
    sys.exit(main())
