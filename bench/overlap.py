#!/usr/bin/env python3
"""Compute utilization of a SparseLoCo replica on slow testbed links, blocking vs delayed vs
streaming outer steps (issue 42, docs/overlap.md), and the held-out loss at equal steps.

    nice -n 15 /usr/bin/python3 bench/overlap.py [--configs 25mbit:512,100mbit:2048]
        [--seeds 3] [--steps 150] [--inner-steps 5] [--out bench/results/overlap.md]

Two replicas, each a process in its own tools/testbed namespace: rank 0 on a fast host, rank 1
behind a slow link (its down- and up-link shaped by tc tbf to RATE; LBCC_SLOW_RANKS=1 so LBCC
treats the link as slow: chunked, bulk behind high priority). Each trains the example's byte
GPT (examples/hetero_training/model.py: d 128, 4 layers, context 64, batch 8, fortunes) with
lbcc.torch.SparseLoCo over AdamW (lr 2e-3, 20 warm-up steps), H inner steps per outer step,
top-k TOPK per 4096 with fp32 values (a payload large enough that the blocking exchange is a
quarter of the round or more at RATE), beta 0.95, outer lr 1. For each config one testbed and
one pair of processes run every (seed, mode) phase back to back, modes interleaved per seed, so
blocking and overlap see the same machine and link.

Utilization per replica = inner-step compute time (batch, forward, backward, inner optimizer:
wall time) / the phase's wall time (from the first step to the end of the final flush(), which
waits for the last exchange); the process CPU time / wall time is given too (it includes
LBCC's worker thread encoding and decoding). Held-out loss: rank 0's model after flush(), 16
held-out batches. The outer parameters are checked bit-identical across the replicas after
every phase. Writes the markdown (date, machine, load before and after, command) itself.
"""

import argparse
import hashlib
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from baselines import load as loadavg  # /proc/loadavg's 1, 5 and 15 minute averages

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TESTBED = os.path.join(ROOT, "tools", "testbed", "testbed")
EXAMPLE = os.path.join(ROOT, "examples", "hetero_training")
MODES = ("blocking", "delayed", "streaming")


def worker(a):
    import torch
    import lbcc
    from lbcc.torch import SparseLoCo
    sys.path.insert(0, EXAMPLE)
    from model import Data, Stage0, Stage1
    torch.set_num_threads(1)
    comm = lbcc.init(timeout=600)
    rank = comm.rank
    data = Data(64, 8, "fortunes")
    vocab = len(data.vocab)
    records = []
    for seed in range(a.seeds):
        for mode in MODES:
            torch.manual_seed(seed)
            s0 = Stage0(vocab, 128, 4, 2, 64, torch.zeros(vocab, 128), seed)
            s1 = Stage1(vocab, 128, 4, 2, seed)
            params = list(s0.parameters()) + list(s1.parameters())
            inner = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
            overlap = None if mode == "blocking" else mode
            opt = SparseLoCo(inner, comm, inner_steps=a.inner_steps, top_k=a.top_k,
                             value_bits=32, beta=0.95, outer_lr=1.0, overlap=overlap,
                             fragments=a.fragments if mode == "streaming" else None)
            stream = data.stream(rank, seed)
            comm.barrier()
            compute = outer = 0.0
            t_start, cpu_start = time.perf_counter(), time.process_time()
            losses = []
            for step in range(1, a.steps + 1):
                t0 = time.perf_counter()
                for g in inner.param_groups:
                    g["lr"] = a.lr * min(1.0, step / 20)
                x, y = next(stream)
                inner.zero_grad(set_to_none=True)
                loss = s1(s0(x), y)
                loss.backward()
                inner.step()
                compute += time.perf_counter() - t0
                losses.append(float(loss))
                t1 = time.perf_counter()
                opt.after_inner_step()
                outer += time.perf_counter() - t1
            t1 = time.perf_counter()
            opt.flush()
            flush = time.perf_counter() - t1
            wall = time.perf_counter() - t_start
            cpu = time.process_time() - cpu_start
            digest = hashlib.sha256(b"".join(t.numpy().tobytes()
                                             for t in opt.outer_parameters())).digest()
            identical = len(set(comm.all_gather_bytes(digest))) == 1
            with torch.no_grad():
                held = [float(s1(s0(xe), ye)) for xe, ye in data.held_out(16)]
            rec = {"seed": seed, "mode": mode, "rank": rank, "compute_s": compute,
                   "wall_s": wall, "cpu_s": cpu, "outer_s": outer, "flush_s": flush,
                   "wait_s": opt.exchange_wait_seconds if overlap else outer, "util": compute / wall, "cpu_util": cpu / wall,
                   "held_out": sum(held) / len(held), "train_tail": sum(losses[-10:]) / 10,
                   "identical": identical, "exchanges": opt.exchanges_posted
                   if overlap else opt.outer_step_count}
            records.append(rec)
            if rank == 0:
                print(f"  seed {seed} {mode:9s}: utilization {rec['util']:.3f} (wall "
                      f"{wall:.1f} s, compute {compute:.1f} s, in outer steps {outer:.2f} s "
                      f"(waiting {rec['wait_s']:.2f} s), "
                      f"final flush {flush:.2f} s), held-out {rec['held_out']:.3f}, "
                      f"identical {identical}", flush=True)
    gathered = comm.all_gather_bytes(json.dumps(records).encode())
    if rank == 0:
        with open(a.result, "w") as f:
            json.dump([r for g in gathered for r in json.loads(g)], f)
    comm.close()


