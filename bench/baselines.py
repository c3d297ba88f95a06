#!/usr/bin/python3
"""The baselines LBCC's bench scripts divide by, their expected ranges, and the check that
refuses a run whose baseline is off (a starved ucx_perftest, a shaper that did not shape).

A ratio is only as good as its denominator: a ucx_perftest run that got 2 % of a core reports
126 MB/s instead of its usual ~5.9 GB/s, and dividing by it makes LBCC look 3-7x "faster than
the wire". Every script that writes a ratio to bench/results checks each baseline here first;
when one is off it prints why, writes nothing, leaves the existing results file as it was and
exits with REFUSED (3).

From a script's embedded Python (the scripts run from the repository root):

    sys.path.insert(0, "bench"); import baselines
    check = baselines.Checker("bench/results/transport.md")
    check("ucx_perftest_loopback", 126.4, where="BM_LoopbackTcp round 1")
    check("shaped_link_rate", 11.6, reference=12.5, where="BM_ShapedLink")
    check.refuse_if_off()          # prints every violation and exits 3, or returns

From bash:

    bench/baselines.py check ucx_perftest_loopback 126.4 --where "round 1" --out FILE || exit $?
    bench/baselines.py load        # "0.52 0.61 0.70": /proc/loadavg's 1, 5 and 15 min averages
    bench/baselines.py table       # the ranges and their reasons, as a Markdown table
"""

import argparse
import collections
import math
import sys

REFUSED = 3  # exit status of a refused run (1: the run failed, 2: a bad flag)

# lo / hi: the accepted range, None for no bound; relative ranges are multiples of a reference
# the caller passes (a configured link rate, a computed wire limit).
Range = collections.namedtuple("Range", "lo hi unit relative what reason")

RANGES = {
    "ucx_perftest_loopback": Range(
        1000, None, "MB/s", False,
        "ucx_perftest tag_bw, UCX_TLS=tcp on one host's loopback, 256 KiB-4 MiB messages",
        "5.8-5.9 GB/s on an idle 2-core VM; under 1 GB/s the run was starved of CPU (126-340 MB/s "
        "seen on a loaded machine), and a ratio to it flatters LBCC"),
    "ucx_perftest_veth": Range(
        400, None, "MB/s", False,
        "ucx_perftest tag_bw, UCX_TLS=tcp between two network namespaces (veth + bridge, MTU "
        "1500), 256 KiB-4 MiB messages",
        "1.8-2.5 GB/s on an idle 2-core VM; under 400 MB/s the run was starved of CPU"),
    "shaped_link_rate": Range(
        0.5, 1.05, "x the configured rate", True,
        "a rate measured over a shaped link (ucx_perftest, a probe, LBCC itself)",
        "above 1.05x the shaper was not in place (nothing crosses a tbf faster than its rate); "
        "under 0.5x the sender did not get a core and the link was never the limit"),
    "shaped_link_measured": Range(
        None, 1.05, "x the configured rate", True,
        "LBCC's own rate over a shaped link (a result, so no lower bound)",
        "above 1.05x the shaper was not in place"),
    "wire_limit_time": Range(
        0.85, None, "x the wire limit", True,
        "LBCC's time for a collective over shaped links against its wire limit (bytes each "
        "rank receives / link rate)",
        "no run beats its wire limit but by the tbf's 32 kB burst (0.87x for a 250 kB "
        "SparseAllReduce at 100 Mbit/s): under 0.85x the links were not shaped or the bytes "
        "were miscounted"),
    "gloo_wire_limit_time": Range(
        0.85, 2.0, "x the wire limit", True,
        "Gloo's dense ring time over shaped links against the ring's wire limit "
        "(2 (n-1)/n x bytes / link rate)",
        "1.2-1.3x on an idle 2-core VM; under 0.85x the links were not shaped, above 2x Gloo "
        "was starved of CPU and 'LBCC / Gloo' would flatter LBCC"),
    "gloo_loopback_bandwidth": Range(
        150, None, "MB/s", False,
        "Gloo's all-reduce of 16 MiB fp32, 4 ranks on one host's loopback (algorithm bandwidth)",
        "520-580 MB/s on an idle 2-core VM; under 150 MB/s Gloo was starved of CPU"),
    "lbcc_plain_loopback": Range(
        400, None, "MB/s", False,
        "LBCC's plain (unauthenticated) UCX tcp link on loopback, 4 MiB messages, 8 in flight "
        "(bench/secure_perf), the denominator of the security cost",
        "1.5-2.3 GB/s on a 2-core VM at load 2-5; under 400 MB/s the run was starved of CPU and "
        "every variant's ratio to it is noise"),
    "cipher_one_thread": Range(
        100, 100000, "MB/s", False,
        "one thread's AES-256-GCM or ChaCha20-Poly1305 seal or open of 1 MiB chunks "
        "(OpenSSL's EVP code)",
        "OpenSSL seals over 100 MB/s on any x86-64 core, with AES-NI or not; under that the "
        "run was starved, over 100 GB/s no cipher ran"),
    "triad": Range(
        0.1, 50, "G elements/s", False,
        "the streaming triad a[i] = b[i] + s*c[i] on arrays far beyond the caches "
        "(bench/limits.h BM_Triad)",
        "any core since 2010 streams over 0.1 G elements/s (1.2 GB/s), no socket over 50 G "
        "(600 GB/s): outside, the run was starved or the loop optimised away"),
    "memcpy": Range(
        1, 1000, "GB/s", False,
        "memcpy of arrays far beyond the caches (bench/limits.h BM_Memcpy)",
        "any core since 2010 copies over 1 GB/s, no socket over 1 TB/s: outside, the run was "
        "starved or the copy optimised away"),
    "sgemm": Range(
        1, 100000, "GFLOP/s", False,
        "cblas_sgemm (OpenBLAS; bench/limits.h BM_Sgemm)",
        "one AVX2 core runs over 20 GFLOP/s, a scalar one over 1; no CPU reaches 100 TFLOP/s: "
        "outside, the run was starved or the product skipped"),
}


