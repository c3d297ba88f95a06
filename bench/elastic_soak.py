#!/usr/bin/python3
"""An hour of churn against an elastic job, with the long-lived processes' resources sampled
every minute (issue: flat resources under churn; not in CI).

Layout (tools/testbed, every down-link shaped to --rate), --layout pipeline (the default): a
model in two shard jobs whose two membership services share one ElasticUnits, in one process on
host 0 (//comm/elastic:elastic_churn_test in its master role); --members full replicas, one per
host 1..N, each a member of both shard jobs (the test's unit role: 64K-element SparseAllReduce
steps per shard through ElasticGroup, committed steps printed); and one two-stage pipeline
replica, stage 0 on host N+1 in shard 0's job and stage 1 on host N+2 in shard 1's, which the
services take out and readmit as a unit (a stage whose other stage left is told and joins again
by itself). --layout full: lbcc-master on host 0 and --members members of one job
(the test's member role, its error feedback replayed at exit), one per host 1..N.
Member 1 is the observed one and never an event's victim; the others meet an event
every --every seconds, in turn (--kinds): kill -9, SIGSTOP (evicted, then SIGCONT: it must exit by itself),
a clean leave (stdin closed: it leaves and exits 0), and a link cut (nftables drops everything on
the host's eth0 for peer timeout + 2 s, then lets it through again). A member that exited is
restarted at once (a new incarnation joins).

Every --sample seconds: the resident set (VmRSS), open file descriptors and threads of the
master and of the observed member (and the committed steps the observed member printed); fds
and threads are read every 0.25 s for 3 s and the lowest reading is the sample (the settled
count: a membership change holds a few more for a moment; the highest is shown beside it). The
figures: RSS at the end against minute 5 (goal within 5 %), descriptors' and threads' range from
minute 5 to the end (goal flat), events by kind, committed steps, members that exited with an
error other than the expected ones. Written with the date, machine, load and command to
--results.

    bench/elastic_soak.py [--minutes 60] [--every 5] [--members 4] [--rate 100mbit]
                          [--sample 60] [--results bench/results/elastic_soak.md]
                          [--transport ucx|socket] [--kinds kill,stop,leave,cut]
                          [--layout pipeline|full]

Needs root (network namespaces, nftables). Builds the two binaries first.
"""

import argparse
import datetime
import os
import platform
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from baselines import load  # /proc/loadavg's 1, 5 and 15 minute averages

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTBED = os.path.join(ROOT, "tools/testbed/testbed")
PEER_TIMEOUT_MS = 3000


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] elastic_soak: {msg}", flush=True)


