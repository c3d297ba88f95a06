#!/usr/bin/env bash
# lbcc_perf under Open MPI's mpirun (2 ranks on this machine): the launch path trainers use
# with MPI. Checks the JSON report: every size present, all-reduce error at float rounding.
set -euo pipefail
perf=$1
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 0; }
# A free port below the kernel's ephemeral range (one from bind(port 0) could be handed out
# again, to a concurrent test's connection, before the root binds it).
port=$(python3 - <<'PY'
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(100):
    p = random.randrange(10000, low)
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            continue
    print(p)
    break
PY
)
json="$TEST_TMPDIR/allreduce.json"
timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 \
  -x LBCC_BOOTSTRAP_ADDR="127.0.0.1:$port" -x UCX_MEM_EVENTS=no \
  "$perf" --op allreduce --min_bytes 4K --max_bytes 256K --iters 2 --quiet --json "$json"
python3 - "$json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
assert [r["bytes"] for r in rows] == [4096, 16384, 65536, 262144], rows
for r in rows:
    assert r["ranks"] == 2 and r["error"] < 1e-5 and r["seconds"] > 0, r
print("mpirun: %d sizes ok" % len(rows))
PY
