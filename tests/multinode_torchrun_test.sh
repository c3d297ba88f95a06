#!/usr/bin/env bash
# Real torchrun on each of 3 emulated nodes (tools/testbed namespaces node0..node2 with their own
# host names; node 2's down-link shaped to 100 Mbit/s):
#   torchrun --nnodes 3 --node_rank i --nproc_per_node 1 --master_addr node0 ...
# running a SparseLoCo job (tests/multinode_sparseloco.py): lbcc.init() takes the unique id
# from torchrun's own store, MASTER_ADDR is a host name, ranks listen on eth0. The replicas'
# parameters must be bit-identical at the end. Prints init time and bytes per rank.
# Uses torchrun's --redirects 2 --tee 1 --log_dir (its default redirect crashes with Python 3.11
# and torch 1.13: README, "Launching"). Skips without root / network namespaces / torch.
# NAT=I (multinode_torchrun_nat_test): node I behind NAT (testbed --nat: a masquerading router,
# no dial-in) and every rank on LBCC_TRANSPORT=socket: it finds itself behind NAT at lbcc.init()
# and dials every link (docs/nat.md).
#   multinode_torchrun_test.sh SCRIPT   (NODES: 3 by default; PYTHONPATH: the lbcc package)
set -euo pipefail
script=$(realpath "$1")
nodes=${NODES:-3}
source "$(dirname "$0")/multinode_lib.sh"
mn_skip_unless_testbed
nat=${NAT:-}
nat_args=() transport=ucx
if [[ -n $nat ]]; then
  why=$("$TESTBED" check --nat) || { echo "SKIP: $why"; exit 0; }
  nat_args=(--nat "$nat")
  transport=socket
fi
python=${LBCC_PYTHON:-/usr/bin/python3}
torchrun=$(command -v torchrun || true)
[[ -n "$torchrun" ]] || { echo "SKIP: torchrun not installed (python3-torch)"; exit 0; }
"$python" -c "import torch.distributed" 2>/dev/null || { echo "SKIP: torch not importable"; exit 0; }
if [[ -n "${TEST_SRCDIR:-}" ]]; then  # Under bazel test: the package from the runfiles.
  export PYTHONPATH="$TEST_SRCDIR/${TEST_WORKSPACE:-lbcc}/python"
fi
MN_TMP=$(mktemp -d "${TEST_TMPDIR:-/tmp}/mn.XXXXXX")
mn_up "$nodes" --rate 100mbit --slow "$((nodes - 1))" ${nat_args[@]+"${nat_args[@]}"}

out="$MN_TMP/out"
mkdir -p "$out"
pids=()
for ((i = 0; i < nodes; i++)); do
  mkdir -p "$MN_TMP/logs$i"
  mn_exec "$i" env OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 LBCC_DEBUG=INFO \
    LBCC_TRANSPORT="$transport" \
    "$python" "$torchrun" --nnodes "$nodes" --node_rank "$i" --nproc_per_node 1 \
    --master_addr node0 --master_port 29500 --redirects 2 --tee 1 --log_dir "$MN_TMP/logs$i" \
    "$script" "$out" >"$MN_TMP/node$i.out" 2>&1 &
  pids+=($!)
done
failed=0
for ((i = 0; i < nodes; i++)); do
  if ! wait "${pids[$i]}"; then
    echo "== node$i failed:"
    tail -40 "$MN_TMP/node$i.out"
    failed=1
  fi
done
((failed == 0)) || exit 1
# Each rank's interface choice (its stderr is in torchrun's --log_dir).
grep -rh "NET/Socket: using" "$MN_TMP"/logs* | sed 's/^.*NET/NET/' | sort | uniq -c || {
  echo "no NET/Socket line in the ranks' logs"
  exit 1
}
if [[ -n $nat ]]; then
  grep -rqh "rank [0-9]* listens on .* behind NAT, it dials every link" "$MN_TMP"/logs"$nat" || {
    echo "node$nat did not find itself behind NAT:"
    grep -rh "reach" "$MN_TMP"/logs"$nat" | head -5
    exit 1
  }
fi
"$python" - "$out" "$nodes" <<'PY'
import json, os, sys
out, n = sys.argv[1], int(sys.argv[2])
rows = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(n)]
for r in rows:
    b = r["bytes"]
    print("rank %d on %s: init %.3f s, sent fast %d B slow %d B, digest %s" % (
        r["rank"], r["host"], r["init_s"], b["fast_sent"], b["slow_sent"], r["digest"][:16]))
assert sorted(r["host"] for r in rows) == [f"node{i}" for i in range(n)], rows
assert all(r["master_addr"] == "node0" for r in rows), rows
assert len({r["digest"] for r in rows}) == 1, "replicas differ"
assert all(r["bytes"]["slow_sent"] + r["bytes"]["fast_sent"] > 0 for r in rows)
print("torchrun across %d nodes: replicas bit-identical" % n)
PY
