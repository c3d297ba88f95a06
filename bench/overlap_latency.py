#!/usr/bin/env python3
"""Pipeline-boundary activation latency while a SparseLoCo fragment exchange runs on a slow
link, against the same link idle (issue 42, docs/overlap.md "Streaming").

    nice -n 15 /usr/bin/python3 bench/overlap_latency.py [--rates 25mbit,100mbit]
        [--out bench/results/overlap_activation_latency.md]

Two ranks in tools/testbed namespaces: rank 0 (stage 0, fast host) and rank 1 (stage 1, slow
host: its down- and up-link shaped by tc tbf to RATE). Rank 0 sends an activation message to
rank 1 (send_compressed: high priority) and rank 1 answers with its gradient message; rank 0
times the round trip (one clock: no cross-host timing). Idle: pings alone. Loaded: in each of
BLOCKS blocks both ranks post a fragment's sparse_all_reduce (async_op=True: bulk priority, as
SparseLoCo(overlap=) posts it) and rank 0 pings every INTERVAL ms until its exchange finished
(Request.test(); the ping's first element tells rank 1 whether another follows); every such
ping is loaded (those during the exchange's encode, before bytes flow, too). The fragment
is FRAGMENT_ELEMENTS float32 at top_k / 4096 with VALUES values (the overlap bench's exchange).
Writes the markdown table (date, machine, load before and after, command) itself.
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from baselines import load as loadavg  # /proc/loadavg's 1, 5 and 15 minute averages

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TESTBED = os.path.join(ROOT, "tools", "testbed", "testbed")


def worker(a):
    import torch
    import lbcc
    torch.set_num_threads(1)
    comm = lbcc.init(timeout=300)
    rank = comm.rank
    peer = 1 - rank
    act = torch.randn(a.act_elements)
    back = torch.empty(a.act_elements)
    codec = lbcc.DenseQuantCodec("bf16")
    sparse = lbcc.TopKEfCodec(top_k=a.top_k, values=a.values)
    state = sparse.new_state()
    g = torch.Generator().manual_seed(rank)
    delta = torch.randn(a.fragment_elements // 1024, 1024, generator=g)
    out = torch.empty_like(delta)
    payload_bytes = len(sparse.encode(delta, sparse.new_state(), commit=False))

    def ping(go=1.0):
        """One round trip; act[0] tells rank 1 whether another ping follows (1) or not (0)."""
        t0 = time.perf_counter()
        if rank == 0:
            act[0] = go
            comm.send_compressed(act, peer, 1, codec)
            comm.recv_compressed(back, peer, 2)
        else:
            comm.recv_compressed(back, peer, 1)
            comm.send_compressed(act, peer, 2, codec)
        return time.perf_counter() - t0, float(back[0]) if rank == 1 else go

    def pings(while_running=None, count=None):
        """Rank 0 pings while `while_running` is not finished (or `count` times); rank 1
        answers until told the last one came. Returns rank 0's round trips."""
        rtts = []
        if rank == 0:
            n = 0
            while (while_running is not None and not while_running.test()) or (
                    count is not None and n < count):
                rtts.append(ping(1.0)[0])
                n += 1
                time.sleep(a.interval_ms / 1e3)  # one activation per inner step, not a flood
            ping(0.0)
        else:
            while ping()[1] != 0.0:
                pass
        return rtts

    for _ in range(5):  # warm-up: connections, lanes
        ping(1.0)
    pings(count=0)
    comm.barrier()
    idle = pings(count=a.pings * a.blocks)
    comm.barrier()
    loaded, exchange_s = [], []
    for b in range(a.blocks):
        t0 = time.perf_counter()
        req = comm.sparse_all_reduce([delta], [out], sparse, [state], async_op=True)
        loaded += pings(while_running=req)
        req.wait()
        exchange_s.append(time.perf_counter() - t0)
        if rank == 0:
            print(f"  block {b + 1}/{a.blocks}: {len(loaded)} loaded pings so far", flush=True)
    comm.barrier()
    if rank == 0:
        counters = comm.link_counters(peer)
        with open(a.result, "w") as f:
            json.dump({"idle": idle, "loaded": loaded, "exchange_s": exchange_s,
                       "link_class": counters["link_class"],
                       "probed_mbit": counters["probed_send_bytes_per_second"] * 8e-6,
                       "bulk_pace_mbit": counters["bulk_pace_bytes_per_second"] * 8e-6,
                       "payload_bytes": payload_bytes,
                       "act_bytes": len(codec.encode(act))}, f)
    comm.close()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# Transport settings compared (environment defaults, base/env.cc): LBCC's defaults, and a slow
