#!/usr/bin/env bash
# lbcc_perf under Open MPI's mpirun (2 ranks on this machine): the launch path trainers use
# with MPI. Checks the JSON report: every size present, all-reduce error at float rounding.
set -euo pipefail
perf=$1
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 0; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
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
