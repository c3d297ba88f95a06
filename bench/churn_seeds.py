#!/usr/bin/env python3
"""The heterogeneous demo's churn run (examples/hetero_training/hetero.py --churn, the smoke
test's tiny model) repeated over kill seeds: whether each run passes check_churn.py, and when the
surviving stage was told that its replica left, against the kill (issue 44 item 5: an evicted
stage inside its exchange is told late, and a late one can miss its replica's rejoin).

    nice -n 10 /usr/bin/python3 bench/churn_seeds.py [--seeds 0,3] [--repeats 3]
        [--out bench/results/churn_seeds.md]

Each run is hetero.py's churn smoke run (80 steps, H = 5, d = 32, 2 layers, context 16, one
kill of a pipeline stage, tools/testbed namespaces) with --churn-seed SEED; the times come from
the run's summary.json (the driver's clock: the kill, the surviving stage's replica_left
report, the re-formed pipeline pair). Builds the package's extension first (bazel), then writes
the markdown table (date, machine, load before and after, command) itself. Not in CI.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

from baselines import load as loadavg  # /proc/loadavg's 1, 5 and 15 minute averages

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HETERO = os.path.join(ROOT, "examples", "hetero_training")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] churn_seeds: {msg}", flush=True)


def one_run(seed, out, python):
    """One churn smoke run with `seed`: (passed, kill s, told s, pair-up s, failures)."""
    cmd = [python, os.path.join(HETERO, "hetero.py"), "--preset", "smoke", "--churn",
           "--churn-seed", str(seed), "--steps", "80", "--inner-steps", "5", "--d", "32",
           "--layers", "2", "--seq", "16", "--timeout", "120", "--out", out]
    run = subprocess.run(cmd, capture_output=True, text=True)
    summary_path = os.path.join(out, "churn_sparseloco", "summary.json")
    if not os.path.exists(summary_path):  # A failed churn run still writes its summary.
        raise RuntimeError(f"hetero.py --churn-seed {seed} exited {run.returncode} with no "
                           f"summary:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    check = subprocess.run([python, os.path.join(HETERO, "check_churn.py"), out],
                           capture_output=True, text=True)
    with open(summary_path) as f:
        summary = json.load(f)
    kill = told = pair = None
    for ev in summary["events"]:
        t = float(ev["t"])
        if ev.get("killed") and kill is None:
            kill = t
        elif ev.get("replica_left") and kill is not None and told is None:
            told = t
        elif "pipeline pair 1 up" in ev.get("what", "") and pair is None:
            pair = t
    failed = [l.strip()[5:] for l in check.stdout.splitlines() if l.startswith("FAIL")]
    return check.returncode == 0, kill, told, pair, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,3", help="kill seeds (--churn-seed), comma-separated")
    ap.add_argument("--repeats", type=int, default=3, help="runs per seed")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "churn_seeds.md"))
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    if a.repeats < 1:
        sys.exit("churn_seeds: --repeats must be at least 1")
    python = os.environ.get("LBCC_PYTHON", "/usr/bin/python3")
    log("building //python:lbcc/_lbcc.so (hetero.py runs the package bazel-bin holds)")
    subprocess.run(["bazel", "build", "//python:lbcc/_lbcc.so"], cwd=ROOT, check=True)
    load_before, t0 = loadavg(), time.time()
    rows = []
    tmp = tempfile.mkdtemp(prefix="churn_seeds_")
    try:
        for seed in seeds:
            for i in range(a.repeats):
                log(f"seed {seed}, run {i + 1} of {a.repeats}")
                out = os.path.join(tmp, f"s{seed}_{i}")
                rows.append((seed, i + 1) + one_run(seed, out, python))
                log(f"  {'passed' if rows[-1][2] else 'failed'}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rev = subprocess.run(["git", "-C", ROOT, "log", "-1", "--format=%h"], capture_output=True,
                         text=True).stdout.strip()

    def sec(x):
        return "-" if x is None else f"{x:.2f}"

    lines = [
        "# The demo's churn run over kill seeds (bench/churn_seeds.py)", "",
        f"Written by the script; do not edit. Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        f"Machine: {platform.node()}, {os.cpu_count()} cores. Tree: {rev}.",
        f"Command: `bench/churn_seeds.py {' '.join(sys.argv[1:])}`".rstrip(),
        f"Load average (1, 5, 15 min): {load_before} before, {loadavg()} after; "
        f"{time.time() - t0:.0f} s.", "",
        "Each run: `hetero.py --preset smoke --churn --churn-seed SEED --steps 80 --inner-steps 5 "
        "--d 32 --layers 2 --seq 16` on tools/testbed namespaces, checked by check_churn.py. "
        "Times in seconds on the driver's clock: the kill, the surviving stage's replica_left "
        "report (told - kill: how late it learned), the re-formed pipeline pair.", "",
        "| seed | run | checks | kill s | told s | told - kill s | pair up s | failed checks |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for seed, run, passed, kill, told, pair, failed in rows:
        late = None if kill is None or told is None else told - kill
        lines.append(f"| {seed} | {run} | {'pass' if passed else 'fail'} | {sec(kill)} | "
                     f"{sec(told)} | {sec(late)} | {sec(pair)} | "
                     f"{'; '.join(f[:60] for f in failed) or '-'} |")
    for seed in seeds:
        mine = [r for r in rows if r[0] == seed]
        lines.append("")
        lines.append(f"- seed {seed}: {sum(r[2] for r in mine)} of {len(mine)} runs pass")
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    log(f"wrote {a.out}")


if __name__ == "__main__":
    main()