def proc_stats(pid):
    """(RSS KiB, open fds, threads) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        rss = int(fields["VmRSS"].split()[0])
        threads = int(fields["Threads"])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        return rss, fds, threads
    except (OSError, KeyError, ValueError):
        return None


def settled_stats(pid, seconds=3.0, every=0.25):
    """(RSS KiB, fds, threads, peak fds, peak threads) of a live process over `seconds`: fds and
    threads at their lowest reading (a membership change in progress holds a few more for a
    moment: the peaks), RSS at the last; None if it ended."""
    readings = []
    end = time.time() + seconds
    while True:
        r = proc_stats(pid)
        if r is None:
            return None
        readings.append(r)
        if time.time() >= end:
            break
        time.sleep(every)
    return (readings[-1][0], min(r[1] for r in readings), min(r[2] for r in readings),
            max(r[1] for r in readings), max(r[2] for r in readings))


class Member:
    def __init__(self, soak, host, incarnation):
        self.host, self.incarnation = host, incarnation
        self.name = f"m{host}.{incarnation}"
        self.lines = []
        self.commits = 0
        self.replica_left = 0
        self.rejoins = 0
        self.event = None  # what was done to it, if anything
        env = ["env", "UCX_TLS=tcp", "UCX_NET_DEVICES=eth0", "UCX_MEM_EVENTS=no",
               f"LBCC_LISTEN_ADDR={soak.addr(host)}", f"LBCC_PEER_TIMEOUT_MS={PEER_TIMEOUT_MS}",
               f"ELASTIC_SEED={host}", f"ELASTIC_NAME={self.name}"]
        stage = soak.stage_of(host)
        if soak.args.layout == "full":
            env += ["ELASTIC_ROLE=member", f"ELASTIC_MASTER={soak.master_address}",
                    f"ELASTIC_BACKEND={soak.args.transport}"]
        elif stage is None:
            env += ["ELASTIC_ROLE=unit", f"ELASTIC_MASTERS={soak.master_address}",
                    "ELASTIC_SHARDS=0,1"]
        else:
            env += ["ELASTIC_ROLE=unit", f"ELASTIC_MASTERS={soak.master_address}",
                    f"ELASTIC_SHARDS={stage}", "ELASTIC_REPLICA=pipe", f"ELASTIC_STAGE={stage}",
                    "ELASTIC_STAGES=2"]
        wrap = shlex.split(soak.args.wrap_observed) if host == 1 else []
        self.proc = subprocess.Popen(
            [TESTBED, "exec", "--name", soak.name, str(host), "--"] + env + wrap +
            [soak.member_bin],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("COMMIT"):
                self.commits += 1
            elif line.startswith("REPLICA_LEFT"):  # told; it joins again by itself
                self.replica_left += 1
            elif line.startswith("REJOIN"):  # left for want of a decision; joins again
                self.rejoins += 1
                self.lines.append(line.rstrip())
            elif line.strip():
                self.lines.append(line.rstrip())

    def alive(self):
        return self.proc.poll() is None


class Soak:
    def __init__(self, args, workdir):
        self.args = args
        self.name = f"so{os.getpid() % 100000}"
        self.workdir = workdir
        self.member_bin = os.path.join(workdir, "comm/elastic/elastic_churn_test")
        self.master_bin = os.path.join(workdir, "tools/lbcc-master")
        self.members = {}
        self.incarnation = 0
        self.events = {"kill": 0, "stop": 0, "leave": 0, "cut": 0}
        self.unexpected = []
        self.samples = []
        self.replica_left_done = 0  # notices of members restarted since
        self.rejoins_done = 0

    def tb(self, *argv, check=True):
        return subprocess.run([TESTBED] + list(argv), check=check, capture_output=True,
                              text=True).stdout.strip()

    def addr(self, host):
        return self.tb("addr", "--name", self.name, str(host))

    def hosts(self):
        """Testbed hosts: the master's, the full members', the pipeline stages'."""
        return 1 + self.args.members + (2 if self.args.layout == "pipeline" else 0)

    def stage_of(self, host):
        """The pipeline stage on `host`, or None."""
        if self.args.layout != "pipeline" or host <= self.args.members:
            return None
        return host - self.args.members - 1

    def start_member(self, host):
        self.incarnation += 1
        self.members[host] = Member(self, host, self.incarnation)

    def up(self):
        n = self.hosts()
        self.tb("down", "--stale", check=False)
        self.tb("up", "--name", self.name, "--hosts", str(n), "--rate", self.args.rate, "--slow",
                ",".join(str(i) for i in range(n)), "--owner-pid", str(os.getpid()))
        port = 29500 + 2 * random.randrange(200)
        self.master_address = f"{self.addr(0)}:{port}"
        master_log = open(os.path.join(self.workdir, "master.log"), "w")
        if self.args.layout == "full":
            self.master = subprocess.Popen(
                [TESTBED, "exec", "--name", self.name, "0", "--", "env",
                 f"LBCC_PEER_TIMEOUT_MS={PEER_TIMEOUT_MS}", self.master_bin, "--job_id", "churn",
                 "--listen", self.master_address, "--min_members", "2"],
                stdout=master_log, stderr=subprocess.STDOUT)
        else:  # the two shard jobs' services, sharing the units, in one process
            self.master_address += f",{self.addr(0)}:{port + 1}"
            self.master = subprocess.Popen(
                [TESTBED, "exec", "--name", self.name, "0", "--", "env",
                 f"LBCC_PEER_TIMEOUT_MS={PEER_TIMEOUT_MS}", "ELASTIC_ROLE=master",
                 "ELASTIC_JOBS=shard0,shard1", f"ELASTIC_LISTEN={self.master_address}",
                 "ELASTIC_MIN_MEMBERS=2", self.member_bin],
                stdin=subprocess.PIPE, stdout=master_log, stderr=subprocess.STDOUT)
        for host in range(1, n):
            self.start_member(host)

    def cut(self, host, seconds):
        ns = f"lbcc-{self.name}-h{host}"
        subprocess.run(["ip", "netns", "exec", ns, "nft", "add table inet soak_cut; add chain inet "
                        "soak_cut in { type filter hook input priority 0; policy drop; }; add chain"
                        " inet soak_cut out { type filter hook output priority 0; policy drop; }"],
                       check=True)
        time.sleep(seconds)
        subprocess.run(["ip", "netns", "exec", ns, "nft", "delete table inet soak_cut"], check=True)

    def event(self, k):
        victims = [h for h in self.members if h != 1 and self.members[h].alive()]
        if not victims:
            return
        host = random.choice(victims)
        m = self.members[host]
        kinds = self.args.kinds.split(",")
        kind = kinds[k % len(kinds)]
        self.events[kind] += 1
        m.event = kind
        if kind == "kill":
            m.proc.kill()  # the testbed exec'd process itself: SIGKILL
        elif kind == "stop":
            os.kill(m.proc.pid, signal.SIGSTOP)
            time.sleep(PEER_TIMEOUT_MS / 1000 + 2)
            os.kill(m.proc.pid, signal.SIGCONT)
        elif kind == "leave":
            m.proc.stdin.close()
        else:
            self.cut(host, PEER_TIMEOUT_MS / 1000 + 2)

    def reap(self):
        """Restarts members that exited; records exits that no event explains."""
        for host, m in list(self.members.items()):
            if m.alive():
                continue
            code = m.proc.returncode
            # What each event must end in: killed (-9); stopped: evicted (3); a clean leave: 0;
            # cut off: evicted (3), or Unavailable (1) when the membership service fell silent to
            # it first. Anything else, any exit without an event, or an error-feedback mismatch
            # is a finding.
            text = " | ".join(m.lines[-3:])
            expected = {"kill": (-9,), "stop": (3,), "leave": (0,), "cut": (1, 3)}.get(m.event, ())
            if m.event == "cut" and code == 1 and "UNAVAILABLE" not in text:
                expected = ()
            if code not in expected or any("EF MISMATCH" in l for l in m.lines):
                self.unexpected.append(f"{m.name} ({m.event or 'no event'}) exited {code}: {text}")
            if host == 1:
                self.unexpected.append(f"the observed member {m.name} exited {code}")
            self.replica_left_done += m.replica_left
            self.rejoins_done += m.rejoins
            self.start_member(host)

    def replica_left_total(self):
        return self.replica_left_done + sum(m.replica_left for m in self.members.values())

    def rejoin_total(self):
        return self.rejoins_done + sum(m.rejoins for m in self.members.values())

    def sample(self, minute):
        master = settled_stats(self.master.pid)
        member = self.members[1]
        observed = settled_stats(member.proc.pid) if member.alive() else None
        self.samples.append((minute, master, observed, member.commits, load(),
                             sum(self.events.values())))
        log(f"minute {minute:.1f}: master {master}, observed member {observed}, "
            f"its commits {member.commits}, events {self.events}")

    def down(self):
        for m in self.members.values():
            if m.alive():
                m.proc.kill()
        if getattr(self, "master", None) and self.master.poll() is None:
            if self.master.stdin:
                self.master.stdin.close()  # the master role stops when its stdin closes
                try:
                    self.master.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
            if self.master.poll() is None:
                self.master.terminate()
                self.master.wait()
        self.tb("down", "--name", self.name, check=False)


