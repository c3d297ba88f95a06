#!/usr/bin/env python3
"""A byte-level model with its context split over 4 ranks (context parallelism over LBCC's
K/V ring, lbcc.torch.RingAttention), uncompressed ring vs rings compressed by learned mixtures
of subspaces (lbcc.torch.MixtureKV). Issue 46 item 4 at toy scale (see the results page).

Corpus: the Debian base-files licence texts (/usr/share/common-licenses/*, ~260 kB of real
English text), 90 % train, the last 10 % held out. Model: byte embedding + learned positions,
`--layers` pre-LN blocks (attention over the ring, GELU MLP), d = `--dim`, 4 heads; every rank
holds the same parameters and one chunk of each sequence (context = ranks x chunk); gradients
are averaged over the ranks with comm.all_reduce after each backward. Codecs:
  bf16     the uncompressed reference: K/V from plain linear layers, dense bf16 on the ring
  mix<k>   K/V from MixtureKV (4 components of rank k, block 16 tokens), bf16 coefficients:
           1 - k/d of the bf16 ring bytes saved (d 64: k 6 -> 90.6 %, k 3 -> 95.3 %)

  examples/long_context/long_context.py --where testbed --rate 100mbit --seeds 3
writes bench/results/long_context.md (+ .json, + .png): per codec the held-out loss, the ring's
bytes, the step's split on the busiest rank (ring attention = block compute + the ring's calls,
where the caller waits for the link and encodes and decodes; the gradient all-reduce; the rest),
the planner's prediction (lbcc.plan.ring, fed the measured attention rate) beside the measured
times, a plot, and what link rate the issue's step-time goal needs by the plan. Each (codec,
seed) is one run of 4 processes, each in its own tools/testbed namespace behind a shaped link
(down and up); --where loopback runs them on 127.0.0.1 instead. Needs the built package (PYTHONPATH with lbcc, e.g. from
python/install) and, for the testbed, root.
"""

import argparse
import glob
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTBED = os.path.join(ROOT, "tools", "testbed", "testbed")
CORPUS = "/usr/share/common-licenses"


def corpus():
    data = b"".join(open(p, "rb").read() for p in sorted(glob.glob(os.path.join(CORPUS, "*")))
                    if os.path.isfile(p))
    cut = int(len(data) * 0.9)
    return data[:cut], data[cut:]


# ---------------------------------------------------------------------------------- worker ---

# The fields of one step's split, per rank (seconds).
SPLIT = ["step", "attention", "ring_calls", "allreduce", "optimizer"]


