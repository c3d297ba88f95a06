#!/usr/bin/env python3
"""Heterogeneous low-bandwidth pre-training at toy scale: runs, CSVs, plots, summary table.

    hetero.py --preset demo|full|smoke [--runs a,b] [--out DIR] [--no-testbed] [--readme PATH]

Layout "hetero": ranks 0 and 1 are full replicas on a fast island; ranks 2 and 3 are the two
stages of a pipeline replica, each behind a 100 Mbit/s down-link (tools/testbed network
namespaces; with --no-testbed or without root: 127.0.0.1 with those links marked slow in the
topology and paced by LBCC_SLOW_PACE_MBITS). Layout "allpipe": three pipeline replicas (ranks
0-3 on the fast island, 4-5 behind slow links). Every rank is a process (torch, one thread).
"""

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
TESTBED = os.path.join(ROOT, "tools", "testbed", "testbed")

LAYOUTS = {
    "hetero": {"nranks": 4, "islands": [[0, 1]],
               "replicas": [{"kind": "full", "rank": 0}, {"kind": "full", "rank": 1},
                            {"kind": "pipeline", "stages": [2, 3]}]},
    "allpipe": {"nranks": 6, "islands": [[0, 1, 2, 3]],
                "replicas": [{"kind": "pipeline", "stages": [0, 1]},
                             {"kind": "pipeline", "stages": [2, 3]},
                             {"kind": "pipeline", "stages": [4, 5]}]},
}
SLOW_HOSTS = {"hetero": "2,3", "allpipe": "4,5"}

# name: (layout, method, boundary k (0: uncompressed fp32), what it shows)
RUNS = {
    "ddp": ("hetero", "ddp", 0, "dense DDP: fp32 gradient all-reduce every step"),
    "diloco": ("hetero", "diloco", 0, "DiLoCo: dense fp32 outer sync every H steps"),
    "sparseloco": ("hetero", "sparseloco", 0, "SparseLoCo, boundary uncompressed"),
    "hetero_k16": ("hetero", "sparseloco", 8, "SparseLoCo + pipeline boundary k/d=1/16"),
    "hetero_k32": ("hetero", "sparseloco", 4, "SparseLoCo + pipeline boundary k/d=1/32"),
    "allpipe_k16": ("allpipe", "sparseloco", 8, "3 pipelines, all boundaries k/d=1/16"),
    "allpipe_k32": ("allpipe", "sparseloco", 4, "3 pipelines, all boundaries k/d=1/32"),
}
PRESETS = {
    "smoke": dict(steps=20, inner_steps=10, runs=["sparseloco", "hetero_k16"]),
    "demo": dict(steps=60, inner_steps=15, runs=["ddp", "sparseloco", "hetero_k16"]),
    "full": dict(steps=300, inner_steps=15, runs=list(RUNS)),
}


def package_path(out):
    """A directory holding the `lbcc` package with its built extension."""
    if os.environ.get("LBCC_PYTHONPATH"):
        return os.environ["LBCC_PYTHONPATH"]
    so = os.path.join(ROOT, "bazel-bin", "python", "lbcc", "_lbcc.so")
    if not os.path.exists(so):
        sys.exit(f"hetero.py: {so} missing: bazel build //python:lbcc/_lbcc.so")
    stage = os.path.join(out, "pkg")
    shutil.rmtree(stage, ignore_errors=True)
    shutil.copytree(os.path.join(ROOT, "python", "lbcc"), os.path.join(stage, "lbcc"))
    shutil.copy(so, os.path.join(stage, "lbcc", "_lbcc.so"))
    return stage


