#!/usr/bin/env python3
"""Heterogeneous low-bandwidth pre-training at toy scale: runs, CSVs, plots, summary table.

    hetero.py --preset demo|full|smoke|grid [--runs a,b] [--out DIR] [--no-testbed] [--readme PATH]
              [--overlap none|delayed|streaming [--fragments F]]

Run names: ddp | diloco | sparseloco | {hetero,allpipe}_k<D>[_<mode>] | control_k<D>, each
optionally suffixed _s<seed>. k/d = 1/D is the compressed boundaries' rank; mode is the boundary
design, lossy (the seed paper's authors': nothing constrained, T the synced embedding; the
default) or constrained (Protocol Models: stage 0's residual writes kept in span(U));
control_k<D> is hetero_k<D>_constrained with the full replicas projected after every inner step
too (it must match allpipe_k<D>_constrained).

Layout "hetero": ranks 0 and 1 are full replicas on a fast island; ranks 2 and 3 are the two
stages of a pipeline replica, each behind a 100 Mbit/s down-link (tools/testbed network
namespaces; with --no-testbed or without root: 127.0.0.1 with those links marked slow in the
topology and paced by LBCC_SLOW_PACE_MBITS). Layout "allpipe": three pipeline replicas (ranks
0-3 on the fast island, 4-5 behind slow links), every boundary compressed ("compress-all").
Every rank is a process (torch, one thread).

--overlap delayed|streaming: SparseLoCo runs with an uncompressed boundary ("sparseloco") post
their outer exchange and merge it later (lbcc.torch.SparseLoCo(overlap=), docs/overlap.md);
the table's utilization column is each rank's inner-step time over its training wall time
(outer steps, DDP all-reduces and identity checks excluded from the inner steps), per replica.
"""

import argparse
import csv
import json
import math
import os
import re
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

MODES = ("lossy", "constrained")
MODE_WHAT = {"lossy": "lossy boundary (T = synced embedding, nothing constrained)",
             "constrained": "constrained (residual writes in span(U), embedding shift)",
             "control": "constrained, full replicas projected every inner step too (weights "
                        "and the gradient at the split)"}
DEFAULT_MODE = "lossy"  # the seed paper's authors'; a run name without a mode gets it
RESULTS = os.path.join(HERE, "results")
RATIOS = (8, 16, 32, 64)
SEEDS = (0, 1, 2, 3, 4)
CONTROL_RATIOS = (16, 64)
D_MODEL = 128


def spec(name):
    """(layout, method, boundary k (0: uncompressed), mode, seed, configuration, what)."""
    m = re.fullmatch(r"(ddp|diloco|sparseloco|(hetero|allpipe)_k(\d+)(?:_(lossy|constrained))?|"
                     r"control_k(\d+))(?:_s(\d+))?", name)
    if not m:
        raise ValueError(f"unknown run {name!r} (see hetero.py's doc)")
    seed = int(m.group(6) or 0)
    if m.group(5):
        den = int(m.group(5))
        layout, mode, config = "hetero", "control", f"control_k{den}"
        who = "pipeline boundary"
    elif m.group(2):
        layout, den = m.group(2), int(m.group(3))
        mode = m.group(4) or DEFAULT_MODE
        config = f"{layout}_k{den}_{mode}"
        who = "pipeline boundary" if layout == "hetero" else "3 pipelines, all boundaries"
    else:
        method = m.group(1)
        what = {"ddp": "dense DDP: fp32 gradient all-reduce every step",
                "diloco": "DiLoCo: dense fp32 outer sync every H steps",
                "sparseloco": "SparseLoCo, boundary uncompressed"}[method]
        return "hetero", method, 0, None, seed, method, what
    if den < 2 or D_MODEL % den:
        raise ValueError(f"run {name!r}: k/d = 1/{den} needs a divisor of d = {D_MODEL}")
    return (layout, "sparseloco", D_MODEL // den, mode, seed, config,
            f"SparseLoCo + {who} k/d=1/{den}, {MODE_WHAT[mode]}")


def best_mode():
    """The boundary mode whose heterogeneous runs had the lower mean held-out loss over the
    ratios in the last grid (results/grid_summary.json, written by the grid), else the default:
    the demo runs it."""
    try:
        with open(os.path.join(RESULTS, "grid_summary.json")) as f:
            configs = json.load(f)["configurations"]
    except (OSError, ValueError, KeyError):
        return DEFAULT_MODE
    means = {}
    for mode in MODES:
        losses = [configs[f"hetero_k{den}_{mode}"]["loss"][0] for den in RATIOS
                  if f"hetero_k{den}_{mode}" in configs]
        if len(losses) == len(RATIOS):
            means[mode] = sum(losses) / len(losses)
    return min(means, key=means.get) if means else DEFAULT_MODE


def grid_runs(modes, seeds=SEEDS, control=True):
    """The grid's run names: uncompressed SparseLoCo, heterogeneous and compress-all at every
    k/d of RATIOS in each mode, and the constrained control at CONTROL_RATIOS, for every seed.
    Seed-major (a grid cut short has every configuration at its first seeds); within a seed,
    runs of one layout are consecutive (one set of rank processes per group)."""
    runs = []
    for s in seeds:
        runs += [f"sparseloco_s{s}"]
        runs += [f"hetero_k{den}_{mo}_s{s}" for mo in modes for den in RATIOS]
        if control and "constrained" in modes:
            runs += [f"control_k{den}_s{s}" for den in CONTROL_RATIOS]
        runs += [f"allpipe_k{den}_{mo}_s{s}" for mo in modes for den in RATIOS]
    return runs


