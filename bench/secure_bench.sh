#!/usr/bin/env bash
# What issue 24's security costs, authenticated (+ encrypted) against plain, one run of ratios,
# written to bench/results/secure.md (date, machine, command):
#   1. UCX tcp point-to-point on loopback, 4 MiB messages: throughput of plain, integrity-only
#      (LBCC_ENCRYPT=none) and encrypted (LBCC_ENCRYPT=all) links, the three alternating in one
#      process for --rounds rounds (bench/secure_perf; the bytes cross real sockets), beside
#      this CPU's cipher limits timed in the same rounds (one thread, the links' EVP code), the
#      process's CPU time per byte of each variant, and the ceiling those give on this machine's
#      cores (both ends of the link share them);
#   2. the connect time added per link (median Connect + Accept of --connects fresh links per
#      variant, one variant per process, the variants alternating process by process; a link
#      costs a few ms with a wide spread, so the auth round needs a few hundred of them);
#   3. SparseAllReduce, 4 ranks, every down-link shaped to --rate in tools/testbed (root):
#      plain against a job secret with the default LBCC_ENCRYPT=slow (slow links encrypted),
#      --pairs rounds of one run each, the order alternating (plain first in even rounds,
#      secret first in odd ones, so neither always runs after the other), both at the same log
#      level (WARN); reported as each variant's median and spread (quartiles, fastest) over all
#      its timings, and the median of the rounds' ratios with their quartiles; then one untimed
#      secure run at TRACE, whose log shows every link authenticated, and every log is searched
#      for the secret. Skipped with the reason without root / network namespaces.
#
#   bench/secure_bench.sh [--pairs 20] [--rounds 30] [--rate 100mbit] [--bytes 16M] [--iters 40] [--connects 400]
#
# Refuses to write (exit 3, the reason printed, --results left as it was) when the plain link or
# a cipher limit, what the ratios divide by, is off its expected range (bench/baselines.py).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/flags.sh
flags_value pairs 20 "alternating testbed runs of each variant"
flags_value rounds 30 "alternating point-to-point rounds of each variant"
flags_value rate 100mbit "testbed down-link rate (tc syntax)"
flags_value bytes 16M "SparseAllReduce tensor size"
flags_value iters 40 "timed SparseAllReduce iterations per run (fewer: the ratio drifts by a few per cent)"
flags_value connects 400 "fresh links per point-to-point variant for the connect time"
flags_value out /tmp/lbcc_secure_bench "folder for the per-run JSON and logs"
flags_value results bench/results/secure.md "where the summary is written"
flags_parse "$@"
pairs=$FLAG_pairs rounds=$FLAG_rounds rate=$FLAG_rate bytes=$FLAG_bytes iters=$FLAG_iters out=$FLAG_out
results=$FLAG_results
command="bench/secure_bench.sh $*"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date +%s)

bazel build -c opt --jobs=2 //bench:secure_perf //bench:lbcc_perf >/dev/null 2>&1 ||
  bazel build -c opt --jobs=2 //bench:secure_perf //bench:lbcc_perf
secure_perf=$PWD/bazel-bin/bench/secure_perf
perf=$PWD/bazel-bin/bench/lbcc_perf
rm -rf "$out"
mkdir -p "$out"

echo "== UCX tcp on lo, 4 MiB point-to-point"
UCX_MEM_EVENTS=no "$secure_perf" --bytes 4M --count 16 --window 8 --connects 1 \
  --rounds "$rounds" > "$out/p2p.jsonl"
# Connect times: one variant per process (in one process the variants' transports' threads
# share the cores and charge each other's connects), 8 processes per variant, the variants
# alternating process by process with the first one rotating.
echo "== connect: $FLAG_connects fresh links per variant"
modes=(plain integrity encrypted)
per_process=$(( (FLAG_connects + 7) / 8 + 1 ))  # + 1: each process's first link is left out
for ((i = 0; i < 8; i++)); do
  for ((j = 0; j < 3; j++)); do
    UCX_MEM_EVENTS=no "$secure_perf" --modes "${modes[(i + j) % 3]}" --bytes 64K --count 2 \
      --window 1 --rounds 1 --cipher_ms 1 --connects "$per_process" | grep -v '"cipher"'
  done
