#!/usr/bin/env python3
"""Summarizes a kernels/gpu_check.sh run: reads $OUT/benchmark.json (topk_ef_gpu_benchmark,
Google Benchmark JSON) and $OUT/torch_<rows>x<cols>.json (torch_sparseloco.py) and prints the
TopK-EF encode figures next to the issue's goals: >= 0.5 of device copy bandwidth for the 12
bytes per element the encode must touch, and >= 5x faster than the torch.topk baseline.

Usage: summarize.py OUT_DIR
"""
import json
import os
import sys

UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def main():
    out = sys.argv[1]
    try:
        with open(os.path.join(out, "benchmark.json")) as f:
            runs = json.load(f)["benchmarks"]
    except Exception as e:  # the script says why there are no figures
        print(f"no benchmark figures: {e}")
        return 0

    def case(prefix):
        for r in runs:
            if r["name"].startswith(prefix) and not r.get("error_occurred"):
                return r
        return None

    copy = case("lbcc::kernels::BM_DeviceCopy")
    copy_rate = copy["bytes_per_second"] if copy else None
    if copy_rate:
        print(f"device copy: {copy_rate / 1e9:.0f} GB/s (bytes read + written)")
    else:
        print("device copy: no figure (no device in the benchmark run?)")
    for shape in ("4096/4096", "8192/8192", "16384/8192"):
        rows, cols = map(int, shape.split("/"))
        torch = None
        path = os.path.join(out, f"torch_{rows}x{cols}.json")
        if os.path.exists(path):
            with open(path) as f:
                torch = json.load(f).get("seconds_per_step")
        for label, prefix in (("device work", "BM_TopKEfEncodeGpuKernels"),
                              ("end to end", "BM_TopKEfEncodeGpu")):
            r = case(f"lbcc::kernels::{prefix}/{shape}/")
            if not r:
                continue
            seconds = r["real_time"] * UNIT[r["time_unit"]]
            rate = r["bytes_per_second"]
            line = (f"TopK-EF encode {rows}x{cols}, {label}: {seconds * 1e3:.3f} ms, "
                    f"{rate / 1e9:.0f} GB/s of 12 B/element")
            if copy_rate:
                line += f" = {rate / copy_rate:.2f} of device copy (goal >= 0.5)"
            if torch:
                line += f"; torch.topk baseline {torch * 1e3:.3f} ms = {torch / seconds:.1f}x (goal >= 5x)"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
