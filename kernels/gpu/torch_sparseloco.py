#!/usr/bin/env python3
"""The torch.topk-based SparseLoCo compressor, timed on the GPU: the baseline LBCC's TopK-EF
encode kernels are compared with (kernels/gpu_check.sh, kernels/README.md).

One step is what SparseLoCo's reference optimizer does per tensor and outer round, in PyTorch:
  e = beta * e + lr * delta                       (error feedback, in place)
  chunks = rearrange(e, "(y h) (x w) -> (y x) (h w)")   (64 x 64 chunks; a copy)
  idx = topk(|chunks|, k, dim=-1).indices; val = gather(chunks, idx)
  2-bit quantization: shift = mean, scale = 6 sigma / 4, q = clamp(round(c / scale + 2), 0, 3),
  lookup = mean of c per bin, v_hat = lookup[q] + shift
  e -= decompress(idx, v_hat)                     (dense scatter, rearranged back)
Indices stay int64 and codes one per byte, as in the reference (no bit packing), so the
baseline does less than LBCC's encode, which also packs indices and codes.

Prints one JSON object (and writes it to --json): seconds per step (CUDA events, mean over
--iters after warm-up), the shape, k, torch's version and the device. Exit status 2, with
{"error": ...}, when torch or a CUDA device is missing.
"""
import argparse
import json
import math
import sys


def edge(n):
    """The largest divisor of n that is <= 64 (codecs/chunking.h)."""
    if n <= 64:
        return n
    for d in range(64, 1, -1):
        if n % d == 0:
            return d
    return 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--top-k", type=float, default=64.0, help="selected per 4096 elements")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json", help="also write the result here")
    parser.add_argument("--cpu", action="store_true",
                        help="dry run on the CPU (checks the script; its time means nothing)")
    args = parser.parse_args()

    def finish(result, status):
        text = json.dumps(result)
        print(text)
        if args.json:
            with open(args.json, "w") as f:
                f.write(text + "\n")
        return status

    try:
        import torch
    except ImportError as e:
        return finish({"error": f"torch is not installed: {e}"}, 2)
    if not args.cpu and not torch.cuda.is_available():
        return finish({"error": "torch has no CUDA device", "torch": torch.__version__}, 2)

    dev = torch.device("cpu" if args.cpu else "cuda")
    rows, cols = args.rows, args.cols
    h, w = edge(rows), edge(cols)
    chunk = h * w
    k = max(1, min(chunk, round(chunk * args.top_k / 4096)))
    beta, lr, bins = 0.95, 1.0, 4
    torch.manual_seed(7)
    delta = torch.randn(rows, cols, device=dev) * 1e-3
    e = torch.zeros(rows, cols, device=dev)

    def step():
        e.mul_(beta).add_(delta, alpha=lr)
        chunks = e.view(rows // h, h, cols // w, w).permute(0, 2, 1, 3).reshape(-1, chunk)
        idx = torch.topk(chunks.abs(), k, dim=-1, largest=True, sorted=False).indices
        val = torch.gather(chunks, 1, idx)
        v = val.reshape(-1)
        n = v.numel()
        shift = v.mean()
        c = v - shift
        sigma = c.norm() / math.sqrt(max(n - 1, 1))
        scale = 6.0 * sigma / bins
        scale = torch.where((scale == 0) | ~torch.isfinite(scale), torch.ones_like(scale), scale)
        q = (c / scale + bins // 2).round().clamp(0, bins - 1).to(torch.uint8)
        ql = q.long()
        sums = torch.zeros(bins, device=dev).scatter_add_(0, ql, c)
        counts = torch.bincount(ql, minlength=bins).to(c.dtype)
        lookup = torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums))
        v_hat = (lookup[ql] + shift).view_as(val)
        dense = torch.zeros_like(chunks).scatter_(1, idx, v_hat)
        e.sub_(dense.view(rows // h, cols // w, h, w).permute(0, 2, 1, 3).reshape(rows, cols))
        return idx, q

    for _ in range(3):
        step()
    if args.cpu:
        import time
        begin = time.perf_counter()
        for _ in range(args.iters):
            step()
        seconds = (time.perf_counter() - begin) / args.iters
    else:
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            step()
        stop.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(stop) / 1e3 / args.iters
    return finish({
        "rows": rows,
        "cols": cols,
        "k_per_chunk": k,
        "seconds_per_step": seconds,
        "bytes_per_second_12B": 12.0 * rows * cols / seconds,
        "torch": torch.__version__,
        "device": "cpu (dry run)" if args.cpu else torch.cuda.get_device_name(0),
    }, 0)


if __name__ == "__main__":
    sys.exit(main())