done > "$out/connect.jsonl"

testbed_note=""
T=tools/testbed/testbed
if ! why=$($T check 2>&1); then
  testbed_note="skipped: $why"
  echo "== testbed $testbed_note"
else
  echo "== testbed: 4 ranks, every down-link $rate, SparseAllReduce of $bytes"
  name="sb$$"
  trap '$T down --name "$name" >/dev/null 2>&1 || true' EXIT
  $T down --stale >/dev/null 2>&1 || true
  $T up --name "$name" --hosts 4 --rate "$rate" --slow 0,1,2,3 --owner-pid $$ >/dev/null
  openssl rand -hex 32 > "$out/secret"
  chmod 600 "$out/secret"
  echo '{"nranks": 4}' > "$out/topology.json"
  run() {  # run LABEL LOG_LEVEL [lbcc_perf flags]
    local label=$1 level=$2
    shift 2
    local port=$((29000 + RANDOM % 1000)) pids=() rank
    for rank in 0 1 2 3; do
      $T exec --name "$name" "$rank" -- env UCX_TLS=tcp UCX_NET_DEVICES=eth0 UCX_MEM_EVENTS=no \
        LBCC_LISTEN_ADDR="$($T addr --name "$name" "$rank")" \
        LBCC_BOOTSTRAP_ADDR="$($T addr --name "$name" 0):$port" LBCC_TIMEOUT_S=120 \
        LBCC_DEBUG="$level" RANK=$rank WORLD_SIZE=4 \
        "$perf" --op sparse_allreduce --min_bytes "$bytes" --max_bytes "$bytes" --iters "$iters" \
        --warmup 1 --quiet --topology "$out/topology.json" --json "$out/$label.json" "$@" \
        > "$out/$label.rank$rank.log" 2>&1 &
      pids+=($!)
    done
    local rc=0 pid
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    if ((rc)); then
      echo "secure_bench: $label failed; logs in $out/$label.rank*.log" >&2
      tail -5 "$out/$label".rank*.log >&2
      exit 1
    fi
    echo "  $label done"
  }
  for ((p = 0; p < pairs; ++p)); do
    if ((p % 2 == 0)); then
      run "sparse_plain_$p" WARN
      run "sparse_secure_$p" WARN --job_secret_file "$out/secret"
    else
      run "sparse_secure_$p" WARN --job_secret_file "$out/secret"
      run "sparse_plain_$p" WARN
    fi
  done
  run "sparse_secure_trace" TRACE --job_secret_file "$out/secret"
  $T down --name "$name" >/dev/null
  if grep -qi "$(cat "$out/secret")" "$out"/*.log; then
    echo "secure_bench: the secret appears in a log" >&2
    exit 1
  fi
fi

aes=$(grep -qw aes /proc/cpuinfo && echo yes || echo no)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
python3 - "$out" "$pairs" "$results" "$command" "$aes" "$cpu" "$rate" "$bytes" "$testbed_note" \
  "$load_start" "$iters" "$(($(date +%s) - started))" <<'PY'
import datetime, glob, json, os, platform, statistics, sys
out, pairs, results, command, aes, cpu, rate, size, note, load_start, iters, took = sys.argv[1:]
pairs = int(pairs)
p2p = {r["mode"]: r for r in map(json.loads, open(f"{out}/p2p.jsonl"))}
cipher = p2p.pop("cipher")
med = lambda xs: statistics.median(xs)
bw = {m: r["bytes_per_second_median"] for m, r in p2p.items()}
best = {m: r["bytes_per_second_max"] for m, r in p2p.items()}
connects = {}
for r in map(json.loads, open(f"{out}/connect.jsonl")):
    connects.setdefault(r["mode"], []).extend(r["connect_us"][1:])
conn = {m: med(us) for m, us in connects.items()}
# The fastest tenth: a link's set-up spreads over a few ms (thread wake-ups, UCX's wire-up), so
# the median moves by more than the AUTH step costs; the low decile shows the step itself.
conn_p10 = {m: statistics.quantiles(us, n=10)[0] for m, us in connects.items()}
# The baselines every ratio below divides by: the plain link and the cipher limits.
sys.path.insert(0, "bench")
import baselines
check = baselines.Checker(results)
check("lbcc_plain_loopback", bw["plain"] / 1e6, where="plain link, median of the rounds")
for key in ("gcm_seal", "gcm_open", "mac_seal", "mac_open"):
    check("cipher_one_thread", cipher[f"{key}_bytes_per_second_median"] / 1e6, where=key)
check.refuse_if_off()
rounds = p2p["plain"]["rounds"]
lines = [
    "# Security cost (issue 24)", "",
    f"Written by `{command}` on {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC.",
    f"Machine: {platform.node()}, {os.cpu_count()} cores ({cpu}), AES-NI: {aes}; "
    "shared with other builds, so single runs vary.",
    f"Load average (1, 5, 15 min) at the start: {load_start}; at the end: "
    f"{' '.join(open('/proc/loadavg').read().split()[:3])}. The run took {took} s.", "",
    f"## UCX tcp on lo, 4 MiB point-to-point ({rounds} alternating rounds of 16 messages, 8 in "
    f"flight; connect: median of {len(connects['plain'])} fresh links each, one variant per "
    "process, 8 processes each alternating, each process's first link left out)", "",
    "| link | median (MB/s) | ratio | best (MB/s) | ratio | CPU per byte (ns, all threads) | connect per link, median (us) | added (us) | connect, 10th percentile (us) | added (us) |",
    "|---|---|---|---|---|---|---|---|---|---|"]
per_byte = {m: r["cpu_ns_per_byte_median"] for m, r in p2p.items()}
for m, label in [("plain", "plain"), ("integrity", "authenticated (LBCC_ENCRYPT=none)"),
                 ("encrypted", "authenticated + encrypted (LBCC_ENCRYPT=all)")]:
    lines.append(f"| {label} | {bw[m]/1e6:.0f} | {bw[m]/bw['plain']:.2f} | {best[m]/1e6:.0f} | "
                 f"{best[m]/best['plain']:.2f} | {per_byte[m]:.2f} | {conn[m]:.0f} | "
                 f"{conn[m]-conn['plain']:+.0f} | {conn_p10[m]:.0f} | "
                 f"{conn_p10[m]-conn_p10['plain']:+.0f} |")
lines += ["", "This CPU's cipher limits in the same rounds (one thread, SecureChannel's EVP code, "
          "1 MiB chunks; median of the rounds):", "",
          "| primitive | seal (MB/s) | open (MB/s) |", "|---|---|---|",
          f"| AES-256-GCM (LBCC_ENCRYPT=all) | {cipher['gcm_seal_bytes_per_second_median']/1e6:.0f} | "
          f"{cipher['gcm_open_bytes_per_second_median']/1e6:.0f} |",
          f"| ChaCha20-Poly1305, payload as associated data, with the copy (LBCC_ENCRYPT=none) | "
          f"{cipher['mac_seal_bytes_per_second_median']/1e6:.0f} | "
          f"{cipher['mac_open_bytes_per_second_median']/1e6:.0f} |", "",
          f"Encrypted p2p median against one thread's seal rate: "
          f"{bw['encrypted']/cipher['gcm_seal_bytes_per_second_median']:.2f} "
          f"(the link seals and opens every byte once each, on the crypto pool's threads).", ""]
# Where the time goes: each variant's CPU per byte by thread, and the run-queue wait of each
# (runnable threads that found no free core), beside the machine's idle cores.
names = sorted({n for r in p2p.values() for n in r["threads_ns_per_byte"]
                if max(p2p[m]["threads_ns_per_byte"].get(n, [0, 0])[0] for m in p2p) >= 0.005})
lines += ["Where the time goes (all rounds of each variant; ns per byte moved, CPU / run-queue "
          "wait of the threads of each name; idle: the machine's cores idle during the rounds, "
          "median of the rounds; chunks per message over the link's life; page faults: the "
          "process's minor faults, fresh buffers being touched):", "",
          "| link | " + " | ".join(names) + " | idle | chunks per message | page faults per MiB |",
          "|---|" + "---|" * (len(names) + 3)]
for m in ["plain", "integrity", "encrypted"]:
    t = p2p[m]["threads_ns_per_byte"]
    lines.append(f"| {m} | " + " | ".join(
        f"{t.get(n, [0, 0])[0]:.2f} / {t.get(n, [0, 0])[1]:.2f}" for n in names) +
        f" | {p2p[m]['idle_fraction_median']:.2f} | {p2p[m]['chunks_per_message']:.1f} | "
        f"{p2p[m]['minor_faults_per_mib']:.1f} |")
lines += ["", "lbcc-crypto: the crypto pool (seals and opens); lbcc-ucx-prog: both transports' "
          "progress threads (the sockets' copies, UCX's protocol); lbcc-ucx-cb: completion "
          "callbacks; main: the sending thread (on plain links it progresses UCX itself). A fast "
          "authenticated link seals a message in chunks of 1 MiB while little is queued, growing "
          "to 4 MiB while more is (each chunk costs both ends a rendezvous and thread wake-ups), "
          "and seals at most 8 MiB ahead of the wire.",
          ""]
# Both ends share this machine's cores: a link can at most move cores / (CPU per byte) bytes a
# second; the cipher adds one seal and one open per byte to what the plain link spends (its
# floor). Cores used = throughput x CPU per byte: on a loaded machine each variant gets a share
# of the cores, not all of them, so the ceiling is also stated as the cores the goal needs.
cores = os.cpu_count()
used = {m: bw[m] * per_byte[m] * 1e-9 for m in bw}
lines.append(f"Cores used (throughput x CPU per byte): plain {used['plain']:.2f}, integrity "
             f"{used['integrity']:.2f}, encrypted {used['encrypted']:.2f} of {cores}.")
lines.append("")
for m, use in [("encrypted", "gcm"), ("integrity", "mac")]:
    cipher_ns = cipher[f"{use}_seal_cpu_ns_per_byte_median"] + \
        cipher[f"{use}_open_cpu_ns_per_byte_median"]
    floor = per_byte["plain"] + cipher_ns
    ceiling = cores / (floor * 1e-9)
    share = per_byte["plain"] / floor
    need = 0.8 * bw["plain"] * floor * 1e-9
    lines.append(
        f"Ceiling of {m} on these {cores} cores (both ends of the link in this one process, every "
        f"core busy): {cores} / (plain's {per_byte['plain']:.2f} ns of CPU per byte + "
        f"{cipher_ns:.2f} ns of one thread's CPU for one seal and one open) = "
        f"{ceiling/1e6:.0f} MB/s, {ceiling/bw['plain']:.2f} x plain's median; with only the "
        f"{used['plain']:.2f} cores the plain link used: {per_byte['plain']:.2f} / "
        f"{floor:.2f} = {share:.2f} x plain. Measured {bw[m]/1e6:.0f} MB/s "
        f"({bw[m]/bw['plain']:.2f} x plain) at {per_byte[m]:.2f} ns per byte, "
        f"{per_byte[m] - floor:+.2f} ns per byte beyond plain's and the cipher's.")
    lines.append("")
    verdict = (f"0.8 x plain for {m} needs {need:.2f} cores at that floor "
               f"(0.8 x {bw['plain']/1e6:.0f} MB/s x {floor:.2f} ns per byte): ")
    if need > cores:
        verdict += f"more than this machine's {cores}, so it is out of reach here."
    elif need > used[m]:
        verdict += (f"within this machine's {cores}, but more than the {used[m]:.2f} this run's "
                    "load left the link.")
    else:
        verdict += f"within what the link used ({used[m]:.2f})."
    lines += [verdict, ""]
lines += ["",
          "Connect time added per link: the connect times above (Connect + Accept of a fresh "
          "link) carry the AUTH message's extra one-way trip and the handshake's "
          "cryptography, whose own cost for both ends (nonces, four HMAC-SHA-256 proofs, two "
          f"HKDF derivations; median of 200) is {cipher['handshake_crypto_us_median']:.0f} us. "
          "Plain links' own connect times spread from "
          f"{conn_p10['plain']:.0f} us (10th percentile) to "
          f"{statistics.quantiles(connects['plain'], n=10)[-1]:.0f} us (90th), so the medians' "
          "difference is mostly that spread; the 10th percentiles' is the step's own cost."]
lines.append("")
lines.append(f"## SparseAllReduce, 4 ranks, every down-link {rate}, tensor {size}")
lines.append("")
if note:
    lines.append(f"Not measured: {note}.")
else:
    rows = []
    for p in range(pairs):
        a = json.load(open(f"{out}/sparse_plain_{p}.json"))[0]
        b = json.load(open(f"{out}/sparse_secure_{p}.json"))[0]
        rows.append((a["seconds"], b["seconds"], a["in_place"]["seconds"],
                     b["in_place"]["seconds"]))
    def quartiles(xs):
        q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
        return q[0], q[2]
    lines += ["Each run times the operation twice (out of place, then in place; lbcc_perf's "
              f"mean over {iters} iterations each). Rounds alternate the order: plain first in "
              "even rounds, secret first in odd ones.", "",
              "| round | first | plain (s) | secret, slow links encrypted (s) | ratio | plain in place (s) "
              "| secret in place (s) | ratio |", "|---|---|---|---|---|---|---|---|"]
    for i, (a, b, ai, bi) in enumerate(rows):
        first = "plain" if i % 2 == 0 else "secret"
        lines.append(f"| {i} | {first} | {a:.4f} | {b:.4f} | {b/a:.3f} | {ai:.4f} | {bi:.4f} | "
                     f"{bi/ai:.3f} |")
    pa = [x for r in rows for x in (r[0], r[2])]
    pb = [x for r in rows for x in (r[1], r[3])]
    ratios = [x for r in rows for x in (r[1] / r[0], r[3] / r[2])]
    lines += ["", f"All {len(pa)} timings of each variant pooled:", "",
              "| variant | median (s) | quartiles (s) | fastest (s) |", "|---|---|---|---|"]
    for label, xs in [("plain", pa), ("secret, slow links encrypted", pb)]:
        lo, hi = quartiles(xs)
        lines.append(f"| {label} | {med(xs):.4f} | {lo:.4f} - {hi:.4f} | {min(xs):.4f} |")
    rlo, rhi = quartiles(ratios)
    lines += ["", f"Ratio secret / plain: of the pooled medians {med(pb)/med(pa):.3f}; median of "
              f"the {len(ratios)} same-round ratios {med(ratios):.3f} (quartiles {rlo:.3f} - "
              f"{rhi:.3f}); of the fastest {min(pb)/min(pa):.3f}."]
    authenticated = sum(open(f).read().count(" authenticated, ")
                        for f in glob.glob(f"{out}/sparse_secure_trace.rank*.log"))
    lines += ["", "Both variants logged at WARN. An untimed secure run at LBCC_DEBUG=TRACE "
              f"logged {authenticated} link ends as authenticated. The secret was searched for "
              "in every rank's log of every run: absent."]
text = "\n".join(lines) + "\n"
open(results, "w").write(text)
print(text)
PY
