#!/usr/bin/env bash
# testbed --nat / --nat-group: a NATed host dials out (its peer sees the router's public address)
# but nobody dials in (neither its private address nor its router's public one), hosts behind
# different routers cannot reach each other, hosts of one group reach each other directly, a slow
# NATed host is shaped on its router's LAN side, cut unplugs it, and down removes the routers.
# Structure and reachability only (no timings). Skips, with the reason, where namespaces or
# nftables' NAT cannot be used here.
set -euo pipefail
T=${TESTBED:-$(dirname "$0")/testbed}
[[ -x "$T" ]] || T=tools/testbed/testbed
export PATH="$PATH:/usr/sbin:/sbin"
if ! why=$("$T" check --nat); then echo "SKIPPED: $why"; exit 0; fi
name="nt$$"
trap '"$T" down --name "$name" >/dev/null 2>&1 || true' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$T" up --name "$name" --hosts 3 --nat 1 --nat-group 1,2 2>&1) && fail "a host behind two NATs accepted"
grep -q "listed twice" <<<"$out" || fail "unclear error: $out"
out=$("$T" up --name "$name" --hosts 3 --nat 1 --ipv6 2>&1) && fail "--nat with --ipv6 accepted"
grep -q "IPv4 only" <<<"$out" || fail "unclear error: $out"
out=$("$T" up --name "$name" --hosts 3 --site 0,1 --nat 1 2>&1) && fail "--site and --nat on one host accepted"
grep -q "both --site and a NAT" <<<"$out" || fail "unclear error: $out"

# Host 0 public; host 1 behind its own router; hosts 2 and 3 behind one router, host 3 slow.
"$T" up --name "$name" --hosts 4 --rate 100mbit --slow 3 --nat 1 --nat-group 2,3 --owner-pid $$ >/dev/null
[[ $("$T" addr --name "$name" 1) == 10.78.0.2 ]] || fail "host 1's address: $("$T" addr --name "$name" 1)"
[[ $("$T" addr --name "$name" 3) == 10.78.1.4 ]] || fail "host 3's address: $("$T" addr --name "$name" 3)"
qdiscs=$(ip netns exec "lbcc-$name-r1" tc qdisc show | awk '$2 == "tbf" {print $5}' | xargs)
[[ "$qdiscs" == "v3" ]] || fail "router 1's tbf qdiscs on: '$qdiscs'"
! ip netns exec "lbcc-$name-hub" tc qdisc show | grep -q tbf || fail "a tbf on the hub"

# listen HOST PORT SECONDS: accepts one connection, answers with the address it came from, or
# prints "nobody" after SECONDS.
listen() {
  "$T" exec --name "$name" "$1" -- /usr/bin/python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(8); s.settimeout(float(sys.argv[2]))
try:
    c, peer = s.accept(); c.sendall(peer[0].encode()); c.close(); print("accepted")
except socket.timeout:
    print("nobody")
' "$2" "$3"
}
# dial HOST ADDRESS PORT: "seen as A" (the listener saw address A) or "failed: why".
dial() {
  "$T" exec --name "$name" "$1" -- /usr/bin/python3 -c '
import socket, sys, time
for attempt in range(60):
    try:
        s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5)
        print("seen as", s.recv(64).decode()); break
    except ConnectionRefusedError:
        time.sleep(0.05)
    except OSError as e:
        print("failed:", type(e).__name__); break
' "$2" "$3"
}
expect_dial() {  # FROM TO_ADDRESS PORT LISTENER_HOST WANT_DIAL WANT_LISTENER
  local result=/tmp/nat_test_$$_listen
  listen "$4" "$3" 4 >"$result" &
  local listener=$!
  local got
  got=$(dial "$1" "$2" "$3")
  wait "$listener" || fail "listener on host $4 failed"
  [[ "$got" == $5 ]] || fail "host $1 -> $2: '$got', want '$5'"
  [[ "$(cat "$result")" == "$6" ]] || fail "host $1 -> $2: listener '$(cat "$result")', want '$6'"
  rm -f "$result"
}
expect_dial 1 10.77.0.1 17101 0 "seen as 10.77.0.201" accepted    # out through router 0
expect_dial 3 10.77.0.1 17102 0 "seen as 10.77.0.202" accepted    # out through router 1
expect_dial 0 10.78.0.2 17103 1 "failed: *" nobody                 # private address: no route
expect_dial 0 10.77.0.201 17104 1 "failed: *" nobody               # router's address: dropped
expect_dial 1 10.78.1.3 17105 2 "failed: *" nobody                 # another NAT's LAN
expect_dial 1 10.77.0.202 17106 2 "failed: *" nobody               # another NAT's router
expect_dial 2 10.78.1.4 17107 3 "seen as 10.78.1.3" accepted       # same LAN: direct

"$T" status --name "$name" | grep -q "NAT router r1: public 10.77.0.202, hosts 2 3" ||
  fail "status lacks the routers: $("$T" status --name "$name")"
"$T" cut --name "$name" 3
! ip -n "lbcc-$name-r1" link show v3 >/dev/null 2>&1 || fail "cut left v3 on its router"
"$T" down --name "$name"
! ip netns list | grep -q "^lbcc-$name-" || fail "down left namespaces behind"
echo "PASSED: NAT structure, dial-out, no dial-in, LAN reachability"
