#!/usr/bin/env python3
"""The elastic churn tests run many times: how many runs fail, and how many of the failures are
a process abort (issue 44 item 1: UCX 1.13's `async.c: Assertion handler->async == async`,
which tools/ucx/'s patches fix).

    nice /usr/bin/python3 bench/churn_runs.py [--runs 500] [--batch 50] [--minutes 0]
        [--ucx_library PATH] [--out bench/results/churn_runs.md] [--keep_logs DIR]

Runs //comm/elastic:elastic_units_c_api_test and //comm/elastic:elastic_churn_test (members as
processes over UCX, killed -9, stopped and restarted) in batches of `bazel test
--runs_per_test=BATCH --jobs=2 --flaky_test_attempts=1 --nocache_test_results`, two runs at a
time as the abort was first seen. Each run's log is classified: passed, a process abort (a UCX
or other assertion, SIGABRT), a crash (SIGSEGV), a timeout (Bazel's), or another failure; a
failed run's first telling lines go to the page, with UCX's backtrace of a crash, and the whole
log is kept under --keep_logs (one file per failed run). --minutes stops after the batch that passes
that time (0: all --runs). --ucx_library sets LBCC_UCX_LIBRARY for the tests (libucp.so.0: the
system's UCX, the baseline). Writes the markdown page (date, machine, load before and after,
command, UCX library) itself, after every batch. Not in CI.
"""

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import time

from baselines import load as loadavg  # /proc/loadavg's 1, 5 and 15 minute averages

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = ["//comm/elastic:elastic_units_c_api_test", "//comm/elastic:elastic_churn_test"]
PATCHED = os.path.expanduser("~/.cache/lbcc/ucx-1.13.1-lbcc")

ABORT = re.compile(r"Assertion `|SIGABRT|Aborted \(core|signal 6\b|exit(ed)? (code|status) 134")
BACKTRACE = "backtrace:"  # Separates a failure's telling lines from UCX's backtrace frames.
CRASH = re.compile(r"SIGSEGV|Segmentation fault|signal 11\b|exit(ed)? (code|status) 139")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] churn_runs: {msg}", flush=True)


def testlog_dir(test):
    package, name = test[2:].split(":")
    return os.path.join(ROOT, "bazel-testlogs", package, name)


def backtrace(lines):
    """The frames of UCX's first printed backtrace (`==== backtrace (tid: N) ====`), or []."""
    for i, l in enumerate(lines):
        if "==== backtrace" in l:
            frames = []
            for f in lines[i + 1:]:
                if "=================" in f or len(frames) == 24:
                    break
                frames.append(f)
            return frames
    return []


def classify(text, xml):
    """(kind, telling lines) of a failed run's log and test.xml."""
    all_lines = text.splitlines()
    lines = ([l for l in all_lines if ABORT.search(l) or CRASH.search(l)] +
             [l for l in all_lines if "FAILED" in l or " ERROR " in l])
    if any(ABORT.search(l) for l in lines):
        kind = "abort"
    elif any(CRASH.search(l) for l in lines):
        kind = "crash"
    elif "TIMEOUT" in xml or "timed out" in xml or "-- Test timed out" in text:
        kind = "timeout"
    else:
        kind = "other"
    frames = backtrace(all_lines) if kind in ("abort", "crash") else []
    return kind, lines[:4] + ([BACKTRACE] + frames if frames else [])


def one_batch(runs, ucx_library, keep_logs, first):
    """Runs every test `runs` times; {test: [(passed, kind, lines)]}. A failed run's log is
    copied to keep_logs as <test>.<run number counted from 1 over all batches>.log."""
    cmd = ["bazel", "test", f"--runs_per_test={runs}", "--jobs=2", "--flaky_test_attempts=1",
           "--nocache_test_results", "--test_output=summary"] + TESTS
    if ucx_library:
        cmd.insert(2, f"--test_env=LBCC_UCX_LIBRARY={ucx_library}")
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if run.returncode not in (0, 3):  # 3: some test failed, which is what is counted.
        raise RuntimeError(f"bazel test exited {run.returncode}:\n{run.stderr[-3000:]}")
    results = {}
    for test in TESTS:
        out = []
        for k in range(1, runs + 1):
            d = testlog_dir(test)
            if runs > 1:
                d = os.path.join(d, f"run_{k}_of_{runs}")
            try:
                xml = open(os.path.join(d, "test.xml"), errors="replace").read()
                text = open(os.path.join(d, "test.log"), errors="replace").read()
            except OSError as e:  # Bazel stopped before this run: counted, not lost.
                out.append((False, "other", [f"no result: {e}"]))
                continue
            failed = bool(re.search(r'(failures|errors)="[1-9]', xml)) or "<error" in xml or \
                "<failure" in xml
            if failed and keep_logs:
                os.makedirs(keep_logs, exist_ok=True)
                shutil.copyfile(os.path.join(d, "test.log"), os.path.join(
                    keep_logs, f"{test.split(':')[1]}.{first + k}.log"))
            out.append((not failed,) + (classify(text, xml) if failed else ("", [])))
        results[test] = out
    return results