def build(workdir):
    log("building //comm/elastic:elastic_churn_test and //tools:lbcc-master")
    subprocess.run(["bazel", "build", "--jobs=2", "//comm/elastic:elastic_churn_test",
                    "//tools:lbcc-master"], cwd=ROOT, check=True)
    # A private copy: members restarted later load what the run started with.
    for rel in ("comm/elastic/elastic_churn_test", "tools/lbcc-master"):
        os.makedirs(os.path.dirname(os.path.join(workdir, rel)), exist_ok=True)
        shutil.copy(os.path.join(ROOT, "bazel-bin", rel), os.path.join(workdir, rel))
    shutil.copytree(os.path.join(ROOT, "bazel-bin/_solib_k8"), os.path.join(workdir, "_solib_k8"),
                    symlinks=False, dirs_exist_ok=True)


def summarize(soak, args, minutes_run, load_before, load_after):
    rows = ["| minute | master RSS (KiB) | fds (peak) | threads (peak) | observed member RSS "
            "(KiB) | fds (peak) | threads (peak) | its commits | load |",
            "|---|---|---|---|---|---|---|---|---|"]
    for minute, master, member, commits, ld, _ in soak.samples:
        m = master or ("-",) * 5
        o = member or ("-",) * 5
        rows.append(f"| {minute:.0f} | {m[0]} | {m[1]} ({m[3]}) | {m[2]} ({m[4]}) | {o[0]} | "
                    f"{o[1]} ({o[3]}) | {o[2]} ({o[4]}) | {commits} | {ld} |")
    steady = [s for s in soak.samples if s[0] >= 5]
    verdict = []
    for label, idx in (("master", 1), ("observed member", 2)):
        seen = [s[idx] for s in soak.samples if s[idx] is not None]
        if seen:
            verdict.append(f"- {label}, whole run: at most {max(x[4] for x in seen)} threads, "
                           f"{max(x[3] for x in seen)} fds, {max(x[0] for x in seen)} KiB RSS "
                           f"({len(seen)} samples)")
    for label, idx in (("master", 1), ("observed member", 2)):
        series = [s[idx] for s in steady if s[idx] is not None]
        if len(series) < 2:
            verdict.append(f"- {label}: fewer than two samples from minute 5 on")
            continue
        rss0, rss1 = series[0][0], series[-1][0]
        with_events = [s for s in steady if s[idx] is not None]
        events = with_events[-1][5] - with_events[0][5]
        per_event = f", {(rss1 - rss0) / events:.1f} KiB per event ({events} events)" if events else ""
        fds = [s[1] for s in series]
        threads = [s[2] for s in series]
        peaks = f"; peaks fds {min(s[3] for s in series)}-{max(s[3] for s in series)}, threads " \
                f"{min(s[4] for s in series)}-{max(s[4] for s in series)}"
        verdict.append(
            f"- {label}: RSS {rss0} KiB at minute {steady[0][0]:.0f}, {rss1} KiB at the end = "
            f"{rss1 / rss0:.3f}x{per_event} (goal within 5 %: {'met' if abs(rss1 / rss0 - 1) <= 0.05 else 'NOT met'}); "
            f"settled fds {min(fds)}-{max(fds)}, threads {min(threads)}-{max(threads)} from minute "
            f"5 on ({'flat' if max(fds) == min(fds) and max(threads) == min(threads) else 'NOT flat'})"
            f"{peaks}")
    commits = [s[3] for s in soak.samples]
    verdict.append(f"- events: {soak.events} in {minutes_run:.1f} minutes; the observed member "
                   f"committed {commits[-1] if commits else 0} "
                   f"{'steps' if args.layout == 'full' else 'shard exchanges'}")
    if args.layout == "pipeline":
        verdict.append(f"- pipeline stages told that their replica left (and joined again): "
                       f"{soak.replica_left_total()}; members that left a shard's group for "
                       f"want of a decision (DeadlineExceeded) and joined again: "
                       f"{soak.rejoin_total()}")
    verdict.append(f"- unexpected exits: {len(soak.unexpected)}" +
                   "".join(f"\n  - {u}" for u in soak.unexpected[:20]))
    return "\n".join(verdict) + "\n\n" + "\n".join(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--every", type=float, default=5, help="seconds between events")
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--rate", default="100mbit")
    parser.add_argument("--sample", type=float, default=60, help="seconds between samples")
    parser.add_argument("--results", default="bench/results/elastic_soak.md")
    parser.add_argument("--kinds", default="kill,stop,leave,cut",
                        help="the events, in turn (a subset of kill,stop,leave,cut)")
    parser.add_argument("--transport", default="ucx", choices=["ucx", "socket"],
                        help="the members' backend (LBCC_TRANSPORT; --layout full only)")
    parser.add_argument("--wrap-observed", default="",
                        help="a command the observed member runs under, for investigations "
                             "(e.g. 'heaptrack -o /tmp/member'); its samples then describe "
                             "the wrapper's process")
    parser.add_argument("--layout", default="pipeline", choices=["pipeline", "full"],
                        help="two shard jobs with full replicas and one two-stage pipeline "
                             "replica, or one job of full replicas under lbcc-master")
    args = parser.parse_args()
    if args.layout == "pipeline" and args.transport != "ucx":
        sys.exit("elastic_soak: --layout pipeline runs over ucx only (use --layout full)")
    if not args.kinds or set(args.kinds.split(",")) - {"kill", "stop", "leave", "cut"}:
        sys.exit(f"elastic_soak: --kinds {args.kinds!r}: a subset of kill,stop,leave,cut")
    if os.geteuid() != 0:
        sys.exit("elastic_soak: needs root (network namespaces)")
    why = subprocess.run([TESTBED, "check", "--nat"], capture_output=True, text=True)
    if why.returncode != 0:
        sys.exit(f"elastic_soak: {why.stdout.strip()}")
    command = "bench/elastic_soak.py " + " ".join(sys.argv[1:])
    workdir = tempfile.mkdtemp(prefix="lbcc_soak_")
    git = lambda *a: subprocess.run(["git"] + list(a), cwd=ROOT, capture_output=True,
                                    text=True).stdout.strip()
    tree = git("rev-parse", "--short", "HEAD") + (" with changes" if git("status", "--porcelain",
                                                                          "-uno") else "")
    build(workdir)
    load_before = load()
    soak = Soak(args, workdir)
    random.seed(7)
    start = time.time()
    try:
        soak.up()
        log(f"testbed {soak.name} up, master at {soak.master_address}, "
            f"{args.members} members; {args.minutes} minutes, an event every {args.every} s")
        next_sample, k = start, 0
        while time.time() - start < args.minutes * 60:
            if time.time() >= next_sample:
                soak.sample((time.time() - start) / 60)
                next_sample += args.sample
            soak.reap()
            soak.event(k)
            k += 1
            time.sleep(args.every)
        soak.sample((time.time() - start) / 60)
    finally:
        soak.down()
    minutes_run = (time.time() - start) / 60
    summary = summarize(soak, args, minutes_run, load_before, load())
    print(summary)
    if args.results:
        with open(os.path.join(ROOT, args.results), "w") as f:
            f.write(f"# {args.minutes:g} minutes of churn against an elastic job "
                    "(bench/elastic_soak.py)\n\n")
            f.write("Written by the script; do not edit. Date: "
                    f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC.\n")
            f.write(f"Machine: {platform.node()}, {os.cpu_count()} cores, shared with other jobs. "
                    f"Tree: {tree}.\n")
            f.write(f"Command: `{command}`\n")
            # Allocator settings the members inherit change what the RSS columns measure.
            allocator = {k: v for k, v in os.environ.items()
                         if k == "GLIBC_TUNABLES" or k.startswith("MALLOC_")}
            if allocator:
                f.write("Allocator environment: " +
                        ", ".join(f"`{k}={v}`" for k, v in sorted(allocator.items())) + "\n")
            f.write(f"Load average (1, 5, 15 min): {load_before} before, {load()} after.\n")
            if args.layout == "full":
                f.write(f"Layout: lbcc-master on testbed host 0, {args.members} members on "
                        f"hosts 1..{args.members} over {args.transport}")
            else:
                f.write(f"Layout: two shard jobs' membership services sharing one ElasticUnits "
                        f"in one process on testbed host 0 (the master row), {args.members} "
                        f"full replicas (members of both jobs) on hosts 1..{args.members}, one "
                        f"two-stage pipeline replica on hosts {args.members + 1} and "
                        f"{args.members + 2} (stage 0 in shard 0's job, stage 1 in shard 1's), "
                        "over ucx")
            f.write(f" (every down-link {args.rate}), LBCC_PEER_TIMEOUT_MS {PEER_TIMEOUT_MS}; "
                    "member 1 observed and never a victim; the other members and both stages "
                    "meet the events.\n\n")
            f.write(summary + "\n")
        log(f"wrote {args.results}")
    shutil.rmtree(workdir, ignore_errors=True)
    if soak.unexpected:
        sys.exit(1)


if __name__ == "__main__":
    main()