# link tuned for latency: small chunks, a window of a few chunks (a high-priority message waits
# for at most the bytes in flight) and pacing just below the shaped rate (so tbf's queue, which
# no priority reaches, stays short).
def settings(name, rate):
    mbit = float(rate.rstrip("mbit"))
    if name == "default":  # bulk yields to latency-critical traffic (LBCC_SLOW_BULK_YIELD=1)
        return {}
    if name == "noyield":  # the scheduler before bulk yielding: priorities and credits only
        return {"LBCC_SLOW_BULK_YIELD": "0"}
    if name == "tight":
        return {"LBCC_SLOW_CHUNK_BYTES": "8K", "LBCC_SLOW_WINDOW_BYTES": "16K",
                "LBCC_SLOW_PACE_MBITS": f"{0.9 * mbit:g}"}
    if name == "headroom":  # tight, paced further below the rate: tbf's bucket refills
        return {"LBCC_SLOW_CHUNK_BYTES": "8K", "LBCC_SLOW_WINDOW_BYTES": "16K",
                "LBCC_SLOW_PACE_MBITS": f"{0.7 * mbit:g}"}
    if name == "latency":
        return {"LBCC_SLOW_CHUNK_BYTES": "16K", "LBCC_SLOW_WINDOW_BYTES": "64K",
                "LBCC_SLOW_PACE_MBITS": f"{0.9 * mbit:g}"}
    raise ValueError(name)