BEST_MODE = best_mode()
MODEL = dict(d=128, layers=4, seq=64, corpus="fortunes")  # unless a preset says otherwise
PRESETS = {
    "smoke": dict(steps=20, inner_steps=10, corpus="grammar",
                  runs=["sparseloco", "hetero_k16_lossy", "hetero_k16_constrained"]),
    # tools/demo: the seed paper's comparison at k/d = 1/16 in the better mode, one seed, the
    # grid's model and steps.
    "demo": dict(steps=400, inner_steps=10, d=128, layers=4, seq=32,
                 runs=["sparseloco", f"hetero_k16_{BEST_MODE}", f"allpipe_k16_{BEST_MODE}"]),
    "full": dict(steps=300, inner_steps=15,
                 runs=["ddp", "diloco", "sparseloco", "hetero_k16", "hetero_k32", "allpipe_k16",
                       "allpipe_k32"]),
    # Sized to this machine's budget (2 shared cores; see README.md "Grid").
    "grid": dict(steps=400, inner_steps=10, d=128, layers=4, seq=32, runs=grid_runs(MODES),
                 grid=True, tag="", modes=list(MODES)),
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


def run_group(names, cfg, net, args, pkg, out):
    """Runs `names` (one layout) one after the other in one set of rank processes (worker.py
    --runs-file: torch and LBCC load once per group); returns {name: summary or None (failed)}."""
    layout = spec(names[0])[0]
    net.up(layout)
    topo = dict(LAYOUTS[layout])
    n = topo["nranks"]
    port = 20000 + (os.getpid() * 7 + len(names[0]) * 131) % 20000
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
    if args.account:
        # Payload accounting assumes the direct exchange: each payload to every shard member.
        base_env["LBCC_ALGO"] = "allgatherv=direct"
    batch = []
    for i, name in enumerate(names):
        _, method, k, mode, seed, _, _ = spec(name)
        rundir = os.path.join(out, name)
        shutil.rmtree(rundir, ignore_errors=True)
        os.makedirs(rundir)
        topo_path = os.path.join(rundir, "topology.json")
        with open(topo_path, "w") as f:
            json.dump(topo, f)
        argv = ["--method", method, "--k", str(k), "--steps", str(cfg["steps"]),
                "--inner-steps", str(cfg["inner_steps"]), "--topology", topo_path,
                "--outdir", rundir, "--seed", str(seed), "--d", str(D_MODEL),
                "--layers", str(cfg["layers"]), "--seq", str(cfg["seq"]),
                "--corpus", cfg["corpus"], "--bootstrap-port", str(port + 1 + i)]
        if mode:
            argv += ["--mode", "constrained" if mode == "control" else mode]
        if mode == "control":
            argv.append("--constrain-all")
        if args.account:
            argv.append("--account")
        if args.overlap != "none":
            argv += ["--overlap", args.overlap, "--fragments", str(args.fragments)]
        batch.append(argv)
    logdir = os.path.join(out, f"{names[0]}.ranks")
    shutil.rmtree(logdir, ignore_errors=True)
    os.makedirs(logdir)
    batch_path = os.path.join(logdir, "batch.json")
    with open(batch_path, "w") as f:
        json.dump(batch, f)
    argv = [sys.executable, os.path.join(HERE, "worker.py"), "--runs-file", batch_path]
    procs = []
    t0 = time.time()
    for r in range(n):
        env = dict(base_env, RANK=str(r), LBCC_LISTEN_ADDR=net.addr(r))
        log = open(os.path.join(logdir, f"rank{r}.log"), "w")
        p = subprocess.Popen(net.command(r, env, argv), stderr=subprocess.STDOUT,
                             stdout=subprocess.PIPE if r == 0 else log, text=r == 0)
        if r == 0:  # Progress lines: live on the terminal and in the log.
            threading.Thread(target=tee, args=(p.stdout, log), daemon=True).start()
        procs.append(p)
    failed = False
    deadline = t0 + (args.timeout + 60) * len(names)
    for r, p in enumerate(procs):
        try:
            rc = p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "timeout"
        if rc != 0:
            failed = True
            print(f"  {names[0]}..: rank {r} exit {rc}; see {logdir}/rank{r}.log", flush=True)
    if failed:
        for r in range(n):
            with open(os.path.join(logdir, f"rank{r}.log")) as f:
                tail = f.read()[-1500:]
            print(f"---- {names[0]}.. rank {r} log tail\n{tail}", file=sys.stderr)
    results = {}
    for name in names:
        rundir = os.path.join(out, name)
        done = all(os.path.exists(os.path.join(rundir, f"rank{r}.json")) for r in range(n))
        results[name] = summarize(name, rundir, n, None) if done else None
    return results


def run_churn(name, cfg, net, args, pkg, out):
    """--churn: one run of the "hetero" layout over elastic groups (churn_worker.py) in which a
    stage of the pipeline replica (a weak participant) is killed (SIGKILL) at random steps and
    restarted a few steps later; it rejoins through lbcc.torch.elastic. Returns the summary."""
    import random
    import signal
    layout, method, k, mode, seed, _, _ = spec(name)
    if layout != "hetero" or method != "sparseloco" or (k and mode != "constrained"):
        sys.exit(f"--churn: {name}: churn runs take sparseloco or hetero_k<D>_constrained (with "
                 f"the basis fixed: a restarted stage rebuilds it from the seed)")
    H, steps = cfg["inner_steps"], cfg["steps"]
    rng = random.Random(args.churn_seed)
    # Kill steps at least 3 outer steps apart, all in the first half of the run (the rest
    # leaves the killed stage time to come back: detection, restart, admission at an outer step).
    slots = list(range(H + 1, max(H + 2, steps // 2 - H), 3 * H))
    if len(slots) < args.churn_events:
        sys.exit(f"--churn: {steps} steps leave room for {len(slots)} churn events at H = {H}")
    plan = []
    for lo in sorted(rng.sample(slots, args.churn_events)):
        plan.append({"victim": rng.choice([2, 3]), "kill_at": rng.randint(lo, lo + H),
                     "down_steps": rng.randint(2, max(2, H // 2))})
    net.up(layout)
    topo = dict(LAYOUTS[layout])
    rundir = os.path.join(out, f"churn_{name}")
    shutil.rmtree(rundir, ignore_errors=True)
    os.makedirs(rundir)
    topo_path = os.path.join(rundir, "topology.json")
    with open(topo_path, "w") as f:
        json.dump(topo, f)
    port = 20000 + (os.getpid() * 11 + 977) % 20000
    env = {
        "PYTHONPATH": pkg, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1", "UCX_MEM_EVENTS": "no", "UCX_TLS": "tcp",
        "LBCC_TIMEOUT_S": str(args.timeout), "HETERO_PAIR_HOST": net.addr(2),
        "UCX_NET_DEVICES": "eth0" if net.testbed else "lo",
    }
    argv = [sys.executable, os.path.join(HERE, "churn_worker.py"), "--method", method,
            "--k", str(k), "--mode", "constrained", "--corpus", cfg["corpus"],
            "--steps", str(steps),
            "--inner-steps", str(H), "--topology", topo_path, "--outdir", rundir,
            "--seed", str(seed), "--d", str(D_MODEL), "--layers", str(cfg["layers"]),
            "--seq", str(cfg["seq"]), "--master-host", net.addr(0),
            "--master-ports", f"{port},{port + 1}", "--pair-port", str(port + 2),
            "--timeout", str(args.timeout)]
    procs, logs = {}, []
    incarnations = {r: 0 for r in range(4)}

    def start(r, hold=None, pair_index=0):
        log = open(os.path.join(rundir, f"rank{r}.{incarnations[r]}.log"), "w")
        e = dict(env, RANK=str(r), LBCC_LISTEN_ADDR=net.addr(r))
        procs[r] = subprocess.Popen(net.command(r, e, argv + [
                                        "--incarnation", str(incarnations[r]),
                                        "--pair-index", str(pair_index)] +
                                        (["--hold", hold] if hold else [])),
                                    stdout=log, stderr=subprocess.STDOUT)
        logs.append(log)

    def wait_for(path, what, deadline):
        while not os.path.exists(path):
            if time.time() > deadline or any(p.poll() not in (None, 0) for p in procs.values()):
                raise RuntimeError(f"--churn: {what} did not happen")
            time.sleep(0.05)

    def progress():
        try:
            with open(os.path.join(rundir, "progress")) as f:
                return int(f.read() or 0)
        except (OSError, ValueError):
            return 0

    events, standby = [], []
    t0 = time.time()
    deadline = t0 + args.timeout * (2 + len(plan))
    killed = []  # killed processes: their exit status is expected
    try:
        start(0)  # hosts the membership services
        wait_for(os.path.join(rundir, "masters.ready"), "rank 0's membership services",
                 t0 + args.timeout)
        for r in (1, 2, 3):
            start(r)
        # Each kill's replacement starts now as a standby (interpreter, torch, corpus and model
        # loaded) held until its restart step, as a spare machine would be: its start-up on this
        # loaded machine is not counted as down time.
        for i, ev in enumerate(plan):
            v = ev["victim"]
            incarnations[v] += 1
            hold = os.path.join(rundir, f"go.{v}.{incarnations[v]}")
            current = procs[v]
            start(v, hold, pair_index=i + 1)  # the pair re-forms once per kill
            standby.append((procs[v], hold, incarnations[v]))
            procs[v] = current
        incarnation_of = {r: 0 for r in range(4)}
        for ev, (spare, hold, inc) in zip(plan, standby):
            v = ev["victim"]
            while progress() < ev["kill_at"]:
                if time.time() > deadline or procs[0].poll() is not None:
                    raise RuntimeError("--churn: rank 0 ended or stalled before the kill")
                time.sleep(0.05)
            pid_path = os.path.join(rundir, f"rank{v}.{incarnation_of[v]}.pid")
            wait_for(pid_path, f"rank {v}'s start", deadline)
            with open(pid_path) as f:
                os.kill(int(f.read()), signal.SIGKILL)
            at = progress()
            killed.append(procs[v])
            events.append({"step": at, "time": time.time(), "killed": f"rank{v}."
                           f"{incarnation_of[v]}",
                           "what": f"rank {v} (pipeline stage {v - 2}) killed (SIGKILL)"})
            print(f"   churn: step {at}: rank {v} killed", flush=True)
            while progress() < at + ev["down_steps"]:
                if time.time() > deadline or procs[0].poll() is not None:
                    raise RuntimeError("--churn: rank 0 ended or stalled while rank "
                                       f"{v} was down")
                time.sleep(0.05)
            procs[v] = spare
            incarnation_of[v] = inc
            open(hold, "w").close()
            events.append({"step": progress(), "time": time.time(),
                           "restarted": f"rank{v}.{inc}",
                           "what": f"rank {v} restarted (incarnation {inc})"})
            print(f"   churn: step {progress()}: rank {v} restarted", flush=True)
        failed = []
        for r, p in procs.items():
            try:
                rc = p.wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                rc = "timeout"
            if rc != 0:
                failed.append(f"rank {r}: exit {rc}")
        for p in killed:
            p.wait(timeout=60)
    except RuntimeError as e:
        failed = [str(e)]
        for p in list(procs.values()) + [sp for sp, _, _ in standby]:
            if p.poll() is None:
                p.kill()
    finally:
        for log in logs:
            log.close()
    s = summarize_churn(name, rundir, plan, events, failed, time.time() - t0, H)
    return s


def summarize_churn(name, rundir, plan, driver_events, failed, wall, inner_steps):
    """Per step: mean training loss over the replicas' head ranks present and the shards'
    member counts; per committed outer step and shard: the members' parameter hashes; the
    membership events (the driver's kills and restarts, the workers' losses and joins)."""
    logs = []
    for fn in sorted(os.listdir(rundir)):
        m = re.fullmatch(r"rank(\d+)\.(\d+)\.json", fn)
        if m:
            with open(os.path.join(rundir, fn)) as f:
                logs.append(json.load(f))
    by_step = {}
    for lg in logs:
        for row in lg["steps"]:
            if row[1] is not None:
                by_step.setdefault(row[0], []).append(row[1])
    rank0 = next((lg for lg in logs if lg["rank"] == 0), None)
    sizes = {row[0]: row[2:4] for row in rank0["steps"]} if rank0 else {}
    rows = [[st, sum(v) / len(v), len(v)] + sizes.get(st, [None, None])
            for st, v in sorted(by_step.items())]
    with open(os.path.join(rundir, "metrics.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "loss", "head_ranks", "shard0_members", "shard1_members"])
        w.writerows(rows)
    hashes, checks = {}, 0
    for lg in logs:
        for o in lg["outer"]:
            hashes.setdefault((o["shard"], o["committed"]), set()).add(o["hash"])
    identical = all(len(v) == 1 for v in hashes.values())
    finals = {}
    for lg in logs:
        for s, f in (lg.get("final") or {}).items():
            finals.setdefault(s, []).append((lg["rank"], lg["incarnation"], f["committed"],
                                             f["hash"]))
    final_identical = bool(finals) and all(len({(c, h) for _, _, c, h in v}) == 1
                                           for v in finals.values())
    events = [dict(e, what=f"driver: {e['what']}") for e in driver_events]
    for lg in logs:
        for e in lg["events"]:
            events.append(dict(e, what=f"rank {lg['rank']}.{lg['incarnation']}: {e['what']}"))
    events.sort(key=lambda e: e["time"])
    from check_churn import analyse  # the unit behaviour, as the checks read it
    units = analyse(rundir, driver_events)
    t_first = events[0]["time"] if events else 0
    for e in events:
        e["t"] = round(e.pop("time") - t_first, 2)
    joins = [(lg, j) for lg in logs for j in lg["joins"] if j["step"] > 0]
    members = {}
    for (shard, _), v in hashes.items():
        members[shard] = min(members.get(shard, 99), len(v))
    compared = {}
    for lg in logs:
        for o in lg["outer"]:
            compared.setdefault((o["shard"], o["committed"]), 0)
            compared[(o["shard"], o["committed"])] += 1
    summary = {
        "run": f"churn_{name}", "plan": plan, "events": events, "failed": failed,
        "inner_steps": inner_steps,
        "steps": rows[-1][0] if rows else 0, "first_loss": rows[0][1] if rows else None,
        "train_loss": rows[-1][1] if rows else None,
        "eval_loss": rank0["eval_loss"] if rank0 else None,
        "outer_checks": len(hashes), "identical": identical, "final": finals,
        "final_identical": final_identical,
        "rejoined": [{"rank": lg["rank"], "incarnation": lg["incarnation"],
                      "state_bytes_received": j["state_bytes_received"],
                      "state_bytes": j["state_bytes"],
                      "joined_at": j["step"], "finished": bool(lg.get("final"))}
                     for lg, j in joins],
        "min_members_compared": min(compared.values()) if compared else 0,
        "units": {"absent": units["absent"], "told": units["told"],
                  "left_itself": units["left_itself"], "rejoins": units["rejoins"],
                  "full_size": units["full_size"],
                  "exchanges": [{k: x[k] for k in ("shard", "committed", "step", "members",
                                                   "epoch")} for x in units["steps"]]},
        "wall_seconds": wall,
    }
    with open(os.path.join(rundir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    if rows:
        plot_churn(summary, rows, rundir)
    return summary


def plot_churn(summary, rows, rundir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True,
                                 gridspec_kw={"height_ratios": [3, 1]})
    a1.plot([r[0] for r in rows], [r[1] for r in rows], label="training loss (head ranks present)")
    for e in summary["events"]:
        if e["step"] is None:
            continue
        what = e["what"]
        color = ("red" if e.get("killed") else "orange" if e.get("restarted") else
                 "purple" if e.get("replica_left") else "green" if e.get("joined") else None)
        if color:
            for ax in (a1, a2):
                ax.axvline(e["step"], color=color, alpha=0.6, lw=1)
    a1.set_ylabel("loss")
    a1.set_title(f"{summary['run']}: red kill, purple replica out (survivor told), "
                 "orange restart, green rejoin")
    a1.legend()
    H = summary["inner_steps"]
    for i in (0, 1):
        # Each outer step's exchange: the members that committed it, over its inner steps.
        pts = [(x["step"] - H, x["members"]) for x in summary["units"]["exchanges"]
               if x["shard"] == i]
        if pts:
            pts.append((pts[-1][0] + H, pts[-1][1]))
        a2.step([p[0] for p in pts], [p[1] + 0.04 * (i - 0.5) for p in pts], where="post",
                label=f"shard {i}: members of each outer step's exchange")
    a2.set_xlabel("step")
    a2.set_ylabel("members")
    a2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(rundir, "churn.png"), dpi=90)
    plt.close(fig)


def churn_table(s, cfg, net_desc):
    lines = [f"Churn run `{s['run']}`: {cfg['steps']} steps, H = {cfg['inner_steps']}, d = "
             f"{D_MODEL}, {cfg['layers']} layers, context {cfg['seq']}, {net_desc}; "
             f"lbcc.torch.SparseLoCo(elastic=True), one elastic group per shard, their "
             f"services sharing one lbcc.ElasticUnits (the pipeline replica a unit).", "",
             "| step | s | membership event (driver: kills, restarts; ranks: what they saw) |",
             "|---|---|---|"]
    if s["first_loss"] is None or s["eval_loss"] is None:
        return "\n".join(lines + ["", f"FAILED: no complete run ({'; '.join(s['failed'])})"])
    for e in s["events"]:
        lines.append(f"| {e['step'] if e['step'] is not None else '-'} | {e['t']:.1f} "
                     f"| {e['what']} |")
    lines += ["", f"Loss {s['first_loss']:.3f} -> {s['train_loss']:.3f} (training, head ranks "
                  f"present), held-out {s['eval_loss']:.3f}; every committed outer step "
                  f"bit-identical on every member of its epoch: "
                  f"{'yes' if s['identical'] else 'NO'} ({s['outer_checks']} (shard, step) "
                  f"checks, each over at least {s['min_members_compared']} members); final "
                  f"parameters identical on every member, the restarted stage "
                  f"included: {'yes' if s['final_identical'] else 'NO'}; rejoined: " +
              (", ".join(f"rank {j['rank']} (incarnation {j['incarnation']}) at step "
                         f"{j['joined_at']}" for j in s["rejoined"]) or "none") +
              "; shared state received at the rejoin: " +
              (", ".join(f"rank {j['rank']}.{j['incarnation']} {j['state_bytes_received']} B "
                         f"(of {j['state_bytes']} B)" for j in s["rejoined"]) or "none") + "."]
    u = s["units"]

    def spans(shard):
        return ", ".join(f"committed outer steps {x['from']} to "
                         f"{x['back'] - 1 if x['back'] else 'the end'} (epochs "
                         f"{', '.join(str(e) for e in sorted(set(x['epochs'])))})"
                         for x in u["absent"].get(shard, u["absent"].get(str(shard)))
                         ) or "never"
    lines.append(
        f"\nThe pipeline replica as a unit: without it, shard 0's group ran {spans(0)}, shard "
        f"1's {spans(1)}; the surviving stage was told replica_left by its service: " +
        ("; ".join(f"{t['name']} (stage {t['stage']}) at step {t['step']}, via {t['via']}"
                   for t in u["told"]) or "never") + "; stages that left by themselves: " +
        (", ".join(x["name"] for x in u["left_itself"]) or "none") + "; readmitted: " +
        (", ".join(f"{j['name']} (stage {j['stage']}) at outer step {j['outer_step']}"
                   for j in u["rejoins"]) or "none") + ".")
    if s["failed"]:
        lines.append(f"FAILED: {'; '.join(s['failed'])}")
    lines.append("\nPlot: `churn.png` (loss vs step with the kills, the replica's departure as "
                 "the surviving stage was told, restarts and rejoins; the members of each "
                 "shard's outer-step exchanges).")
    return "\n".join(lines)


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
        # The first compressed pipeline's view of the same model, through its boundary.
        "eval_loss_boundary": next((lg["eval_loss_boundary"] for lg in logs
                                    if lg.get("eval_loss_boundary") is not None), None),
        "fast_bytes": rows[-1][2], "slow_bytes": rows[-1][3],
        "dp_slow_bytes": sum(lg["final_counters"]["dp_slow_sent"] for lg in logs),
        # The pipelines' slow stage links: activations (and their gradients) and the table
        # refresh; what the authors' dense table broadcast would have moved instead.
        "slow_act_bytes": sum(lg["final_counters"]["stage_sent"] - lg["payload"]["table_sent"]
                              for lg in logs if lg["final_counters"]["stage_slow"]),
        "slow_table_bytes": sum(lg["payload"]["table_sent"] for lg in logs
                                if lg["final_counters"]["stage_slow"]),
        "table_bytes": sum(lg["payload"]["table_sent"] for lg in logs),
        "table_dense_bytes": sum(lg["table_dense_equivalent"] for lg in logs),
        "stage_bytes": sum(lg["final_counters"]["stage_sent"] for lg in logs),
        "train_seconds": max(lg["train_seconds"] for lg in logs),
        "wall_seconds": wall if wall is not None else max(lg["run_seconds"] for lg in logs),
        "identical": all(ok for lg in logs for _, ok in lg["identical"]),
        "outer_checks": len(logs[0]["identical"]),
        "payload": {r: lg["payload"] for r, lg in enumerate(logs)},
        "basis_versions": sorted({lg["basis"][1] for lg in logs}),
        "stage_link": {r: lg.get("stage_link") for r, lg in enumerate(logs) if lg.get("stage_link")},
        "slow_sent_by_rank": {r: lg["final_counters"]["slow_sent"] for r, lg in enumerate(logs)},
        "kinds": {r: (lg["kind"], lg["stage"]) for r, lg in enumerate(logs)},
        "overlap": logs[0].get("overlap", "none"),
        # Per replica: its ranks' compute utilization (inner-step time / wall time).
        "utilization": {lg["replica"]: [] for lg in logs},
    }
    for r, lg in enumerate(logs):
        if lg.get("utilization"):
            summary["utilization"][lg["replica"]].append(
                [r, lg["utilization"]["util"], lg["utilization"]["cpu_util"]])
    with open(os.path.join(rundir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def mean_std(xs):
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, sd


def aggregate(results):
    """Per configuration (the run name without its seed): seeds, held-out loss and slow-link
    bytes (total and by kind) as (mean, sample std), and the held-out loss by seed."""
    groups = {}
    for name, s in results.items():
        layout, _, _, mode, seed, config, what = spec(name)
        groups.setdefault(config, {"what": what, "layout": layout, "mode": mode, "runs": []})
        groups[config]["runs"].append(s)
        groups[config].setdefault("by_seed", {})[seed] = s["eval_loss"]
    for config, g in groups.items():
        g["seeds"] = len(g["runs"])
        g["loss"] = mean_std([r["eval_loss"] for r in g["runs"]])
        g["slow"] = mean_std([r["slow_bytes"] for r in g["runs"]])
        for key in ("slow_act_bytes", "dp_slow_bytes", "slow_table_bytes", "table_bytes",
                    "table_dense_bytes"):
            g[key] = mean_std([r.get(key, 0) for r in g["runs"]])
        through = [r["eval_loss_boundary"] for r in g["runs"]
                   if r.get("eval_loss_boundary") is not None]
        g["loss_boundary"] = mean_std(through) if through else None
        g["identical"] = all(r["identical"] for r in g["runs"])
        m = re.search(r"_k(\d+)", config)
        g["den"] = int(m.group(1)) if m else None
    return groups


def curve_key(g):
    if g["den"] is None:
        return "sparseloco (uncompressed)"
    return "control (constrained, full replicas too)" if g["mode"] == "control" else \
        f"{g['layout']} {g['mode']}"


def plot_grid(groups, out, tag=""):
    """Held-out loss vs slow-link bytes, mean +- std over seeds, one curve per layout and mode
    (over k/d)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 6))
    curves = {}
    for g in groups.values():
        curves.setdefault(curve_key(g), []).append(g)
    styles = {("hetero", "lossy"): "-o", ("allpipe", "lossy"): "--o",
              ("hetero", "constrained"): "-s", ("allpipe", "constrained"): "--s",
              ("hetero", "control"): ":^"}
    for key, gs in sorted(curves.items()):
        gs.sort(key=lambda g: g["slow"][0])
        x = [g["slow"][0] / 1e6 for g in gs]
        y = [g["loss"][0] for g in gs]
        ax.errorbar(x, y, yerr=[g["loss"][1] for g in gs], xerr=[g["slow"][1] / 1e6 for g in gs],
                    fmt=styles.get((gs[0]["layout"], gs[0]["mode"]), "o") if gs[0]["den"]
                    else "k*", markersize=10 if gs[0]["den"] is None else 5, capsize=3,
                    label=key)
        for g in gs:
            if g["den"]:
                ax.annotate(f"1/{g['den']}", (g["slow"][0] / 1e6, g["loss"][0]), fontsize=7,
                            xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("slow-link bytes (MB, all ranks, sent; mean over seeds)")
    ax.set_ylabel("held-out loss of the global model (mean +- std over seeds)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out, f"loss_vs_bytes{tag}.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def grid_table(groups, cfg, net_desc):
    def fmt(ms, scale=1.0, digits=3):
        return f"{ms[0] / scale:.{digits}f} +- {ms[1] / scale:.{digits}f}"
    rank = {"lossy": 0, "constrained": 1, "control": 2}
    order = sorted(groups, key=lambda c: (groups[c]["den"] or 0, rank.get(groups[c]["mode"], -1),
                                          groups[c]["layout"]))
    lines = [f"Grid: {cfg['steps']} steps, H = {cfg['inner_steps']}, d = {D_MODEL}, "
             f"{cfg['layers']} layers, context {cfg['seq']}, corpus {cfg['corpus']}, "
             f"{net_desc}; mean +- sample std over seeds. Slow-link MB: everything every rank "
             f"sent on slow links; of it, activations (the stage link), data parallel "
             f"(SparseLoCo) and the boundary-table refresh. Held-out loss: the global model's, "
             f"uncompressed; beside it, the same model through the first compressed pipeline's "
             f"boundary.", "",
             "| configuration | what | seeds | held-out loss | through the boundary "
             "| slow-link MB | activations MB | data-parallel MB | table refresh MB "
             "| replicas identical |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in order:
        g = groups[c]
        lines.append(f"| {c} | {g['what']} | {g['seeds']} | {fmt(g['loss'])} "
                     f"| {fmt(g['loss_boundary']) if g['loss_boundary'] else '-'} "
                     f"| {fmt(g['slow'], 1e6, 2)} | {g['slow_act_bytes'][0] / 1e6:.2f} "
                     f"| {g['dp_slow_bytes'][0] / 1e6:.2f} "
                     f"| {g['slow_table_bytes'][0] / 1e6:.3f} "
                     f"| {'yes' if g['identical'] else 'NO'} |")
    return "\n".join(lines)


def paired(a, b):
    """Paired-by-seed differences b - a of two configurations' held-out losses: (mean, sample
    std, standard error, n, seeds where b > a)."""
    both = sorted(set(a["by_seed"]) & set(b["by_seed"]))
    diffs = [b["by_seed"][x] - a["by_seed"][x] for x in both]
    if not diffs:
        return None
    m, sd = mean_std(diffs)
    return m, sd, sd / math.sqrt(len(diffs)), len(diffs), sum(d > 0 for d in diffs)


def verdicts(groups):
    """The paper's two claims, the cost of compression and the control, stated from the grid's
    numbers; returns (text, a record for grid_summary.json)."""
    out, record = [], {"modes": {}}
    base = groups.get("sparseloco")
    for mode in MODES:
        gaps = []
        for den in RATIOS:
            h, p = groups.get(f"hetero_k{den}_{mode}"), groups.get(f"allpipe_k{den}_{mode}")
            pr = paired(h, p) if h and p else None
            if pr:
                gaps.append((den, pr))
        if not gaps:
            continue
        rows = [f"1/{den}: compress-all - heterogeneous = {m:+.3f} +- {se:.3f} (SE; std {sd:.3f}, "
                f"heterogeneous lower in {w} of {n} seeds){' **> 2 SE**' if m > 2 * se else ''}"
                for den, (m, sd, se, n, w) in gaps]
        beats = [m > 2 * se for _, (m, _, se, _, _) in gaps]
        few = min(n for _, (_, _, _, n, _) in gaps) < 2
        ratios = ", ".join(f"1/{d}" for d, _ in gaps)
        if few:
            claim1 = "cannot tell (fewer than 2 seeds: no spread)"
        elif all(beats):
            claim1 = f"YES at every ratio run ({ratios}): by more than 2 standard errors"
        elif any(beats):
            claim1 = ("PARTLY: by more than 2 standard errors only at " +
                      ", ".join(f"1/{d}" for (d, _), b in zip(gaps, beats) if b) +
                      f" of {ratios}")
        else:
            claim1 = f"NO: at none of {ratios} by more than 2 standard errors"
        g = [m for _, (m, *_) in gaps]
        if len(g) < 2:
            claim2 = "cannot tell from one ratio"
        elif all(b > a for a, b in zip(g, g[1:])):
            claim2 = (f"YES: the gap grows monotonically as k/d shrinks "
                      f"({', '.join(f'{x:+.3f}' for x in g)})")
        else:
            falls = [f"1/{gaps[i][0]} -> 1/{gaps[i + 1][0]}" for i in range(len(g) - 1)
                     if g[i + 1] <= g[i]]
            claim2 = (f"NO: not monotonic ({', '.join(f'{x:+.3f}' for x in g)}; it does not "
                      f"grow from {', '.join(falls)})")
        out.append(f"- **{mode}** ({MODE_WHAT[mode]}): paired by seed (same data, init and "
                   f"basis): {'; '.join(rows)}.\n  Claim 1 (heterogeneous beats compress-all "
                   f"by more than 2 SE at every ratio): {claim1}.\n  Claim 2 (the gap grows as "
                   f"k/d shrinks): {claim2}.")
        rec = {"claim1": all(beats) and not few, "claim2": claim2.startswith("YES"),
               "gaps": {den: {"mean": m, "std": sd, "se": se, "n": n}
                        for den, (m, sd, se, n, _) in gaps}, "cost": {}}
        if base:
            costs = []
            for den in (8, 32):
                for lay in ("hetero", "allpipe"):
                    c = groups.get(f"{lay}_k{den}_{mode}")
                    if c:
                        pct = 100 * (c["loss"][0] / base["loss"][0] - 1)
                        rec["cost"][f"{lay}_k{den}"] = pct
                        costs.append(f"{lay} 1/{den} {c['loss'][0]:.3f} ({pct:+.1f} %)")
            if costs:
                out.append(f"  Cost against uncompressed SparseLoCo ({base['loss'][0]:.3f} +- "
                           f"{base['loss'][1]:.3f}): " + ", ".join(costs) + ".")
        record["modes"][mode] = rec
    for den in CONTROL_RATIOS:
        c, p = groups.get(f"control_k{den}"), groups.get(f"allpipe_k{den}_constrained")
        pr = paired(p, c) if c and p else None
        if pr:
            m, sd, se, n, _ = pr
            ok = abs(m) <= 2 * se + 1e-12
            record.setdefault("control", {})[den] = {"mean": m, "se": se, "matches": ok}
            out.append(f"- Control at 1/{den} (constrained, the full replicas projected after "
                       f"every inner step too, weights and the gradient at the split) vs "
                       f"compress-all constrained: {m:+.3f} +- {se:.3f} "
                       f"(SE, {n} seeds): " + ("matches within 2 SE: the constrained "
                                               "boundary is exact and costs the same wherever "
                                               "it is applied" if ok else
                                               "DIFFERS by more than 2 SE"))
    dense = sum(g["table_dense_bytes"][0] for g in groups.values() if g["den"])
    sent = sum(g["table_bytes"][0] for g in groups.values() if g["den"])
    if dense:
        record["table_ratio"] = sent / dense
        worst = max((g["table_bytes"][0] / g["table_dense_bytes"][0], c)
                    for c, g in groups.items() if g["den"] and g["table_dense_bytes"][0])
        out.append(f"- Boundary-table refresh: the later stages rebuilt the synced table from "
                   f"its changed elements, {sent / 1e6:.3f} MB in all (per configuration, mean "
                   f"over seeds, summed) against {dense / 1e6:.3f} MB for a dense V x d fp32 "
                   f"broadcast after every outer step: {sent / dense:.3f} of it (worst "
                   f"configuration {worst[1]}: {worst[0]:.3f}).")
    return "\n".join(out), record


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
    plt.close(fig)
    for name in (results if len(results) <= 12 else []):
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


def utilization_cell(s):
    """"replica 0: r0 0.97; replica 2: r2 0.81, r3 0.80" from a summary."""
    parts = []
    for replica, ranks in sorted(s.get("utilization", {}).items(), key=lambda kv: int(kv[0])):
        if ranks:
            parts.append(f"replica {replica}: " +
                         ", ".join(f"r{r} {u:.2f}" for r, u, _ in ranks))
    return "; ".join(parts) or "-"


def table(results, cfg, missing, net_desc):
    lines = [f"Preset: {cfg['steps']} steps, H = {cfg['inner_steps']}, d = {cfg['d']}, "
             f"{cfg['layers']} layers, context {cfg['seq']}, {net_desc}; SparseLoCo's outer "
             f"steps: {cfg.get('overlap', 'none')} (--overlap).", "",
             "| run | what | final train loss | held-out loss | slow-link MB | of which data-parallel MB "
             "| fast-link MB | data-parallel slow vs ddp | train s | compute utilization per "
             "replica (rank: inner steps / wall) | replicas identical |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    ddp = results.get("ddp")
    for name, s in results.items():
        ratio = (f"{ddp['dp_slow_bytes'] / s['dp_slow_bytes']:.0f}x less"
                 if ddp and s["dp_slow_bytes"] else "-")
        if name == "ddp":
            ratio = "1x"
        lines.append(
            f"| {name} | {spec(name)[6]} | {s['train_loss']:.3f} | {s['eval_loss']:.3f} "
            f"| {s['slow_bytes'] / 1e6:.2f} | {s['dp_slow_bytes'] / 1e6:.2f} "
            f"| {s['fast_bytes'] / 1e6:.2f} | {ratio} "
            f"| {s['train_seconds']:.0f} | {utilization_cell(s)} "
            f"| {'yes' if s['identical'] else 'NO'} ({s['outer_checks']} checks) |")
    for name, why in missing.items():
        lines.append(f"| {name} | {spec(name)[6]} | not run: {why} | | | | | | | | |")
    return "\n".join(lines)


def comparison(results):
    """The seed paper's comparison for the runs of a short preset (one seed: no spread; the
    grid has the seeds): per mode and ratio, heterogeneous against compress-all and both
    against uncompressed SparseLoCo."""
    base = results.get("sparseloco")
    lines = []
    for name, h in results.items():
        layout, _, k, mode, seed, config, _ = spec(name)
        if layout != "hetero" or not k or mode == "control":
            continue
        p = results.get(name.replace("hetero_", "allpipe_", 1))
        row = f"heterogeneous {h['eval_loss']:.3f}"
        if base:
            row += f" ({100 * (h['eval_loss'] / base['eval_loss'] - 1):+.1f} % vs uncompressed)"
        if p:
            row += (f", compress-all {p['eval_loss']:.3f}" +
                    (f" ({100 * (p['eval_loss'] / base['eval_loss'] - 1):+.1f} %)" if base else "") +
                    f": heterogeneous {'ahead' if h['eval_loss'] < p['eval_loss'] else 'BEHIND'} "
                    f"by {abs(p['eval_loss'] - h['eval_loss']):.3f}")
        lines.append(f"- k/d = 1/{D_MODEL // k}, {mode}: {row}.")
    if not lines:
        return ""
    head = ("\n\nThe seed paper's comparison (held-out loss of the global model" +
            (f"; uncompressed SparseLoCo {base['eval_loss']:.3f}" if base else "") +
            "; one seed: see the README's grid for the spread):\n")
    return head + "\n".join(lines)


def write_readme(path, text, section="results"):
    begin, end = f"<!-- {section}:begin -->", f"<!-- {section}:end -->"
    with open(path) as f:
        doc = f.read()
    if begin in doc and end in doc:
        doc = doc[:doc.index(begin) + len(begin)] + "\n" + text + "\n" + doc[doc.index(end):]
        with open(path, "w") as f:
            f.write(doc)
    else:
        print(f"hetero.py: {path} has no {begin} ... {end} section: not written", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=list(PRESETS), default="demo")
    ap.add_argument("--runs", help="comma-separated run names (see the doc above)")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--inner-steps", type=int, help="H, inner steps per outer step")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "lbcc_hetero"))
    ap.add_argument("--no-testbed", action="store_true")
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--account", action="store_true")
    ap.add_argument("--readme", help="README whose results section gets the table")
    ap.add_argument("--seeds", type=int, help="grid: the first N seeds only")
    ap.add_argument("--results", help="grid: also copy results.md, grid_summary.json and the "
                                      "plot into this folder (e.g. examples/hetero_training/results)"
                                      "; grid_large: results_large.md, grid_large_summary.json, "
                                      "loss_vs_bytes_large.png")
    ap.add_argument("--modes", help="grid presets: comma-separated boundary modes to run ("
                                    "lossy, constrained; default: both)")
    ap.add_argument("--collect", action="store_true",
                    help="run nothing: summarize the finished runs found in --out (a grid cut "
                         "short) and write the outputs as a finished run would")
    ap.add_argument("--d", type=int, help="model dimension (default: the preset's)")
    ap.add_argument("--layers", type=int, help="transformer blocks, split evenly over 2 stages")
    ap.add_argument("--seq", type=int, help="context length")
    ap.add_argument("--overlap", choices=["none", "delayed", "streaming"], default="none",
                    help="SparseLoCo runs with an uncompressed boundary: overlap the outer "
                         "exchange with the next inner steps (docs/overlap.md)")
    ap.add_argument("--fragments", type=int, default=2, help="--overlap streaming: fragments")
    ap.add_argument("--churn", action="store_true",
                    help="one run (the first of --runs, default sparseloco) over elastic groups "
                         "in which a pipeline stage is killed at random steps and restarted a "
                         "few steps later; it rejoins (churn.md, churn.png)")
    ap.add_argument("--churn-events", type=int, default=1, help="--churn: kills in the run")
    ap.add_argument("--churn-seed", type=int, default=0,
                    help="--churn: seed of the kill steps, victims and down times")
    args = ap.parse_args()
    global D_MODEL
    cfg = dict(MODEL, **PRESETS[args.preset])
    for key in ("d", "layers", "seq"):
        if getattr(args, key):
            cfg[key] = getattr(args, key)
    D_MODEL = cfg["d"]
    cfg["overlap"] = args.overlap
    if args.modes:
        modes = args.modes.split(",")
        bad = [mo for mo in modes if mo not in MODES]
        if not cfg.get("grid") or bad or not modes:
            sys.exit(f"hetero.py: --modes takes a grid preset and a list of "
                     f"{', '.join(MODES)}" + (f" (not {', '.join(bad)})" if bad else ""))
        cfg["modes"] = modes
        cfg["runs"] = grid_runs(modes)
    if args.runs:
        cfg["runs"] = args.runs.split(",")
    if args.steps:
        cfg["steps"] = args.steps
    if args.inner_steps:
        cfg["inner_steps"] = args.inner_steps
    if args.seeds:
        cfg["runs"] = [n for n in cfg["runs"] if spec(n)[4] < args.seeds]
    os.makedirs(args.out, exist_ok=True)
    pkg = None if args.collect else package_path(args.out)
    use_tb = False
    if not args.no_testbed:
        use_tb, why = testbed_usable()
        if not use_tb:
            print(f"testbed unavailable ({why}): falling back to 127.0.0.1, slow links marked "
                  f"slow in the topology and paced at {args.rate}", flush=True)
    net = Net(use_tb, args.rate)
    net_desc = (f"tools/testbed namespaces, slow down-links shaped to {args.rate}" if use_tb else
                f"127.0.0.1 (no testbed): slow links marked in the topology, paced to {args.rate}")
    for name in cfg["runs"]:
        spec(name)  # fails early on a bad name
        if args.overlap != "none" and (spec(name)[1] != "sparseloco" or spec(name)[2]):
            sys.exit(f"hetero.py: --overlap {args.overlap}: {name} is not uncompressed "
                     "SparseLoCo (run --runs sparseloco[_s<seed>])")
    if args.overlap != "none" and (args.churn or args.account):
        sys.exit("hetero.py: --overlap takes neither --churn nor --account")
    if args.churn:
        name = args.runs.split(",")[0] if args.runs else "sparseloco"
        print(f"== hetero_training --churn: {name}, {cfg['steps']} steps, H = "
              f"{cfg['inner_steps']}, {args.churn_events} kill(s); {net_desc}; results in "
              f"{args.out}", flush=True)
        try:
            s = run_churn(name, cfg, net, args, pkg, args.out)
        finally:
            net.down()
        text = churn_table(s, cfg, net_desc)
        with open(os.path.join(args.out, "churn.md"), "w") as f:
            f.write(text + "\n")
        png = os.path.join(args.out, s["run"], "churn.png")
        if os.path.exists(png):  # a failed run has no plot; its table says why
            shutil.copy(png, args.out)
        if args.results:
            os.makedirs(args.results, exist_ok=True)
            for fn in ("churn.md", "churn.png"):
                if os.path.exists(os.path.join(args.out, fn)):
                    shutil.copy(os.path.join(args.out, fn), args.results)
        print("\n" + text)
        if args.readme:
            write_readme(args.readme, text, "churn")
        ok = (not s["failed"] and s["identical"] and s["final_identical"] and s["rejoined"])
        return 0 if ok else 1
    print(f"== hetero_training: {len(cfg['runs'])} runs, {cfg['steps']} steps each, "
          f"H = {cfg['inner_steps']}, overlap {args.overlap}; {net_desc}; results in "
          f"{args.out}", flush=True)
    results, missing = {}, {}
    groups = []  # consecutive runs of one layout share their rank processes
    for name in cfg["runs"]:
        if groups and spec(groups[-1][0])[0] == spec(name)[0]:
            groups[-1].append(name)
        else:
            groups.append([name])
    done = 0
    if args.collect:
        groups = []
        for name in cfg["runs"]:
            rundir = os.path.join(args.out, name)
            n = LAYOUTS[spec(name)[0]]["nranks"]
            if all(os.path.exists(os.path.join(rundir, f"rank{r}.json")) for r in range(n)):
                results[name] = summarize(name, rundir, n, None)
            else:
                missing[name] = "not finished when the grid was stopped"
    try:
        for names in groups:
            print(f"== [{done + 1}-{done + len(names)}/{len(cfg['runs'])}] " +
                  ", ".join(names), flush=True)
            for name, s in run_group(names, cfg, net, args, pkg, args.out).items():
                if s is None:
                    missing[name] = "failed (see logs)"
                    continue
                results[name] = s
                print(f"   {name}: loss {s['first_loss']:.3f} -> {s['train_loss']:.3f}, "
                      f"held-out {s['eval_loss']:.3f}, slow {s['slow_bytes'] / 1e6:.2f} MB, "
                      f"{s['train_seconds']:.0f} s", flush=True)
            done += len(names)
    finally:
        net.down()
    tag = cfg.get("tag", "")
    if cfg.get("grid"):
        groups = aggregate(results)
        record = {}
        text = grid_table(groups, cfg, net_desc)
        if missing:
            by_config = {}
            for n in missing:
                by_config.setdefault(spec(n)[5], []).append(str(spec(n)[4]))
            text += (f"\n\n{len(missing)} runs did not finish (seeds missing per configuration): " +
                     "; ".join(f"{c} {','.join(v)}" for c, v in by_config.items()) + ".")
        if groups:
            text += (f"\n\nPlot: `{os.path.basename(plot_grid(groups, args.out, tag))}` (held-out loss "
                     f"vs slow-link bytes, mean +- std over seeds, one curve per configuration).")
            verdict_text, record = verdicts(groups)
            text += "\n\n" + verdict_text
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        load = os.getloadavg()
        runs_at = [os.path.getmtime(os.path.join(args.out, n, "rank0.json")) for n in results]
        span = (f"; the runs finished between {time.strftime('%H:%M', time.gmtime(min(runs_at)))} "
                f"and {time.strftime('%H:%M', time.gmtime(max(runs_at)))} UTC" if runs_at else "")
        how = ("summarized by `--collect` from the run folders" if args.collect else
               "written by the grid run itself")
        text = (f"Produced {stamp} on {os.uname().nodename} ({os.cpu_count()} CPUs), {how}: "
                f"`{' '.join(['hetero.py'] + sys.argv[1:])}`; load average "
                f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min) at the end{span}."
                f"\n\n" + text)
    else:
        text = table(results, cfg, missing, net_desc)
        if results:
            text += (f"\n\nPlot: `{os.path.relpath(plot(results, args.out), args.out)}` in the "
                     f"output directory.")
    if "ddp" in results and "sparseloco" in results and results["sparseloco"]["slow_bytes"]:
        d, sp = results["ddp"], results["sparseloco"]
        text += (f"\n\nSparseLoCo vs dense DDP slow-link bytes: "
                 f"{d['slow_bytes'] / sp['slow_bytes']:.0f}x less in total (both carry the same "
                 f"uncompressed pipeline boundary), "
                 f"{d['dp_slow_bytes'] / max(sp['dp_slow_bytes'], 1):.0f}x less for data-parallel "
                 f"synchronisation alone (stage-link bytes measured and subtracted).")
    if not cfg.get("grid"):
        text += comparison(results)
    with open(os.path.join(args.out, f"results{tag}.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"config": cfg, "results": results, "missing": missing}, f, indent=1)
    if cfg.get("grid"):
        slim = {"config": {k: v for k, v in cfg.items() if k != "runs"}, "net": net_desc,
                "configurations": {c: {k: g[k] for k in ("what", "seeds", "loss", "slow",
                                                        "identical")}
                                   for c, g in aggregate(results).items()},
                "runs": {n: {k: r[k] for k in ("eval_loss", "train_loss", "slow_bytes",
                                               "dp_slow_bytes", "stage_bytes", "slow_act_bytes",
                                               "slow_table_bytes", "table_bytes",
                                               "table_dense_bytes", "identical",
                                               "basis_versions", "train_seconds",
                                               "wall_seconds")}
                         for n, r in results.items()},
                "missing": missing, "verdicts": record}
        with open(os.path.join(args.out, f"grid{tag}_summary.json"), "w") as f:
            json.dump(slim, f, indent=1)
        if args.results:
            os.makedirs(args.results, exist_ok=True)
            for name in (f"results{tag}.md", f"grid{tag}_summary.json",
                         f"loss_vs_bytes{tag}.png"):
                if os.path.exists(os.path.join(args.out, name)):
                    shutil.copy(os.path.join(args.out, name), args.results)
    print("\n" + text)
    if args.readme:
        write_readme(args.readme, text, f"results{tag}")
    return 0 if results and not any(v.startswith("failed") for v in missing.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