def payload_bytes(top_k):
    """One replica's TopK-EF payload of the model's parameters (fp32 values), as encoded."""
    import torch
    import lbcc
    sys.path.insert(0, EXAMPLE)
    from model import Stage0, Stage1
    torch.manual_seed(0)
    ps = list(Stage0(114, 128, 4, 2, 64, torch.zeros(114, 128), 0).parameters()) + list(
        Stage1(114, 128, 4, 2, 0).parameters())
    codec = lbcc.TopKEfCodec(top_k=top_k, values="fp32")
    return sum(len(codec.encode(torch.randn(p.shape), codec.new_state())) for p in ps)


def plan_job(a, rate, top_k, step_s):
    """`lbcc plan`'s input for a config: the two replicas, rank 1's links at RATE (the testbed's
    tbf), the model, the measured inner-step compute per rank (step_s), H, top-k, fp32 values,
    the fragments."""
    mbit = float(rate.rstrip("mbit"))
    return {
        "topology": {"nranks": 2, "replicas": [{"kind": "full", "rank": 0},
                                               {"kind": "full", "rank": 1}]},
        "rates": {"default": {"up_mbit": 10000, "down_mbit": 10000, "latency_ms": 0.05},
                  "ranks": [{"rank": 1, "up_mbit": mbit, "down_mbit": mbit,
                             "latency_ms": 0.05}]},
        "model": {"params": 822642, "d": 128, "seq_len": 64, "vocab": 114,
                  "tokens_per_step": 512},
        "compute": {"ranks": [{"rank": r, "step_s": step_s[r]} for r in (0, 1)]},
        "job": {"H": a.inner_steps, "top_k": top_k, "values": "fp32",
                "overlap_fragments": a.fragments},
    }


def planned(a, rate, top_k, recs, mode):
    """lbcc.plan's utilization of rank 1 for `mode`, fed this mode's measured compute per inner
    step; None when this build's planner has no overlap model."""
    import lbcc.plan
    step_s = {r: statistics.mean(x["compute_s"] / a.steps for x in recs
                                 if x["mode"] == mode and x["rank"] == r) for r in (0, 1)}
    p = lbcc.plan.predict(plan_job(a, rate, top_k, step_s))
    key = {"blocking": "utilization", "delayed": "utilization_delayed",
           "streaming": "utilization_streaming"}[mode]
    return p["replicas"][1].get(key), p["sync"]["seconds"]


def run_config(a, rate, top_k, pkg, tmp):
    name = f"ov{os.getpid()}"
    subprocess.run([TESTBED, "down", "--stale"], capture_output=True)
    subprocess.run([TESTBED, "up", "--name", name, "--hosts", "2", "--rate", rate, "--slow", "1",
                    "--uplink", "--owner-pid", str(os.getpid())], check=True, capture_output=True)
    try:
        addr = [subprocess.run([TESTBED, "addr", "--name", name, str(r)], check=True,
                               capture_output=True, text=True).stdout.strip() for r in (0, 1)]
        port = 20000 + (os.getpid() * 17) % 20000
        result = os.path.join(tmp, f"{rate}.json")
        procs = []
        for r in (0, 1):
            env = {"PYTHONPATH": pkg, "OMP_NUM_THREADS": "1", "UCX_TLS": "tcp",
                   "UCX_NET_DEVICES": "eth0", "UCX_MEM_EVENTS": "no", "RANK": str(r),
                   "WORLD_SIZE": "2", "LBCC_BOOTSTRAP_ADDR": f"{addr[0]}:{port}",
                   "LBCC_LISTEN_ADDR": addr[r], "LBCC_SLOW_RANKS": "1",
                   "PYTHONDONTWRITEBYTECODE": "1"}
            argv = [sys.executable, os.path.abspath(__file__), "--worker", "--result", result,
                    "--seeds", str(a.seeds), "--steps", str(a.steps),
                    "--inner-steps", str(a.inner_steps), "--top-k", str(top_k),
                    "--fragments", str(a.fragments), "--lr", str(a.lr)]
            log = open(os.path.join(tmp, f"{rate}_rank{r}.log"), "w")
            procs.append(subprocess.Popen([TESTBED, "exec", "--name", name, str(r), "--", "env",
                                           *[f"{k}={v}" for k, v in env.items()], *argv],
                                          stdout=None if r == 0 else log,
                                          stderr=subprocess.STDOUT))
        for r, p in enumerate(procs):
            if p.wait(timeout=3600) != 0:
                sys.exit(f"overlap: rank {r} failed at {rate} (logs in {tmp})")
        with open(result) as f:
            return json.load(f)
    finally:
        subprocess.run([TESTBED, "down", "--name", name], capture_output=True)