def run_rate(a, rate, setting, pkg, tmp):
    name = f"ol{os.getpid()}"
    subprocess.run([TESTBED, "down", "--stale"], capture_output=True)
    subprocess.run([TESTBED, "up", "--name", name, "--hosts", "2", "--rate", rate, "--slow", "1",
                    "--uplink", "--owner-pid", str(os.getpid())], check=True, capture_output=True)
    try:
        addr = [subprocess.run([TESTBED, "addr", "--name", name, str(r)], check=True,
                               capture_output=True, text=True).stdout.strip() for r in (0, 1)]
        port = 20000 + (os.getpid() * 13) % 20000
        result = os.path.join(tmp, f"{rate}_{setting}.json")
        procs = []
        for r in (0, 1):
            env = {"PYTHONPATH": pkg, "OMP_NUM_THREADS": "1", "UCX_TLS": "tcp",
                   "UCX_NET_DEVICES": "eth0", "UCX_MEM_EVENTS": "no", "RANK": str(r),
                   "WORLD_SIZE": "2", "LBCC_BOOTSTRAP_ADDR": f"{addr[0]}:{port}",
                   "LBCC_LISTEN_ADDR": addr[r], "LBCC_SLOW_RANKS": "1",
                   **settings(setting, rate)}
            argv = [sys.executable, os.path.abspath(__file__), "--worker", "--result", result,
                    "--pings", str(a.pings), "--blocks", str(a.blocks),
                    "--fragment-elements", str(a.fragment_elements), "--top-k", str(a.top_k),
                    "--values", a.values, "--act-elements", str(a.act_elements),
                    "--interval-ms", str(a.interval_ms)]
            procs.append(subprocess.Popen([TESTBED, "exec", "--name", name, str(r), "--", "env",
                                           *[f"{k}={v}" for k, v in env.items()], *argv],
                                          stdout=None if r == 0 else subprocess.DEVNULL,
                                          stderr=subprocess.STDOUT))
        for p in procs:
            if p.wait(timeout=900) != 0:
                sys.exit(f"overlap_latency: a rank failed at {rate}")
        with open(result) as f:
            return json.load(f)
    finally:
        subprocess.run([TESTBED, "down", "--name", name], capture_output=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--rates", default="25mbit,100mbit")
    ap.add_argument("--settings", default="default,noyield,tight",
                    help="transport settings to compare (default, noyield, latency, tight, "
                         "headroom)")
    ap.add_argument("--pings", type=int, default=40, help="idle pings per block")
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--interval-ms", type=float, default=20.0,
                    help="pause between pings (an inner step's compute between two boundary "
                         "messages)")
    ap.add_argument("--fragment-elements", type=int, default=1 << 20)
    ap.add_argument("--top-k", type=int, default=512)
    ap.add_argument("--values", default="fp32")
    ap.add_argument("--act-elements", type=int, default=8 * 64 * 8,
                    help="activation message elements (batch 8 x context 64 x boundary rank 8)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results",
                                                  "overlap_activation_latency.md"))
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    so = os.path.join(ROOT, "bazel-bin", "python", "lbcc", "_lbcc.so")
    if not os.path.exists(so):
        sys.exit(f"{so} missing: bazel build //python:lbcc")
    check = subprocess.run([TESTBED, "check"], capture_output=True, text=True)
    if check.returncode != 0:
        sys.exit(f"overlap_latency: the testbed is not usable here: {check.stdout}{check.stderr}")
    tmp = tempfile.mkdtemp(prefix="overlap_latency")
    pkg = os.path.join(tmp, "pkg")
    shutil.copytree(os.path.join(ROOT, "python", "lbcc"), os.path.join(pkg, "lbcc"))
    shutil.copy(so, os.path.join(pkg, "lbcc", "_lbcc.so"))
    load_before = loadavg()
    rows = []
    for rate in a.rates.split(","):
        for setting in a.settings.split(","):
            print(f"== {rate}, transport settings {setting}", flush=True)
            r = run_rate(a, rate, setting, pkg, tmp)
            idle = r["idle"]
            # The baseline a ratio divides by: enough pings, positive, below 1 s.
            if not (len(idle) >= 10 and 0 < statistics.median(idle) < 1.0):
                sys.exit(f"overlap_latency: idle baseline not sane at {rate}: {idle[:5]}")
            rows.append((rate, setting, r, statistics.median(idle)))
    load_after = loadavg()
    rev = subprocess.run(["git", "-C", ROOT, "log", "-1", "--format=%h %s"], capture_output=True,
                         text=True).stdout.strip()
    lines = [
        "# Activation latency under a fragment exchange (issue 42)",
        "",
        "Written by `bench/overlap_latency.py`; do not edit by hand.",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- machine: {platform.node()}, {platform.platform()}, {os.cpu_count()} cores, load "
        f"average {load_before} before, {load_after} after",
        f"- tree: {rev}",
        f"- command: `{' '.join(['bench/overlap_latency.py'] + sys.argv[1:])}`",
        f"- setup: 2 ranks in tools/testbed namespaces, rank 1's down- and up-link shaped by tc "
        f"tbf (burst 32kb, queue limit 1mb); activation {a.act_elements} floats as bf16 "
        f"(send_compressed, high priority) rank 0 -> rank 1 and back, round trip timed at rank 0; "
        f"fragment exchange: sparse_all_reduce(async_op=True, bulk) of {a.fragment_elements} "
        f"floats at top_k {a.top_k}/4096, {a.values} values; {a.blocks} blocks, a ping every "
        f"{a.interval_ms:g} ms while rank 0's exchange runs (loaded); {a.pings * a.blocks} idle "
        "pings before; the link class from rank 0's link counters (LBCC_SLOW_RANKS=1)",
        "",
        "| link | transport settings | link class | activation B | exchange payload B per rank | exchange s (median) "
        "| idle pings | idle p50 ms | idle p90 ms | loaded pings | loaded p50 ms "
        "| loaded p90 ms | loaded max ms | loaded p50 / idle p50 | loaded p90 / idle p50 "
        "| loaded pings > 1.2x idle p50 | floor ms | loaded p50 / floor "
        "| probed rate Mbit/s (rank 0) | bulk pace Mbit/s (rank 0) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rate, setting, r, med_i in rows:
        idle, loaded = r["idle"], r["loaded"]
        if loaded:
            lo = (f"{len(loaded)} | {statistics.median(loaded) * 1e3:.2f} | "
                  f"{pct(loaded, 0.9) * 1e3:.2f} | {max(loaded) * 1e3:.2f} | "
                  f"{statistics.median(loaded) / med_i:.2f} | {pct(loaded, 0.9) / med_i:.2f} | "
                  f"{sum(1 for x in loaded if x > 1.2 * med_i) / len(loaded):.0%}")
        else:
            lo = "0 | - | - | - | - | - | -"
        # The round trip of the activation and its answer serialized at the shaped rate (what
        # a loaded link costs even with perfect priority: tbf's burst, which an idle ping rides,
        # is spent).
        floor = 2 * r["act_bytes"] * 8 / (float(rate.rstrip("mbit")) * 1e6)
        lo += (f" | {floor * 1e3:.2f} | "
               f"{statistics.median(loaded) / floor if loaded else float('nan'):.2f}")
        pace = r.get("bulk_pace_mbit", 0)
        lo += f" | {r.get('probed_mbit', 0):.1f} | {f'{pace:.1f}' if pace else 'no yield'}"
        env = " ".join(f"{k}={v}" for k, v in settings(setting, rate).items()) or "LBCC's"
        lines.append(f"| {rate} | {setting}: {env} | {r['link_class']} | {r['act_bytes']} | {r['payload_bytes']} | "
                     f"{statistics.median(r['exchange_s']):.3f} | {len(idle)} | "
                     f"{med_i * 1e3:.2f} | {pct(idle, 0.9) * 1e3:.2f} | {lo} |")
    lines.append("")
    lines.append("Goal (issue 42): loaded p50 / idle p50 <= 1.2. floor: 2 x activation bytes at "
                 "the shaped rate, the round trip's serialization once tbf's burst (32 kB, which "
                 "an idle ping rides) is spent by the exchange.")
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
