#!/usr/bin/env bash
# Connect timeouts hold against a firewall that drops packets (the common case on the internet,
# where nothing answers a SYN and the kernel would retry for two minutes). Two emulated hosts
# (tools/testbed), nftables rules in a host's namespace:
#   1. bootstrap: host 0 drops every packet to the root's port; rank 1 on host 1 joins with
#      timeout T and must fail within T + 1 s, saying it could not reach the root;
#   2. links: host 1 drops every new inbound connection; the root and rank 0 on host 0, rank 1
#      on host 1 (its own connections out pass): both ranks fail within T + 1 s of their start;
#   3. membership: host 0 drops everything to the membership service's port; an elastic member
#      on host 1 with join timeout T fails within T + 1 s, saying it cannot reach the service.
# Skips without root / network namespaces / nft.
#   firewall_drop_test.sh SCRIPT   (firewall_drop_timeout.py; PYTHONPATH: the lbcc package)
set -euo pipefail
script=$(realpath "$1")
source "$(dirname "$0")/multinode_lib.sh"
mn_skip_unless_testbed
nft=$(PATH=$PATH:/usr/sbin:/sbin command -v nft || true)
[[ -n "$nft" ]] || { echo "SKIP: nft (nftables) is not installed: tools/setup"; exit 0; }
python=${LBCC_PYTHON:-/usr/bin/python3}
if [[ -n "${TEST_SRCDIR:-}" ]]; then  # Under bazel test: the package from the runfiles.
  export PYTHONPATH="$TEST_SRCDIR/${TEST_WORKSPACE:-lbcc}/python"
fi
timeout_s=${TIMEOUT_S:-6}
mn_up 2
root_host=$("$TESTBED" addr --name "$MN_NAME" 0)
port=29611

# Fails unless the JSON line in FILE shows a failure within timeout + 1 s whose message has TEXT.
check() {
  "$python" - "$1" "$2" <<'PY'
import json, sys
line = [l for l in open(sys.argv[1]) if l.startswith("{")]
if not line:
    sys.exit(f"no result in {sys.argv[1]}:\n" + open(sys.argv[1]).read())
r = json.loads(line[-1])
print(f"{r['what']} rank {r['rank']}: failed after {r['elapsed']:.2f} s "
      f"(timeout {r['timeout']:g} s): {r['error'][:200]}")
if not r["error"]:
    sys.exit("it did not fail")
if r["elapsed"] > r["timeout"] + 1.0:
    sys.exit(f"{r['elapsed']:.2f} s is more than the timeout + 1 s")
if sys.argv[2] not in r["error"]:
    sys.exit(f"the error does not say '{sys.argv[2]}'")
PY
}

tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/fw.XXXXXX")
echo "== 1. bootstrap: host 0 drops everything to port $port"
mn_exec 0 "$nft" -f - <<NFT
table inet lbcc_fw {
  chain input { type filter hook input priority 0; policy accept; tcp dport $port drop; }
}
NFT
mn_exec 1 env LBCC_LISTEN_ADDR=eth0 "$python" "$script" bootstrap "$root_host:$port" "$timeout_s" \
  >"$tmp/bootstrap.out" 2>&1 || true
check "$tmp/bootstrap.out" "could not reach the root"
mn_exec 0 "$nft" delete table inet lbcc_fw

echo "== 2. links: host 1 drops every new inbound connection"
mn_exec 1 "$nft" -f - <<NFT
table inet lbcc_fw {
  chain input { type filter hook input priority 0; policy accept; ct state new drop; }
}
NFT
mn_exec 0 env LBCC_LISTEN_ADDR=eth0 "$python" "$script" links "$root_host:$port" "$timeout_s" 0 \
  >"$tmp/links0.out" 2>&1 &
pid0=$!
mn_exec 1 env LBCC_LISTEN_ADDR=eth0 "$python" "$script" links "$root_host:$port" "$timeout_s" 1 \
  >"$tmp/links1.out" 2>&1 || true
wait "$pid0" || true
check "$tmp/links0.out" "rank 1"
check "$tmp/links1.out" ""
mn_exec 1 "$nft" delete table inet lbcc_fw

echo "== 3. membership: host 0 drops everything to port $port"
mn_exec 0 "$nft" -f - <<NFT
table inet lbcc_fw {
  chain input { type filter hook input priority 0; policy accept; tcp dport $port drop; }
}
NFT
mn_exec 1 env LBCC_LISTEN_ADDR=eth0 "$python" "$script" member "$root_host:$port" "$timeout_s" \
  >"$tmp/member.out" 2>&1 || true
check "$tmp/member.out" "membership service"
echo "PASS"
