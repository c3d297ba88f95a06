#!/usr/bin/env bash
# Elastic membership over a link cut (tools/testbed cut: the host's link vanishes, no reset is
# sent): 4 members, one per emulated host, the master on host 0 (elastic_churn_test's roles). Host 3 is cut while the job
# steps: the survivors go on without it in a newer epoch (the master drops the silent member
# after LBCC_PEER_TIMEOUT_MS), every step bit-identical on the members that committed it, and
# their error feedback equal to a replay of their committed steps; the cut member fails with
# Unavailable naming the master it lost, never a hang. Skips, with the reason, where network
# namespaces cannot be made (not root).
#
# CUT=partial (elastic_partial_cut_test): host 3 is cut off from hosts 1 and 2 only (nftables
# drops what it exchanges with them), not from host 0, where the master runs: every epoch's
# set-up fails between host 3 and the others, and the master drops host 3's member by the
# unreachable-peer rule (named by two members, docs/elastic.md); it is told it was evicted as
# unreachable, and the survivors go on.
#
# CUT=nat (elastic_nat_test): host 3 is behind NAT (testbed --nat: a masquerading router, no
# dial-in) and every member runs the socket backend: the NATed member joins (it dials the master
# and, finding itself behind NAT at each epoch's bootstrap, every link of the epoch), steps with
# the others, and is then killed -9; the survivors go on without it in a newer epoch.
set -euo pipefail
CUT=${CUT:-full}
T=${TESTBED:-tools/testbed/testbed}
BIN=${ELASTIC_BIN:-comm/elastic/elastic_churn_test}
export PATH="$PATH:/usr/sbin:/sbin"
nat_args=() backend=ucx
if [[ $CUT == nat ]]; then nat_args=(--nat 3); backend=socket; fi
if ! why=$("$T" check ${nat_args[@]+"${nat_args[@]}"}); then echo "SKIPPED: $why"; exit 0; fi
BIN=$(realpath "$BIN")
name="h21cut$$"
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  "$T" down --name "$name" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$dir"/*.log; do echo "== $f"; tail -n 15 "$f"; done >&2
  exit 1
}
# await SECONDS COMMAND...: runs COMMAND until it succeeds, at most SECONDS.
await() {
  local until=$((SECONDS + $1))
  shift
  until "$@"; do
    ((SECONDS < until)) || return 1
    sleep 0.2
  done
}
commits() {
  local n
  n=$(grep -c '^COMMIT' "$dir/m$1.log" 2>/dev/null) || n=0
  echo "${n:-0}"
}
peer_ms=3000

"$T" up --name "$name" --hosts 4 ${nat_args[@]+"${nat_args[@]}"} --owner-pid $$ >/dev/null
a0=$("$T" addr --name "$name" 0)
port=$((29400 + RANDOM % 500))
mkfifo "$dir/in_master"
"$T" exec --name "$name" 0 -- env ELASTIC_ROLE=master ELASTIC_LISTEN="$a0:$port" \
  ELASTIC_MIN_MEMBERS=4 LBCC_PEER_TIMEOUT_MS=$peer_ms "$BIN" <"$dir/in_master" \
  >"$dir/master.log" 2>&1 &
pids+=($!)
exec {master_fd}<>"$dir/in_master"  # the master runs until this closes
for r in 0 1 2 3; do
  mkfifo "$dir/in$r"
  "$T" exec --name "$name" "$r" -- env ELASTIC_ROLE=member ELASTIC_MASTER="$a0:$port" \
    ELASTIC_SEED="$r" ELASTIC_NAME="c$r" LBCC_PEER_TIMEOUT_MS=$peer_ms UCX_TLS=tcp \
    ELASTIC_BACKEND=$backend LBCC_DEBUG=INFO \
    UCX_NET_DEVICES=eth0 UCX_MEM_EVENTS=no LBCC_LISTEN_ADDR="$("$T" addr --name "$name" "$r")" \
    "$BIN" <"$dir/in$r" >"$dir/m$r.log" 2>"$dir/m$r.err" &
  pids+=($!)
  eval "exec {in_fd_$r}<>\"\$dir/in$r\""  # the member runs until this closes
done
all_committed() { for r in 0 1 2 3; do (($(commits "$r") >= 2)) || return 1; done; }
await 120 all_committed || fail "the job never started"

# The cut, while the members step.
before=$(awk '/^COMMIT/ {e = $3} END {print e}' "$dir/m0.log")
if [[ $CUT == partial ]]; then
  a1=$("$T" addr --name "$name" 1)
  a2=$("$T" addr --name "$name" 2)
  ip netns exec "lbcc-$name-h3" nft "add table inet partial_cut; \
    add chain inet partial_cut in { type filter hook input priority 0; }; \
    add chain inet partial_cut out { type filter hook output priority 0; }; \
    add rule inet partial_cut in ip saddr { $a1, $a2 } drop; \
    add rule inet partial_cut out ip daddr { $a1, $a2 } drop"
elif [[ $CUT == nat ]]; then
  grep -q "rank [0-9]* listens on .* behind NAT, it dials every link" "$dir/m3.err" ||
    fail "the NATed member did not find itself behind NAT: $(grep -i reach "$dir/m3.err" | head -3)"
  kill -9 "${pids[4]}"
else
  "$T" cut --name "$name" 3
fi
t0=$SECONDS
newer() { awk -v e="$before" '/^COMMIT/ && $3 > e {n++} END {exit !(n >= 3)}' "$dir/m$1.log"; }
for r in 0 1 2; do await 120 newer "$r" || fail "member $r committed no steps after the cut"; done
echo "survivors committed 3 steps in a newer epoch $((SECONDS - t0)) s after the cut"
cut_exited() { ! kill -0 "${pids[4]}" 2>/dev/null; }
await $((peer_ms / 1000 + 60)) cut_exited || fail "the cut member hangs"
rc=0
wait "${pids[4]}" || rc=$?
((rc != 0)) || fail "the cut member exited 0"
if [[ $CUT == nat ]]; then
  :  # Killed: it says nothing more.
elif [[ $CUT == partial ]]; then
  # It still hears the master, which evicted it as unreachable from its peers.
  grep -q "^ERROR 9 .*evicted by the membership service: unreachable from" "$dir/m3.log" ||
    fail "the cut member was not evicted as unreachable: $(grep ERROR "$dir/m3.log")"
else
  # The cut member cannot hear the master: it fails by itself, naming it.
  grep -q "^ERROR 14 .*lbcc-master.* at $a0:$port" "$dir/m3.log" ||
    fail "the cut member's error does not name the master: $(grep ERROR "$dir/m3.log")"
fi

# The survivors stop; every step is one aggregate and one parameter vector everywhere.
for r in 0 1 2; do eval "exec {in_fd_$r}>&-"; done
for r in 0 1 2; do
  wait "${pids[$((r + 1))]}" || fail "member $r exited $?"
  grep -q "^EF OK" "$dir/m$r.log" || fail "member $r: error feedback differs from its replay"
done
mismatch=$(cat "$dir"/m[0-3].log | awk '/^COMMIT/ {
  v = $3 " " $4 " " $5
  if ($2 in seen && seen[$2] != v) print "step " $2 ": " seen[$2] " vs " v
  seen[$2] = v
}')
[[ -z $mismatch ]] || fail "steps differ across members: $mismatch"
exec {master_fd}>&-
wait "${pids[0]}" || fail "the master exited $?"
echo "PASS"