def load():
    """The 1, 5 and 15 minute load averages as /proc/loadavg gives them: '0.52 0.61 0.70'."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def _fmt(x):
    return f"{x:.4g}"


def violation(name, value, reference=None):
    """None when `value` lies in the range of baseline `name`, else why it does not."""
    r = RANGES[name]
    if r.relative:
        if reference is None or not reference > 0:
            return f"{name}: no positive reference given for a range relative to one"
        scaled = value / reference
        shown = f"{_fmt(value)} = {scaled:.3g} {r.unit} ({_fmt(reference)})"
    else:
        scaled = value
        shown = f"{_fmt(value)} {r.unit}"
    if math.isnan(scaled) or (r.lo is not None and scaled < r.lo) or \
            (r.hi is not None and scaled > r.hi):
        return f"{r.what}: {shown}, expected {expected(name)}: {r.reason}"
    return None


def expected(name):
    """The range of `name` in words: '>= 1000 MB/s', '0.5-1.05 x the configured rate'."""
    r = RANGES[name]
    if r.lo is not None and r.hi is not None:
        return f"{_fmt(r.lo)}-{_fmt(r.hi)} {r.unit}"
    if r.lo is not None:
        return f">= {_fmt(r.lo)} {r.unit}"
    return f"<= {_fmt(r.hi)} {r.unit}"


class Checker:
    """Collects every off baseline of one run; refuse_if_off() then refuses the whole run."""

    def __init__(self, results):
        self.results = results  # the file the run would have written
        self.off = []

    def __call__(self, name, value, reference=None, where=""):
        why = violation(name, value, reference)
        if why:
            self.off.append(f"{where}: {why}" if where else why)
        return why is None

    def refuse_if_off(self):
        if not self.off:
            return
        print(f"refused: {len(self.off)} baseline(s) outside the expected range; not writing "
              f"{self.results or 'the results'} (left as it was); load average {load()}:",
              file=sys.stderr)
        for line in self.off:
            print(f"  {line}", file=sys.stderr)
        sys.exit(REFUSED)


def table():
    lines = ["| baseline | what | expected | why |", "|---|---|---|---|"]
    for name, r in RANGES.items():
        lines.append(f"| `{name}` | {r.what} | {expected(name)} | {r.reason} |")
    return "\n".join(lines)


def main(argv):
    parser = argparse.ArgumentParser(
        prog="bench/baselines.py",
        description="Expected ranges of the baselines bench scripts divide by (exit 3: refused).")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="exit 3 with the reason when VALUE is off NAME's range")
    c.add_argument("name", choices=sorted(RANGES))
    c.add_argument("value", type=float)
    c.add_argument("--reference", type=float, help="what a relative range is a multiple of")
    c.add_argument("--where", default="", help="which run the value comes from")
    c.add_argument("--out", default="", help="the results file the run would write")
    sub.add_parser("load", help="print /proc/loadavg's 1, 5 and 15 minute averages")
    sub.add_parser("table", help="print the ranges and their reasons as a Markdown table")
    args = parser.parse_args(argv)
    if args.command == "load":
        print(load())
    elif args.command == "table":
        print(table())
    else:
        check = Checker(args.out)
        check(args.name, args.value, args.reference, args.where)
        check.refuse_if_off()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