def write_page(a, totals, failures, load_before, wall, partial):
    """The markdown page, rewritten after every batch (`partial` while more are to come)."""
    load_after = loadavg()
    library = a.ucx_library or (f"default: tools/setup's UCX with LBCC's patches ({PATCHED}, "
                                f"stamp {open(os.path.join(PATCHED, '.lbcc-patches')).read().strip()})")
    cmd = "bench/churn_runs.py " + " ".join(sys.argv[1:])
    lines = [
        "# Elastic churn tests, many runs: failures and process aborts" +
        (" (so far)" if partial else ""),
        "",
        f"Written by `{cmd}` on {time.strftime('%Y-%m-%d %H:%M %Z')}; machine "
        f"{platform.node()} ({os.cpu_count()} cores); load before {load_before}, after "
        f"{load_after} (the tests' own: two runs at a time); {wall / 60:.1f} minutes in all; "
        f"commit {subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True).stdout.strip()}.",
        f"UCX: {library}.",
        "",
        "| test | runs | passed | process aborts | crashes | timeouts | other failures |",
        "|---|---|---|---|---|---|---|",
    ]
    for t, v in totals.items():
        lines.append(f"| `{t}` | {v['runs']} | {v['passed']} | {v['abort']} | {v['crash']} | "
                     f"{v['timeout']} | {v['other']} |")
    all_runs = sum(v["runs"] for v in totals.values())
    all_aborts = sum(v["abort"] for v in totals.values())
    lines += ["", f"All: {all_runs} runs, {all_aborts} process aborts, "
              f"{sum(v['crash'] for v in totals.values())} crashes, "
              f"{sum(v['timeout'] for v in totals.values())} timeouts, "
              f"{sum(v['other'] for v in totals.values())} other failures."]
    if failures:
        lines += ["", "Failed runs (first telling lines of each log):", ""]
        for test, kind, tell in failures:
            cut = tell.index(BACKTRACE) if BACKTRACE in tell else len(tell)
            lines.append(f"- `{test}` ({kind}): " + " / ".join(
                "`" + l.strip()[:160].replace("`", "'") + "`" for l in tell[:cut]))
            if cut < len(tell):  # UCX's backtrace of an abort or a crash.
                lines += ["", "  ```"] + ["  " + l.rstrip()[:200] for l in tell[cut + 1:]] + \
                    ["  ```"]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=500, help="runs per test, at most")
    ap.add_argument("--batch", type=int, default=50, help="runs per test per bazel invocation")
    ap.add_argument("--minutes", type=float, default=0,
                    help="stop after the batch that passes this many minutes (0: all --runs)")
    ap.add_argument("--ucx_library", default="",
                    help="LBCC_UCX_LIBRARY for the tests (default: the transport's own choice)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "churn_runs.md"))
    ap.add_argument("--keep_logs", default="/tmp/lbcc_churn_runs",
                    help="folder for the whole log of each failed run ('': keep none)")
    a = ap.parse_args()
    if a.runs < 1 or a.batch < 1:
        sys.exit("churn_runs: --runs and --batch must be at least 1")
    if not a.ucx_library and not os.path.exists(os.path.join(PATCHED, "lib", "libucp.so.0")):
        sys.exit(f"churn_runs: no patched UCX at {PATCHED}: run tools/setup first")
    log(f"building {' '.join(TESTS)}")
    subprocess.run(["bazel", "build"] + TESTS, cwd=ROOT, check=True)
    load_before, t0 = loadavg(), time.time()
    totals = {t: {"runs": 0, "passed": 0, "abort": 0, "crash": 0, "timeout": 0, "other": 0}
              for t in TESTS}
    failures = []
    done = 0
    while done < a.runs:
        n = min(a.batch, a.runs - done)
        batch = one_batch(n, a.ucx_library, a.keep_logs, done)
        done += n
        for test, out in batch.items():
            for passed, kind, lines in out:
                totals[test]["runs"] += 1
                if passed:
                    totals[test]["passed"] += 1
                else:
                    totals[test][kind] += 1
                    failures.append((test, kind, lines))
        minutes = (time.time() - t0) / 60
        log(f"{done} runs per test in {minutes:.1f} min: " + "; ".join(
            f"{t.split(':')[1]} {v['passed']}/{v['runs']} passed, {v['abort']} aborts"
            for t, v in totals.items()) + f" (load {loadavg()})")
        stop = done >= a.runs or (a.minutes and minutes >= a.minutes)
        write_page(a, totals, failures, load_before, time.time() - t0, partial=not stop)
        if stop:
            break
    log(f"wrote {a.out}")


if __name__ == "__main__":
    main()