def testbed_usable():
    try:
        r = subprocess.run([TESTBED, "check"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        return False, str(e)
    return r.returncode == 0, (r.stdout + r.stderr).strip()


class Net:
    """Where ranks run: testbed hosts (one namespace per rank) or 127.0.0.1."""

    def __init__(self, use_testbed, rate):
        self.testbed, self.rate, self.name, self.hosts = use_testbed, rate, None, None

    def up(self, layout):
        n = LAYOUTS[layout]["nranks"]
        if not self.testbed or (self.name and self.hosts == (n, SLOW_HOSTS[layout])):
            return
        self.down()
        self.name = f"ht{os.getpid()}"
        subprocess.run([TESTBED, "down", "--stale"], capture_output=True)
        subprocess.run([TESTBED, "up", "--name", self.name, "--hosts", str(n), "--rate", self.rate,
                        "--slow", SLOW_HOSTS[layout], "--owner-pid", str(os.getpid())],
                       check=True, capture_output=True)
        self.hosts = (n, SLOW_HOSTS[layout])

    def down(self):
        if self.name:
            subprocess.run([TESTBED, "down", "--name", self.name], capture_output=True)
            self.name = None

    def addr(self, rank):
        if not self.testbed:
            return "127.0.0.1"
        return subprocess.run([TESTBED, "addr", "--name", self.name, str(rank)], check=True,
                              capture_output=True, text=True).stdout.strip()

    def command(self, rank, env, argv):
        if self.testbed:
            pairs = [f"{k}={v}" for k, v in env.items()]
            return [TESTBED, "exec", "--name", self.name, str(rank), "--", "env", *pairs, *argv]
        return ["env", *[f"{k}={v}" for k, v in env.items()], *argv]


def tee(stream, log):
    for line in stream:
        sys.stdout.write(line)
        sys.stdout.flush()
        log.write(line)
        log.flush()


def run_one(name, cfg, net, args, pkg, out):
    layout, method, k, _ = RUNS[name]
    net.up(layout)
    rundir = os.path.join(out, name)
    shutil.rmtree(rundir, ignore_errors=True)
    os.makedirs(rundir)
    topo = dict(LAYOUTS[layout])
    topo_path = os.path.join(rundir, "topology.json")
    with open(topo_path, "w") as f:
        json.dump(topo, f)
    n = topo["nranks"]
    port = 20000 + (os.getpid() * 7 + len(name) * 131) % 20000
    base_env = {
        "PYTHONPATH": pkg, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1", "UCX_MEM_EVENTS": "no", "UCX_TLS": "tcp",
        "LBCC_TIMEOUT_S": str(args.timeout), "LBCC_LINK_PROBE_BYTES": "1M",
        "LBCC_BOOTSTRAP_ADDR": f"{net.addr(0)}:{port}", "WORLD_SIZE": str(n),
    }
    if net.testbed:
        base_env["UCX_NET_DEVICES"] = "eth0"
    else:
        base_env["UCX_NET_DEVICES"] = "lo"
        base_env["LBCC_SLOW_PACE_MBITS"] = str(int(args.rate.rstrip("mbit")))
    argv = [sys.executable, os.path.join(HERE, "worker.py"), "--method", method, "--k", str(k),
            "--steps", str(cfg["steps"]), "--inner-steps", str(cfg["inner_steps"]),
            "--topology", topo_path, "--outdir", rundir]
    if args.account:
        # Payload accounting assumes the direct exchange: each payload to every shard member.
        argv.append("--account")
        base_env["LBCC_ALGO"] = "allgatherv=direct"
    procs = []
    t0 = time.time()
    for r in range(n):
        env = dict(base_env, RANK=str(r), LBCC_LISTEN_ADDR=net.addr(r))
        log = open(os.path.join(rundir, f"rank{r}.log"), "w")
        p = subprocess.Popen(net.command(r, env, argv), stderr=subprocess.STDOUT,
                             stdout=subprocess.PIPE if r == 0 else log, text=r == 0)
        if r == 0:  # Progress lines: live on the terminal and in the log.
            threading.Thread(target=tee, args=(p.stdout, log), daemon=True).start()
        procs.append(p)
    failed = False
    deadline = t0 + args.timeout + 60
    for r, p in enumerate(procs):
        try:
            rc = p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "timeout"
        if rc != 0:
            failed = True
            print(f"  {name}: rank {r} exit {rc}; see {rundir}/rank{r}.log", flush=True)
    if failed:
        for r in range(n):
            with open(os.path.join(rundir, f"rank{r}.log")) as f:
                tail = f.read()[-1500:]
            print(f"---- {name} rank {r} log tail\n{tail}", file=sys.stderr)
        return None
    return summarize(name, rundir, n, time.time() - t0)


def summarize(name, rundir, n, wall):
    logs = [json.load(open(os.path.join(rundir, f"rank{r}.json"))) for r in range(n)]
    steps = len(logs[0]["steps"])
    rows = []
    for i in range(steps):
        losses = [lg["steps"][i][1] for lg in logs if lg["steps"][i][1] is not None]
        rows.append([i + 1, sum(losses) / len(losses), sum(lg["steps"][i][2] for lg in logs),
                     sum(lg["steps"][i][3] for lg in logs)])
    with open(os.path.join(rundir, "metrics.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "loss", "fast_link_bytes", "slow_link_bytes"])
        w.writerows(rows)
    tail = max(1, steps // 10)
    evals = [lg["eval_loss"] for lg in logs if lg["eval_loss"] is not None]
    summary = {
        "run": name, "steps": steps, "first_loss": rows[0][1],
        "train_loss": sum(r[1] for r in rows[-tail:]) / tail,
        "eval_loss": evals[0], "eval_losses": evals,
        "fast_bytes": rows[-1][2], "slow_bytes": rows[-1][3],
        "dp_slow_bytes": sum(lg["final_counters"]["dp_slow_sent"] for lg in logs),
        "stage_bytes": sum(lg["final_counters"]["stage_sent"] for lg in logs),
        "train_seconds": max(lg["train_seconds"] for lg in logs), "wall_seconds": wall,
        "identical": all(ok for lg in logs for _, ok in lg["identical"]),
        "outer_checks": len(logs[0]["identical"]),
        "payload": {r: lg["payload"] for r, lg in enumerate(logs)},
        "stage_link": {r: lg.get("stage_link") for r, lg in enumerate(logs) if lg.get("stage_link")},
        "slow_sent_by_rank": {r: lg["final_counters"]["slow_sent"] for r, lg in enumerate(logs)},
        "kinds": {r: (lg["kind"], lg["stage"]) for r, lg in enumerate(logs)},
    }
    with open(os.path.join(rundir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def plot(results, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in results:
        with open(os.path.join(out, name, "metrics.csv")) as f:
            rows = list(csv.DictReader(f))
        step = [int(r["step"]) for r in rows]
        loss = [float(r["loss"]) for r in rows]
        slow = [max(1, int(r["slow_link_bytes"])) / 1e6 for r in rows]
        a1.plot(step, loss, label=name)
        a2.plot(slow, loss, label=name)
    a1.set_xlabel("step")
    a1.set_ylabel("training loss (mean over replicas)")
    a2.set_xlabel("slow-link bytes (MB, all ranks, sent)")
    a2.set_xscale("log")
    a2.set_ylabel("training loss")
    a1.legend()
    a2.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "loss.png")
    fig.savefig(path, dpi=90)
    # One plot per run as well.
    for name in results:
        with open(os.path.join(out, name, "metrics.csv")) as f:
            rows = list(csv.DictReader(f))
        fig, (b1, b2) = plt.subplots(1, 2, figsize=(10, 4))
        b1.plot([int(r["step"]) for r in rows], [float(r["loss"]) for r in rows])
        b1.set_xlabel("step"), b1.set_ylabel("loss"), b1.set_title(name)
        b2.plot([int(r["slow_link_bytes"]) / 1e6 for r in rows], [float(r["loss"]) for r in rows])
        b2.set_xlabel("slow-link MB"), b2.set_ylabel("loss")
        fig.tight_layout()
        fig.savefig(os.path.join(out, name, "loss.png"), dpi=80)
        plt.close(fig)
    return path


def table(results, cfg, missing, net_desc):
    lines = [f"Preset: {cfg['steps']} steps, H = {cfg['inner_steps']}, {net_desc}.", "",
             "| run | what | final train loss | held-out loss | slow-link MB | of which data-parallel MB "
             "| fast-link MB | data-parallel slow vs ddp | train s | replicas identical |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    ddp = results.get("ddp")
    for name, s in results.items():
        ratio = (f"{ddp['dp_slow_bytes'] / s['dp_slow_bytes']:.0f}x less"
                 if ddp and s["dp_slow_bytes"] else "-")
        if name == "ddp":
            ratio = "1x"
        lines.append(
            f"| {name} | {RUNS[name][3]} | {s['train_loss']:.3f} | {s['eval_loss']:.3f} "
            f"| {s['slow_bytes'] / 1e6:.2f} | {s['dp_slow_bytes'] / 1e6:.2f} "
            f"| {s['fast_bytes'] / 1e6:.2f} | {ratio} "
            f"| {s['train_seconds']:.0f} | {'yes' if s['identical'] else 'NO'} "
            f"({s['outer_checks']} checks) |")
    for name, why in missing.items():
        lines.append(f"| {name} | {RUNS[name][3]} | not run: {why} | | | | | | | |")
    return "\n".join(lines)


def write_readme(path, text):
    begin, end = "<!-- results:begin -->", "<!-- results:end -->"
    with open(path) as f:
        doc = f.read()
    if begin in doc and end in doc:
        doc = doc[:doc.index(begin) + len(begin)] + "\n" + text + "\n" + doc[doc.index(end):]
        with open(path, "w") as f:
            f.write(doc)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=list(PRESETS), default="demo")
    ap.add_argument("--runs", help="comma-separated subset of " + ",".join(RUNS))
    ap.add_argument("--steps", type=int)
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "lbcc_hetero"))
    ap.add_argument("--no-testbed", action="store_true")
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--account", action="store_true")
    ap.add_argument("--readme", help="README whose results section gets the table")
    args = ap.parse_args()
    cfg = dict(PRESETS[args.preset])
    if args.runs:
        cfg["runs"] = args.runs.split(",")
    if args.steps:
        cfg["steps"] = args.steps
    os.makedirs(args.out, exist_ok=True)
    pkg = package_path(args.out)
    use_tb = False
    if not args.no_testbed:
        use_tb, why = testbed_usable()
        if not use_tb:
            print(f"testbed unavailable ({why}): falling back to 127.0.0.1, slow links marked "
                  f"slow in the topology and paced at {args.rate}", flush=True)
    net = Net(use_tb, args.rate)
    net_desc = (f"tools/testbed namespaces, slow down-links shaped to {args.rate}" if use_tb else
                f"127.0.0.1 (no testbed): slow links marked in the topology, paced to {args.rate}")
    print(f"== hetero_training: {len(cfg['runs'])} runs, {cfg['steps']} steps each, "
          f"H = {cfg['inner_steps']}; {net_desc}; results in {args.out}", flush=True)
    results, missing = {}, {}
    try:
        for i, name in enumerate(cfg["runs"]):
            print(f"== [{i + 1}/{len(cfg['runs'])}] {name}: {RUNS[name][3]}", flush=True)
            s = run_one(name, cfg, net, args, pkg, args.out)
            if s is None:
                missing[name] = "failed (see logs)"
            else:
                results[name] = s
                print(f"   {name}: loss {s['first_loss']:.3f} -> {s['train_loss']:.3f}, "
                      f"held-out {s['eval_loss']:.3f}, slow {s['slow_bytes'] / 1e6:.2f} MB, "
                      f"{s['train_seconds']:.0f} s", flush=True)
    finally:
        net.down()
    for name in RUNS:
        if name not in results and name not in missing:
            missing[name] = f"not in preset {args.preset}"
    text = table(results, cfg, missing, net_desc)
    if results:
        text += f"\n\nPlot: `{os.path.relpath(plot(results, args.out), args.out)}` in the output directory."
    if "ddp" in results and "sparseloco" in results and results["sparseloco"]["slow_bytes"]:
        d, sp = results["ddp"], results["sparseloco"]
        text += (f"\n\nSparseLoCo vs dense DDP slow-link bytes: "
                 f"{d['slow_bytes'] / sp['slow_bytes']:.0f}x less in total (both carry the same "
                 f"uncompressed pipeline boundary), "
                 f"{d['dp_slow_bytes'] / max(sp['dp_slow_bytes'], 1):.0f}x less for data-parallel "
                 f"synchronisation alone (stage-link bytes measured and subtracted).")
    for kk in ("k16", "k32"):
        h, p = results.get(f"hetero_{kk}"), results.get(f"allpipe_{kk}")
        if h and p:
            verdict = "no worse" if h["eval_loss"] <= p["eval_loss"] + 1e-3 else "WORSE"
            text += (f"\nHeterogeneous vs all-compressed at {kk}: held-out loss {h['eval_loss']:.3f} "
                     f"vs {p['eval_loss']:.3f} ({verdict}).")
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"config": cfg, "results": results, "missing": missing}, f, indent=1)
    print("\n" + text)
    if args.readme:
        write_readme(args.readme, text)
    return 0 if results and not any(v.startswith("failed") for v in missing.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
