#!/usr/bin/env bash
# Ranks behind NAT (tools/testbed --nat: masquerading routers, no dial-in) join over the socket
# backend with connection reversal (docs/nat.md). bench/lbcc_perf, one rank per emulated host,
# the root on public host 0:
#   1. 4 hosts, host 2 behind NAT, every rank LBCC_REACHABLE=auto (discovery: host 2 logs that
#      it is behind NAT): sparse all-reduce and dense all-reduce checked on every rank (#wrong 0);
#   2. 4 hosts, none behind NAT, host 2 dropping every new inbound connection (nftables in its
#      namespace), auto: the root's dial-back finds host 2 unreachable, it dials every link, and
#      sparse all-reduce is checked on every rank;
#   3. 4 hosts, hosts 2 and 3 behind separate NATs, auto: every rank fails at set-up with
#      FailedPrecondition naming the pair 2-3, within the timeout;
#   4. 2 hosts, host 1 behind NAT over UCX (LBCC_REACHABLE=no): every rank fails at set-up
#      naming the socket backend.
# Skips without root / network namespaces / nftables.
#   nat_test.sh LBCC_PERF
set -euo pipefail
perf=$(realpath "$1")
T=$(realpath "${TESTBED:-tools/testbed/testbed}")
export PATH="$PATH:/usr/sbin:/sbin"
if ! why=$("$T" check --nat); then echo "SKIP: $why"; exit 0; fi
name="na$$"
out=$(mktemp -d)
trap '"$T" down --name "$name" >/dev/null 2>&1 || true; rm -rf "$out"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# run HOSTS "NATED" BACKEND LABEL PERF_ARGS...: one lbcc_perf rank per host; NATED ranks say
# LBCC_REACHABLE=no, the others yes; NATED "auto": every rank says auto. Leaves each rank's log
# in $out/LABEL.rankR.log, returns how many failed.
run() {
  local hosts=$1 nated=$2 backend=$3 label=$4
  shift 4
  local port=$((29700 + RANDOM % 200)) pids=() rank reach
  for ((rank = 0; rank < hosts; rank++)); do
    reach=yes
    [[ " $nated " == *" $rank "* ]] && reach=no
    [[ $nated == auto ]] && reach=auto
    "$T" exec --name "$name" "$rank" -- env LBCC_TRANSPORT="$backend" LBCC_REACHABLE="$reach" \
      LBCC_DEBUG=INFO \
      UCX_TLS=tcp UCX_NET_DEVICES=eth0 UCX_MEM_EVENTS=no \
      LBCC_LISTEN_ADDR="$("$T" addr --name "$name" "$rank")" \
      LBCC_BOOTSTRAP_ADDR="$("$T" addr --name "$name" 0):$port" LBCC_TIMEOUT_S=20 \
      RANK=$rank WORLD_SIZE=$hosts "$perf" --min_bytes 4M --max_bytes 4M --iters 3 --warmup 1 \
      -c 1 "$@" >"$out/$label.rank$rank.log" 2>&1 &
    pids+=($!)
  done
  local failed=0 pid
  for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
  return $failed
}

"$T" up --name "$name" --hosts 4 --rate 100mbit --slow 0,1,2,3 --nat 2 --owner-pid $$ >/dev/null
for op in sparse_allreduce allreduce; do
  run 4 auto socket "one_$op" --op "$op" || { tail -3 "$out"/one_$op.rank*.log >&2; fail "$op with host 2 behind NAT"; }
  grep -q "Out of bounds values : 0 OK" "$out/one_$op.rank0.log" || fail "$op: wrong values: $(tail -3 "$out/one_$op.rank0.log")"
  grep -q "rank 2 listens on .* behind NAT, it dials every link" "$out/one_$op.rank2.log" ||
    fail "$op: rank 2 did not find itself behind NAT: $(grep -i reach "$out/one_$op.rank2.log" | head -3)"
  for rank in 0 1 3; do
    grep -q "rank $rank is reachable (LBCC_REACHABLE=auto" "$out/one_$op.rank$rank.log" ||
      fail "$op: rank $rank did not find itself reachable"
  done
done
"$T" down --name "$name" >/dev/null

# No address translation, but host 2 drops every new inbound connection: only the root's
# dial-back shows it.
"$T" up --name "$name" --hosts 4 --owner-pid $$ >/dev/null
"$T" exec --name "$name" 2 -- nft -f - <<'NFT'
table inet lbcc_fw {
  chain input { type filter hook input priority 0; policy accept; ct state new drop; }
}
NFT
run 4 auto socket firewall --op sparse_allreduce ||
  { tail -3 "$out"/firewall.rank*.log >&2; fail "sparse_allreduce with host 2 behind a firewall"; }
grep -q "Out of bounds values : 0 OK" "$out/firewall.rank0.log" || fail "firewall: wrong values"
grep -q "rank 2 listens on .* but the root could not connect to it" "$out/firewall.rank2.log" ||
  fail "firewall: rank 2 did not find itself unreachable: $(grep -i reach "$out/firewall.rank2.log" | head -3)"
grep -q "rank 1 is reachable (LBCC_REACHABLE=auto.*and connected to it)" "$out/firewall.rank1.log" ||
  fail "firewall: rank 1 was not dialed back: $(grep -i reach "$out/firewall.rank1.log" | head -3)"
"$T" down --name "$name" >/dev/null

"$T" up --name "$name" --hosts 4 --nat 2,3 --owner-pid $$ >/dev/null
start=$SECONDS
run 4 auto socket two --op sparse_allreduce && fail "two NATed hosts that cannot reach each other connected"
((SECONDS - start <= 25)) || fail "the set-up failure took $((SECONDS - start)) s (timeout 20 s)"
for rank in 0 1 2 3; do
  grep -q "FAILED_PRECONDITION: comm: ranks 2-3 cannot reach each other" "$out/two.rank$rank.log" ||
    fail "rank $rank: $(tail -2 "$out/two.rank$rank.log")"
done
"$T" down --name "$name" >/dev/null

"$T" up --name "$name" --hosts 2 --nat 1 --owner-pid $$ >/dev/null
run 2 "1" ucx ucx --op sparse_allreduce && fail "UCX with an unreachable rank connected"
for rank in 0 1; do
  grep -q "FAILED_PRECONDITION.*LBCC_TRANSPORT=socket" "$out/ucx.rank$rank.log" ||
    fail "rank $rank over UCX: $(tail -2 "$out/ucx.rank$rank.log")"
done
echo "PASSED: a NATed rank and a firewalled one join by reversal; unconnectable pairs and UCX fail at set-up, named"