class RingTimers:
    """Time per step inside ring attention (lbcc.torch.RingAttention's forward and backward)
    and, within it, inside the calls on lbcc.ContextRing (the caller waits there for the link,
    and encodes and decodes blocks); the difference is the block attention's compute."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.attention = 0.0
        self.calls = 0.0


def probe_message_time(comm, lbcc, torch, reps=12):
    """The time of one ring round with nothing to carry (a 4-byte block, raw codec, no
    compute): forward and backward passes of a ContextRing on the same links, median over
    `reps`, divided by their 2 (n-1) rounds. The plan takes it as its per-message time
    (rates.message_ms): what a round costs beyond its bytes on these hosts (the progress
    threads, the pass's set-up and signature, the machine's load)."""
    n = comm.nranks
    if n < 2:
        return 0.0
    times = []
    one = [torch.zeros(1, 1), torch.zeros(1, 1)]
    for _ in range(reps):
        comm.barrier()
        t = time.perf_counter()
        ring = lbcc.ContextRing(comm, ["raw", "raw"], tokens=1, dim=1)
        ring.begin_forward(one, None)
        for _ in range(n - 1):
            ring.next_forward([torch.empty(1, 1), torch.empty(1, 1)])
        ring.end_forward()
        ring.begin_backward()
        for _ in range(n - 1):
            ring.pass_gradient(one)
        ring.end_backward([torch.empty(1, 1), torch.empty(1, 1)])
        times.append((time.perf_counter() - t) / (2 * (n - 1)))
    return statistics.median(times)


def install_ring_timers():
    """Wraps lbcc.ContextRing and RingAttention's autograd function with timers (this process
    only; the library is unchanged)."""
    import importlib
    import lbcc
    ra = importlib.import_module("lbcc.torch.ring_attention")  # the module, not the function

    timers = RingTimers()
    real_ring, real_fn = lbcc.ContextRing, ra._RingAttentionFn

    class TimedRing:
        def __init__(self, *args, **kwargs):
            self._ring = real_ring(*args, **kwargs)

        def __getattr__(self, name):
            attr = getattr(self._ring, name)
            if not callable(attr):
                return attr

            def timed(*args, **kwargs):
                t = time.perf_counter()
                try:
                    return attr(*args, **kwargs)
                finally:
                    timers.calls += time.perf_counter() - t
            return timed

    class TimedFn(real_fn):
        @staticmethod
        def forward(ctx, *args):
            t = time.perf_counter()
            try:
                return real_fn.forward(ctx, *args)
            finally:
                timers.attention += time.perf_counter() - t

        @staticmethod
        def backward(ctx, *grads):
            t = time.perf_counter()
            try:
                return real_fn.backward(ctx, *grads)
            finally:
                timers.attention += time.perf_counter() - t

    lbcc.ContextRing = TimedRing
    ra._RingAttentionFn = TimedFn
    return timers


def worker(a):
    import torch
    from torch import nn
    import lbcc
    from lbcc.torch import MixtureKV, RingAttention

    torch.set_num_threads(1)
    timers = install_ring_timers()
    comm = lbcc.init(timeout=600)
    n, me = comm.nranks, comm.rank
    heads, dim, chunk = 4, a.dim, a.chunk
    hd = dim // heads
    mix_k = int(a.codec[3:]) if a.codec.startswith("mix") else 0
    g = torch.Generator().manual_seed(a.seed)

    def init_(module):  # explicit generator: identical parameters on every rank
        with torch.no_grad():
            for p in module.parameters():
                if p.dim() > 1:
                    p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
                else:
                    p.zero_()

    class Block(nn.Module):
        def __init__(self, i):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.q, self.o = nn.Linear(dim, dim), nn.Linear(dim, dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
            init_(self)
            if mix_k:
                self.kv = MixtureKV(dim, dim, rank=mix_k, components=4, block=16,
                                    seed=a.seed * 100 + i)
                self.ring = RingAttention(comm, coefficient_dtype="bf16", mixture_block=16)
            else:
                self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim)
                init_(self.k)
                init_(self.v)
                self.ring = RingAttention(comm, codec="bf16")

        def forward(self, x):
            b, t, _ = x.shape
            h = self.ln1(x)
            if mix_k:
                k, v = self.kv(h)
                codec = self.kv.codecs()
            else:
                k, v, codec = self.k(h), self.v(h), None
            shape = (b, t, heads, hd)
            att = self.ring(self.q(h).view(shape), k.reshape(shape), v.reshape(shape),
                            codec=codec)
            x = x + self.o(att.reshape(b, t, dim))
            return x + self.mlp(self.ln2(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(256, dim)
            self.pos = nn.Parameter(torch.zeros(n * chunk, dim))
            self.blocks = nn.ModuleList(Block(i) for i in range(a.layers))
            self.ln = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, 256)
            init_(self.emb)
            init_(self.head)

        def forward(self, ids):
            x = self.emb(ids) + self.pos[me * chunk:(me + 1) * chunk]
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    model = Model()
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    train, held = corpus()
    seq = n * chunk
    data_rng = torch.Generator().manual_seed(a.seed + 7)  # same batches on every rank

    def batch(source, rng, b):
        starts = torch.randint(0, len(source) - seq - 1, (b,), generator=rng)
        rows = [torch.tensor(list(source[s:s + seq + 1]), dtype=torch.long) for s in starts]
        x = torch.stack(rows)
        lo, hi = me * chunk, (me + 1) * chunk
        return x[:, lo:hi], x[:, lo + 1:hi + 1]

    def ring_bytes():
        c = comm.bytes_by_class()
        return c["slow_sent"] + c["fast_sent"]

    # Per step and this rank: [step, ring (attention over the ring, forward + backward), in
    # the ring's calls (waiting on the link, encode, decode), gradient all-reduce, optimizer].
    split, ring_b, losses = [], [], []
    for step in range(a.steps):
        x, y = batch(train, data_rng, a.batch)
        comm.barrier()
        timers.reset()
        t0 = time.perf_counter()
        b0 = ring_bytes()
        loss = nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        b1 = ring_bytes()
        t1 = time.perf_counter()
        for p in model.parameters():
            if p.grad is not None:
                p.grad = p.grad.contiguous()  # MixtureProjection's U gets a strided gradient
                comm.all_reduce(p.grad, op="mean")
        t2 = time.perf_counter()
        opt.step()
        if mix_k:
            for blk in model.blocks:
                blk.kv.refresh_basis_()
        t3 = time.perf_counter()
        split.append([t3 - t0, timers.attention, timers.calls, t2 - t1, t3 - t2])
        ring_b.append(b1 - b0)
        losses.append(loss.item())
    grad_tensors = sum(1 for p in model.parameters() if p.grad is not None)
    message_s = probe_message_time(comm, lbcc, torch)
    # Held-out loss: fixed batches from the last 10 %, mean over the ranks' chunks.
    eval_rng = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        tot = 0.0
        for _ in range(a.eval_batches):
            x, y = batch(held, eval_rng, a.batch)
            tot += nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)).item()
    mean = torch.tensor([tot / a.eval_batches], dtype=torch.float32)
    comm.all_reduce(mean, op="mean")
    # Every rank's split, step by step, to rank 0 (a sum of rows only one rank fills).
    # (float32: the ring's all-reduce types; other ranks add exact zeros to each value.)
    every = torch.zeros((n, a.steps, len(SPLIT)), dtype=torch.float32)
    every[me] = torch.tensor(split, dtype=torch.float32)
    comm.all_reduce(every, op="sum")
    if me == 0:
        skip = min(2, len(split) - 1)
        steps = every[:, skip:, :].tolist()  # [rank][step][field]
        rec = {"codec": a.codec, "seed": a.seed, "heldout": mean.item(),
               "train_last": statistics.mean(losses[-5:]),
               "step_s": statistics.median(row[0][0] for row in zip(*steps)),
               "ring_bytes_step": statistics.median(ring_b[skip:]),
               "params": sum(p.numel() for p in model.parameters()),
               "grad_tensors": grad_tensors, "message_s": message_s,
               "tokens_per_rank": chunk, "batch": a.batch,
               "dim": dim, "heads": heads, "layers": a.layers, "ranks": n,
               # Per rank: the median over steps of each field of SPLIT.
               "split": [{f: statistics.median(st[i] for st in steps[r])
                          for i, f in enumerate(SPLIT)} for r in range(n)],
               # The ring's time per step: its slowest rank (the passes end together).
               "ring_s": statistics.median(max(steps[r][j][1] for r in range(n))
                                           for j in range(len(steps[0])))}
        with open(a.result, "a") as f:
            f.write(json.dumps(rec) + "\n")
    comm.close()


# ---------------------------------------------------------------------------------- driver ---

def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def attention_rate_probe(a, reps=20):
    """GFLOP/s of one block's attention, forward and backward as lbcc.torch.RingAttention
    computes it (scores, online-softmax update, P V; then the scores again, dV, dP, dS, dQ,
    dK), in this process alone on one thread, before the ranks start: the rate a rank would
    have with a core to itself (the plan's shared-cores variant divides the cores itself).
    Counted as the plan counts it: 14 B T^2 d flops per block."""
    import torch
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    heads = 4
    b, t, hd = a.batch, a.chunk, a.dim // heads
    q, k, v, do = (torch.randn(b, heads, t, hd, generator=g) for _ in range(4))
    scale = 1.0 / math.sqrt(hd)
    times = []
    for _ in range(reps + 3):
        t0 = time.perf_counter()
        s = (q @ k.transpose(-1, -2)) * scale
        m = s.amax(dim=-1)
        p = torch.exp(s - m.unsqueeze(-1))
        l = p.sum(dim=-1)
        o = (p @ v) / l.unsqueeze(-1)
        lse = m + torch.log(l)
        delta = (do * o).sum(dim=-1, keepdim=True)
        s = (q @ k.transpose(-1, -2)) * scale
        p = torch.exp(s - lse.unsqueeze(-1))
        dv = p.transpose(-1, -2) @ do
        ds = p * (do @ v.transpose(-1, -2) - delta)
        dq = (ds @ k) * scale
        dk = (ds.transpose(-1, -2) @ q) * scale
        times.append(time.perf_counter() - t0)
        del dv, dq, dk
    flops = 14.0 * b * t * t * a.dim
    return flops / statistics.median(times[3:]) / 1e9


def run_one(a, codec, seed, tmp, result):
    port = 20000 + (os.getpid() * 31 + seed * 7 + len(codec)) % 20000
    argv = [sys.executable, os.path.abspath(__file__), "--worker", "--codec", codec,
            "--seed", str(seed), "--steps", str(a.steps), "--chunk", str(a.chunk),
            "--dim", str(a.dim), "--layers", str(a.layers), "--batch", str(a.batch),
            "--lr", str(a.lr), "--eval-batches", str(a.eval_batches), "--result", result]
    base = {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1",
            "WORLD_SIZE": str(a.ranks), "PYTHONDONTWRITEBYTECODE": "1"}
    name = f"lc{os.getpid()}"
    procs = []
    try:
        if a.where == "testbed":
            subprocess.run([TESTBED, "down", "--stale"], capture_output=True)
            slow = ",".join(str(r) for r in range(a.ranks))
            subprocess.run([TESTBED, "up", "--name", name, "--hosts", str(a.ranks), "--rate",
                            a.rate, "--slow", slow, "--uplink", "--owner-pid",
                            str(os.getpid())], check=True, capture_output=True)
            addr = [subprocess.run([TESTBED, "addr", "--name", name, str(r)], check=True,
                                   capture_output=True, text=True).stdout.strip()
                    for r in range(a.ranks)]
        else:
            addr = ["127.0.0.1"] * a.ranks
        for r in range(a.ranks):
            env = dict(base, RANK=str(r), LBCC_BOOTSTRAP_ADDR=f"{addr[0]}:{port}",
                       LBCC_LISTEN_ADDR=addr[r])
            if a.where == "testbed":
                env.update(UCX_TLS="tcp", UCX_NET_DEVICES="eth0", UCX_MEM_EVENTS="no",
                           LBCC_SLOW_RANKS=",".join(str(i) for i in range(a.ranks)))
                cmd = [TESTBED, "exec", "--name", name, str(r), "--", "env",
                       *[f"{k}={v}" for k, v in env.items()], *argv]
            else:
                cmd = ["env", *[f"{k}={v}" for k, v in env.items()], *argv]
            log = open(os.path.join(tmp, f"{codec}_{seed}_rank{r}.log"), "w")
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        for r, p in enumerate(procs):
            if p.wait(timeout=3600) != 0:
                sys.exit(f"long_context: rank {r} failed ({codec}, seed {seed}; logs in {tmp})")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if a.where == "testbed":
            subprocess.run([TESTBED, "down", "--name", name], capture_output=True)


def rate_bits(rate):
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for u, f in units.items():
        if rate.endswith(u):
            return float(rate[:-len(u)]) * f
    return float(rate)


def mean_sd(xs):
    xs = list(xs)
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def codec_fields(codec):
    """The plan's ring codec fields for one of this script's codecs."""
    if codec.startswith("mix"):
        return {"codec": "subspace", "k": int(codec[3:]), "components": 4, "mixture_block": 16}
    return {"codec": codec}


def measured_split(rec):
    """One run's split on its busiest rank (the last: causal attention gives it every block),
    seconds per step (medians over steps): the ring's block compute, the ring's calls (waiting
    on the link, encode, decode), the gradient all-reduce, the rest (non-ring forward and
    backward, optimizer), and the block attention's flop rate there."""
    last = rec["split"][-1]
    compute = last["attention"] - last["ring_calls"]
    t, b, d = rec["tokens_per_rank"], rec["batch"], rec["dim"]
    # The plan's count (plan/ring.h): 4 B T^2 d forward, 10 B T^2 d backward per block; the
    # last rank attends to all `ranks` blocks in every layer.
    flops = rec["layers"] * rec["ranks"] * 14.0 * b * t * t * d
    return {"step": last["step"], "ring": rec["ring_s"], "compute": compute,
            "link": last["ring_calls"], "allreduce": last["allreduce"],
            "rest": last["step"] - last["attention"] - last["allreduce"],
            "gflops": flops / compute / 1e9}


def plan_row(a, rec, split, mbit=None, params=None, shared=False):
    """The planner's step for this run (lbcc.plan.ring), fed the link rate, the probe's
    per-message time, the measured rest of the step, the model's shape and a block attention
    rate: the busiest rank's as measured in the run (its cores' sharing included), or with
    `shared` the driver's probe alone on a core and the machine's cores shared by the ranks
    (cpu.shared_cores)."""
    import lbcc.plan
    job = lbcc.plan.ring_job(
        context=rec["ranks"] * rec["tokens_per_rank"], ranks=rec["ranks"],
        link_mbit=mbit if mbit is not None else rate_bits(a.rate) / 1e6, d=rec["dim"],
        attention_gflops=rec["probe_gflops"] if shared else split["gflops"],
        batch=rec["batch"], heads=rec["heads"], layers=rec["layers"], other_s=split["rest"],
        params=rec["params"] if params is None else params, grad_tensors=rec["grad_tensors"],
        message_ms=rec["message_s"] * 1e3, **codec_fields(rec["codec"]))
    if shared:
        job["cpu"] = {"shared_cores": os.cpu_count()}
    return lbcc.plan.predict(job)


def goal_sentence(a, by_codec):
    """What the <= 1/10 step-time goal needs, from the planner fed this run's measured compute:
    the link rate (equivalently, the compute speed-up at --rate) at which the strongest
    compression's step is 1/10 of bf16's, with and without the per-step dense gradient
    all-reduce on the same links."""
    codecs = [c for c in a.codecs.split(",") if c in by_codec]
    if "bf16" not in by_codec or len(codecs) < 2:
        return ""
    strongest = codecs[-1]
    base_rec, base_split = by_codec["bf16"]
    rec, split = by_codec[strongest]
    here = rate_bits(a.rate) / 1e6
    rates = [here * 10 ** (i / 32) for i in range(-128, 65)]

    def ratios(params):
        out = []
        for mbit in rates:
            b = plan_row(a, base_rec, base_split, mbit, params)["step_s"]
            m = plan_row(a, rec, split, mbit, params)["step_s"]
            out.append((b / m, mbit))
        return out

    with_ar = ratios(None)
    best, best_mbit = max(with_ar)
    without = ratios(0)
    ok = [mbit for r, mbit in without if r >= 10]
    measured = by_codec[strongest][1]["step"] / base_split["step"]
    wire = base_rec["ring_bytes_step"] * 8 / rate_bits(a.rate)
    bound = "compute" if base_split["compute"] > wire else "wire"
    text = (f"Goal (step time of {strongest} <= 1/10 of bf16's): measured here "
            f"{measured:.2f}x, {'met' if measured <= 0.1 else 'not met'}; bf16's ring is "
            f"{bound}-bound here (block compute {base_split['compute']:.3f} s vs its wire "
            f"{wire:.3f} s per step, the rest of the step {base_split['rest']:.3f} s, the "
            f"gradient all-reduce {base_split['allreduce']:.3f} s). The plan fed this run's "
            f"measured compute: with the dense gradient all-reduce on the same links every "
            f"step (its bytes the same for every codec) bf16/{strongest} is at most {best:.1f}x "
            f"(at {best_mbit:.3g} Mbit/s; {rates[0]:.3g} to {rates[-1]:.3g} Mbit/s scanned)")
    if ok:
        top = max(ok)
        text += (f"; without it (gradients synchronised elsewhere or rarely), 1/10 needs links "
                 f"of at most {top:.3g} Mbit/s at this compute, i.e. compute "
                 f"{here / top:.3g}x faster at {a.rate} (bf16's ring wire >= "
                 f"{base_rec['ring_bytes_step'] * 8 / (top * 1e6) / base_split['compute']:.3g}x "
                 f"its block compute).")
    else:
        text += f"; even without it, 1/10 is not reached at any rate from {rates[0]:.3g} Mbit/s."
    return text


def plot(a, by_seed, plans, path):
    """Held-out loss vs ring bytes per step, and the step time's split, per codec (mean over
    seeds; error bars: the seeds' standard deviation)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    codecs = [c for c in a.codecs.split(",") if c in by_seed]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 6))
    for codec in codecs:
        runs = by_seed[codec]
        kb = mean_sd(r["ring_bytes_step"] / 1e3 for r, _ in runs)
        loss = mean_sd(r["heldout"] for r, _ in runs)
        left.errorbar([kb[0]], [loss[0]], xerr=[kb[1]], yerr=[loss[1]], fmt="o", capsize=4,
                      label=codec)
    left.set_xscale("log")
    left.set_xlabel("ring kB sent per step and rank")
    left.set_ylabel("held-out loss (mean +- std over seeds)")
    left.grid(alpha=0.3)
    left.legend()
    parts = [("compute", "ring block compute"), ("link", "ring calls (link wait, codec)"),
             ("allreduce", "gradient all-reduce"), ("rest", "rest (non-ring, optimizer)")]
    bottom = [0.0] * len(codecs)
    for key, label in parts:
        vals = [mean_sd(sp[key] for _, sp in by_seed[c])[0] for c in codecs]
        right.bar(codecs, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    step = [mean_sd(sp["step"] for _, sp in by_seed[c]) for c in codecs]
    right.errorbar(codecs, [m for m, _ in step], yerr=[sd for _, sd in step], fmt="none",
                   ecolor="k", capsize=6)
    wire = [statistics.mean(r["ring_bytes_step"] for r, _ in by_seed[c]) * 8 /
            rate_bits(a.rate) for c in codecs]
    if a.where == "testbed":
        right.plot(codecs, wire, "kx", markersize=10, label=f"ring wire at {a.rate}")
    if plans:
        right.plot(codecs, [plans[c] for c in codecs], "k_", markersize=30, mew=2,
                   label="plan's step (lbcc.plan.ring)")
    right.set_ylabel("seconds per step (busiest rank, median over steps)")
    right.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=3)
    right.grid(alpha=0.3, axis="y")
    fig.suptitle(f"long context over the K/V ring: {a.ranks} ranks, {a.where}"
                 + (f" {a.rate}" if a.where == "testbed" else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def render(a, recs, meta):
    lines = [
        "# Long context over the compressed K/V ring (issue 46, item 4)",
        "",
        "Written by `examples/long_context/long_context.py`; do not edit by hand. Setup: the "
        "script's doc.",
        "",
        f"- date: {meta['date']} ({meta['seconds']:.0f} s)",
        f"- machine: {platform.node()}, {platform.platform()}, {os.cpu_count()} cores (shared "
        f"with other sessions), load average {meta['load_before']} before, "
        f"{meta['load_after']} after",
        f"- tree: {meta['tree']}",
        f"- command: `{meta['command']}`",
        f"- setup: {a.ranks} ranks ({a.where}" + (f", every rank behind a {a.rate} tbf link, "
        "down and up" if a.where == "testbed" else "") + f"), context {a.ranks * a.chunk} bytes "
        f"({a.chunk} per rank), batch {a.batch}, d {a.dim}, 4 heads, {a.layers} layers, "
        f"{a.steps} steps of Adam (lr {a.lr}), held-out loss over {a.eval_batches} batches",
        "- ring bytes: what rank 0 sent during one step's forward and backward (the ring's "
        "passes only; the gradient all-reduce comes after); wire time = those bytes / link rate "
        "(rank 0 sends on one link per round)",
        "- plot: [long_context.png](long_context.png) (held-out loss vs ring bytes; the step's "
        "split)",
        "",
        "| codec | ring bytes saved vs bf16 | held-out loss (mean +- std over seeds) | "
        "train loss (last 5) | ring kB per step (rank 0) | wire s per step at the rate | "
        "step s (median, all in) | seeds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_seed, by_codec = {}, {}
    base = None
    codecs = [c for c in a.codecs.split(",") if any(r["codec"] == c for r in recs)]
    for codec in codecs:
        mine = [r for r in recs if r["codec"] == codec]
        by_seed[codec] = [(r, measured_split(r)) for r in mine]
        held = [r["heldout"] for r in mine]
        kb = statistics.mean(r["ring_bytes_step"] for r in mine) / 1e3
        if codec == "bf16":
            base = kb
        saved = "-" if base is None or codec == "bf16" else f"{100 * (1 - kb / base):.1f} %"
        wire = kb * 1e3 * 8 / rate_bits(a.rate) if a.where == "testbed" else float("nan")
        sd = statistics.stdev(held) if len(held) > 1 else 0.0
        lines.append(
            f"| {codec} | {saved} | {statistics.mean(held):.4f} +- {sd:.4f} | "
            f"{statistics.mean(r['train_last'] for r in mine):.4f} | {kb:.1f} | "
            f"{wire:.3f} | {statistics.mean(r['step_s'] for r in mine):.3f} | {len(mine)} |")
    lines += [
        "",
        "## Where a step goes",
        "",
        f"Per step on the busiest rank (rank {a.ranks - 1}: causal attention gives it every "
        "block), medians over steps, mean over seeds (+- std). Ring = the time inside ring "
        "attention (forward and backward, every layer; its slowest rank), of which *calls* is "
        "the time in lbcc.ContextRing's calls (waiting on the link, encoding, decoding) and "
        "*compute* the rest (block attention). Wire = ring bytes / link rate. Rest = the step "
        "less ring attention and the all-reduce (non-ring forward and backward, optimizer, "
        "basis refresh). The issue's overlap goal: ring <= 1.1 x max(compute, wire).",
        "",
        "| codec | step s | ring s | ring compute s | ring calls s | wire s | ring / max(compute, "
        "wire) | gradient all-reduce s | rest s | block attention GFLOP/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for codec in codecs:
        runs = by_seed[codec]
        f = {k: mean_sd(sp[k] for _, sp in runs)
             for k in ("step", "ring", "compute", "link", "allreduce", "rest", "gflops")}
        link = rate_bits(a.rate) if a.where == "testbed" else math.inf  # loopback: no wire
        wire = statistics.mean(r["ring_bytes_step"] for r, _ in runs) * 8 / link
        ratio = mean_sd(sp["ring"] / max(sp["compute"], r["ring_bytes_step"] * 8 / link)
                        for r, sp in runs)
        by_codec[codec] = (dict(runs[0][0], ring_bytes_step=statistics.mean(
            r["ring_bytes_step"] for r, _ in runs)), {k: v[0] for k, v in f.items()})
        lines.append(
            f"| {codec} | {f['step'][0]:.3f} +- {f['step'][1]:.3f} | "
            f"{f['ring'][0]:.3f} +- {f['ring'][1]:.3f} | {f['compute'][0]:.3f} | "
            f"{f['link'][0]:.3f} | {wire:.3f} | {ratio[0]:.2f} +- {ratio[1]:.2f} | "
            f"{f['allreduce'][0]:.3f} | {f['rest'][0]:.3f} | {f['gflops'][0]:.2f} |")
    lines += [
        "",
        "Per rank (means over seeds of the per-run medians): ring compute / ring calls, s per "
        "step; the ranks share the machine's cores, so the last column is every rank's ring "
        f"compute over the {os.cpu_count()} cores, a floor for the ring when they compute at "
        "once.",
        "",
        "| codec | " + " | ".join(f"rank {r}" for r in range(a.ranks)) +
        " | all ranks' ring compute / cores s | ring s |",
        "|---|" + "---|" * (a.ranks + 2),
    ]
    for codec in codecs:
        runs = by_seed[codec]
        cells, total = [], 0.0
        for r in range(a.ranks):
            comp = statistics.mean(x["split"][r]["attention"] - x["split"][r]["ring_calls"]
                                   for x, _ in runs)
            calls = statistics.mean(x["split"][r]["ring_calls"] for x, _ in runs)
            total += comp
            cells.append(f"{comp:.3f} / {calls:.3f}")
        lines.append(f"| {codec} | " + " | ".join(cells) +
                     f" | {total / os.cpu_count():.3f} | "
                     f"{statistics.mean(sp['ring'] for _, sp in runs):.3f} |")
    plans = {}
    if a.where != "testbed":
        lines += ["", "(loopback: no link rate, so no wire time and no plan.)"]
    else:
        plans = plan_table(a, codecs, by_seed, lines)
    png = os.path.splitext(a.out)[0] + ".png"
    plot(a, by_seed, plans, png)
    lines += ["", f"Parameters: {recs[0]['params'] if recs else 0} (bf16 model).", ""]
    if a.where == "testbed":
        goal = goal_sentence(a, by_codec)
        if goal:
            lines += [goal, ""]
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


def plan_table(a, codecs, by_seed, lines):
    """The planner's rows beside the measured ones; returns the mean planned step per codec."""
    plans = {}
    lines += [
        "",
        "## The plan against the run",
        "",
        "`lbcc.plan.ring` (plan/ring.h, docs/context_parallel.md, \"Planning\") per run, fed "
        f"that run's measured block attention rate (busiest rank), its measured rest of the "
        f"step, the link rate ({a.rate}, no added latency), the per-message time a probe "
        f"measured after training (an empty ring round: 4-byte raw blocks, no compute) and the "
        f"model's shape; it predicts "
        "the ring (wire from the codec's payload sizes, overlapped round by round with the "
        "compute) and the dense gradient all-reduce. Means over seeds of per-run values.",
        "",
        "| codec | k | probe ms per message | plan ring kB per step | measured | plan ring s | "
        "measured | "
        "plan / measured | plan all-reduce s | measured | plan step s | measured | "
        "plan / measured |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    shared_lines = [
        "",
        "The same plan fed instead the block attention rate of a probe in the driver (the "
        "same block's forward and backward, alone on a core, before each run) and the "
        f"machine's {os.cpu_count()} cores shared by the {a.ranks} ranks (cpu.shared_cores: "
        "ranks computing in the same round share them):",
        "",
        "| codec | probe GFLOP/s (alone) | measured GFLOP/s (busiest rank, in the run) | "
        "plan ring s | measured | plan / measured | plan step s | measured | "
        "plan / measured |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for codec in codecs:
        runs = by_seed[codec]
        preds = [(plan_row(a, r, sp), r, sp) for r, sp in runs]
        m = lambda fn: statistics.mean(fn(p, r, sp) for p, r, sp in preds)  # noqa: E731
        lines.append(
            f"| {codec} | {preds[0][0]['k'] or '-'} | "
            f"{m(lambda p, r, sp: r['message_s']) * 1e3:.2f} | "
            f"{m(lambda p, r, sp: p['ring_bytes_step']) / 1e3:.1f} | "
            f"{m(lambda p, r, sp: r['ring_bytes_step']) / 1e3:.1f} | "
            f"{m(lambda p, r, sp: p['ring_s']):.3f} | {m(lambda p, r, sp: sp['ring']):.3f} | "
            f"{m(lambda p, r, sp: p['ring_s'] / sp['ring']):.2f} | "
            f"{m(lambda p, r, sp: p['allreduce_s']):.3f} | "
            f"{m(lambda p, r, sp: sp['allreduce']):.3f} | "
            f"{m(lambda p, r, sp: p['step_s']):.3f} | {m(lambda p, r, sp: sp['step']):.3f} | "
            f"{m(lambda p, r, sp: p['step_s'] / sp['step']):.2f} |")
        plans[codec] = m(lambda p, r, sp: p["step_s"])
        sh = [(plan_row(a, r, sp, shared=True), r, sp) for r, sp in runs]
        ms = lambda fn: statistics.mean(fn(p, r, sp) for p, r, sp in sh)  # noqa: E731
        shared_lines.append(
            f"| {codec} | {ms(lambda p, r, sp: r['probe_gflops']):.2f} | "
            f"{ms(lambda p, r, sp: sp['gflops']):.2f} | {ms(lambda p, r, sp: p['ring_s']):.3f} | "
            f"{ms(lambda p, r, sp: sp['ring']):.3f} | "
            f"{ms(lambda p, r, sp: p['ring_s'] / sp['ring']):.2f} | "
            f"{ms(lambda p, r, sp: p['step_s']):.3f} | {ms(lambda p, r, sp: sp['step']):.3f} | "
            f"{ms(lambda p, r, sp: p['step_s'] / sp['step']):.2f} |")
    lines += shared_lines
    return plans


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--codec", default="bf16")
    ap.add_argument("--codecs", default="bf16,mix6,mix3")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-batches", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--where", choices=["testbed", "loopback"], default="testbed")
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--result", default="")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "long_context.md"))
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    if a.where == "testbed":
        check = subprocess.run([TESTBED, "check"], capture_output=True, text=True)
        if check.returncode != 0:
            sys.exit(f"long_context: the testbed is not usable here: {check.stdout}"
                     f"{check.stderr}")
    tmp = tempfile.mkdtemp(prefix="long_context_")
    result = os.path.join(tmp, "records.jsonl")
    load_before, t0 = loadavg(), time.time()
    probes = {}
    for seed in range(a.seeds):
        for codec in a.codecs.split(","):
            print(f"== {codec} seed {seed}", flush=True)
            probes[(codec, seed)] = attention_rate_probe(a)
            run_one(a, codec, seed, tmp, result)
    recs = [json.loads(l) for l in open(result)]
    for r in recs:
        r["probe_gflops"] = probes[(r["codec"], r["seed"])]
    rev = subprocess.run(["git", "-C", ROOT, "log", "-1", "--format=%h %s"],
                         capture_output=True, text=True).stdout.strip()
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "seconds": time.time() - t0, "load_before": load_before, "load_after": loadavg(),
            "tree": rev,
            "command": " ".join(["examples/long_context/long_context.py"] + sys.argv[1:])}
    with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
        json.dump({"meta": meta, "records": recs}, f, indent=1)
    render(a, recs, meta)


if __name__ == "__main__":
    main()