def spread(xs):
    m = statistics.mean(xs)
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return m, sd


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--configs", default="25mbit:512,100mbit:2048",
                    help="RATE:TOPK pairs, one testbed each")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--inner-steps", type=int, default=5)
    ap.add_argument("--fragments", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--top-k", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "overlap.md"))
    ap.add_argument("--report-from", metavar="JSON",
                    help="measure nothing: write the markdown again from a run's saved records "
                         "(the .json beside its .md), with that run's date, load and options")
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    so = os.path.join(ROOT, "bazel-bin", "python", "lbcc", "_lbcc.so")
    if not os.path.exists(so):
        sys.exit(f"{so} missing: bazel build //python:lbcc")
    tmp = tempfile.mkdtemp(prefix="overlap_bench")
    pkg = os.path.join(tmp, "pkg")
    shutil.copytree(os.path.join(ROOT, "python", "lbcc"), os.path.join(pkg, "lbcc"))
    shutil.copy(so, os.path.join(pkg, "lbcc", "_lbcc.so"))
    sys.path.insert(0, pkg)
    if a.report_from:
        with open(a.report_from) as f:
            saved = json.load(f)
        meta = dict(saved["meta"], rendered=f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
                    f" by `{' '.join(['bench/overlap.py'] + sys.argv[1:])}`")
        run_args = ap.parse_args(shlex.split(meta["command"])[1:])
        results = {k: (k.split(":")[0], int(k.split(":")[1]), v)
                   for k, v in saved["records"].items()}
        return render(run_args, results, meta, a.out)
    check = subprocess.run([TESTBED, "check"], capture_output=True, text=True)
    if check.returncode != 0:
        sys.exit(f"overlap: the testbed is not usable here: {check.stdout}{check.stderr}")
    load_before = loadavg()
    t0 = time.time()
    results = {}
    for item in a.configs.split(","):
        rate, top_k = item.split(":")
        print(f"== {rate}, top-k {top_k}/4096 fp32, H = {a.inner_steps}, {a.steps} steps x "
              f"{a.seeds} seeds x {len(MODES)} modes", flush=True)
        results[item] = (rate, int(top_k), run_config(a, rate, int(top_k), pkg, tmp))
    load_after = loadavg()
    rev = subprocess.run(["git", "-C", ROOT, "log", "-1", "--format=%h %s"], capture_output=True,
                         text=True).stdout.strip()
    meta = {"date": time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
            "seconds": time.time() - t0, "load_before": load_before, "load_after": load_after,
            "tree": rev, "command": " ".join(["bench/overlap.py"] + sys.argv[1:])}
    with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
        json.dump({"meta": meta, "records": {k: v[2] for k, v in results.items()}}, f)
    return render(a, results, meta, a.out)


def render(a, results, meta, out):
    """The markdown of a run: its records, options (`a`) and meta (date, load, tree, command)."""
    lines = [
        "# SparseLoCo compute utilization with overlapped outer steps (issue 42)",
        "",
        "Written by `bench/overlap.py`; do not edit by hand. Setup and definitions: the "
        "script's doc.",
        "",
        f"- date: {meta['date']}" + (f" ({meta['seconds']:.0f} s)" if "seconds" in meta else "")
        + (f"; this page rendered {meta['rendered']} from the run's records"
           if "rendered" in meta else ""),
        f"- machine: {platform.node()}, {platform.platform()}, {os.cpu_count()} cores (shared), "
        f"load average {meta['load_before']} before, {meta['load_after']} after",
        f"- tree: {meta['tree']}",
        f"- command: `{meta['command']}`",
        f"- model: examples/hetero_training's byte GPT, d 128, 4 layers, context 64, batch 8 "
        f"(0.82 M parameters); 2 replicas (rank 1 behind the shaped link); H = {a.inner_steps}; "
        f"{a.steps} steps; streaming: {a.fragments} fragments, delay H // F; delayed: delay H",
        "",
        "| link | top-k/4096 (fp32) | payload per replica kB | mode | utilization rank 1 "
        "(slow) | utilization rank 0 | CPU / wall rank 1 | wall s | of which in outer steps s "
        "| final flush s | utilization rank 1 without the final flush | utilization vs blocking "
        "| planned utilization rank 1 (lbcc plan) "
        "| plan / measured | held-out loss (mean +- std, seeds) | outer parameters identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts, plan_rows, sync_rows = [], [], []
    for item, (rate, top_k, recs) in results.items():
        pb = payload_bytes(top_k)
        base = None
        for mode in MODES:
            mine = [r for r in recs if r["mode"] == mode]
            u1 = spread([r["util"] for r in mine if r["rank"] == 1])
            u0 = spread([r["util"] for r in mine if r["rank"] == 0])
            c1 = spread([r["cpu_util"] for r in mine if r["rank"] == 1])
            wall = spread([r["wall_s"] for r in mine if r["rank"] == 1])
            outer = spread([r["outer_s"] for r in mine if r["rank"] == 1])
            flush = spread([r["flush_s"] for r in mine if r["rank"] == 1])
            # A longer run's utilization: the last exchange's wait at the end (flush()) is
            # paid once per run, not per outer step.
            steady = spread([r["compute_s"] / (r["wall_s"] - r["flush_s"]) for r in mine
                             if r["rank"] == 1])
            loss = spread([r["held_out"] for r in mine if r["rank"] == 0])
            ident = all(r["identical"] for r in mine)
            if mode == "blocking":
                # The baseline the ratios divide by: a utilization in (0, 1].
                if not 0 < u1[0] <= 1:
                    sys.exit(f"overlap: blocking utilization {u1[0]} at {rate} is not sane")
                base = (u1, loss)
            vs = f"{u1[0] / base[0][0]:.2f}x"
            plan_u, plan_sync = planned(a, rate, top_k, recs, mode)
            if plan_u is None:
                plan_cell = "- | -"
            else:
                plan_cell = f"{plan_u:.3f} | {plan_u / u1[0]:.2f}"
                plan_rows.append((rate, mode, plan_u, u1[0]))
            if mode == "blocking":
                sync_rows.append((rate, plan_sync, statistics.mean(
                    r["outer_s"] / (a.steps // a.inner_steps) for r in mine if r["rank"] == 1)))
            lines.append(f"| {rate} | {top_k} | {pb / 1e3:.0f} | {mode} | {u1[0]:.3f} +- "
                         f"{u1[1]:.3f} | {u0[0]:.3f} | {c1[0]:.2f} | {wall[0]:.1f} | {outer[0]:.2f} | "
                         f"{flush[0]:.2f} | {steady[0]:.3f} | {vs} | {plan_cell} | "
                         f"{loss[0]:.4f} +- {loss[1]:.4f} | {'yes' if ident else 'NO'} |")
            if mode != "blocking":
                within = abs(loss[0] - base[1][0]) <= max(loss[1], base[1][1])
                verdicts.append(
                    f"- {rate}, {mode}: utilization {u1[0]:.3f} (goal >= 0.97: "
                    f"{'met' if u1[0] >= 0.97 else 'not met'}; without the final flush "
                    f"{steady[0]:.3f}: {'met' if steady[0] >= 0.97 else 'not met'}; blocking "
                    f"{base[0][0]:.3f}, "
                    f"goal config <= 0.8: {'yes' if base[0][0] <= 0.8 else 'no'}); held-out loss "
                    f"{loss[0]:.4f} vs blocking {base[1][0]:.4f}: difference "
                    f"{loss[0] - base[1][0]:+.4f}, "
                    f"{'within' if within else 'outside'} the seeds' spread (the larger std, "
                    f"{max(loss[1], base[1][1]):.4f})")
    lines += ["", "Utilization: mean +- std over the seeds (one phase each). Verdicts:", ""]
    lines += verdicts
    if plan_rows:
        worst = max(abs(p / m - 1) for _, _, p, m in plan_rows)
        lines += ["", f"Planner (`lbcc.plan.predict`, plan/plan.h's overlap model, fed each "
                      f"mode's measured inner-step compute and the link rates): worst error "
                      f"{worst:.1%} over {len(plan_rows)} rows (goal: within 15 % on every "
                      f"row: {'met' if worst <= 0.15 else 'not met'}); its t_sync vs the "
                      f"blocking outer step measured at rank 1: " +
                  "; ".join(f"{rate} {p:.3f} s vs {m:.3f} s" for rate, p, m in sync_rows) + "."]
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
