#!/usr/bin/env bash
# testbed --site: the site's hosts sit on a bridge of their own behind one shaped link (the only
# tbf on their path), slow hosts keep their own shaped links, and every host reaches every other
# over TCP. Structure and reachability only (no timings). Skips, with the reason, where network
# namespaces cannot be made (not root).
set -euo pipefail
T=${TESTBED:-$(dirname "$0")/testbed}
[[ -x "$T" ]] || T=tools/testbed/testbed
export PATH="$PATH:/usr/sbin:/sbin"
if ! why=$("$T" check); then echo "SKIPPED: $why"; exit 0; fi
name="st$$"
trap '"$T" down --name "$name" >/dev/null 2>&1 || true' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Bad layouts are refused with a reason.
out=$("$T" up --name "$name" --hosts 3 --slow 1 --site 1,2 2>&1) && fail "overlapping --slow/--site accepted"
grep -q "both --slow and --site" <<<"$out" || fail "unclear error: $out"
out=$("$T" up --name "$name" --hosts 3 --site 0,5 2>&1) && fail "--site 5 of 3 hosts accepted"
grep -q "not a host index" <<<"$out" || fail "unclear error: $out"

"$T" up --name "$name" --hosts 4 --rate 100mbit --slow 3 --site 0,1 --owner-pid $$ >/dev/null
site=lbcc-$name-site hub=lbcc-$name-hub
# Site hosts hang off the site bridge, the others off the hub; the WAN pair joins the bridges.
members=$(ip -n "$site" -o link show master br0 | awk -F': ' '{print $2}' | cut -d@ -f1 | sort | xargs)
[[ "$members" == "v0 v1 wan_s" ]] || fail "site bridge members: '$members'"
members=$(ip -n "$hub" -o link show master br0 | awk -F': ' '{print $2}' | cut -d@ -f1 | sort | xargs)
[[ "$members" == "v2 v3 wan" ]] || fail "hub bridge members: '$members'"
# Shaping: the WAN down-link and slow host 3's down-link, nothing on fast host 2 or inside the site.
qdiscs=$(ip netns exec "$hub" tc qdisc show | awk '$2 == "tbf" {print $5}' | sort | xargs)
[[ "$qdiscs" == "v3 wan" ]] || fail "hub tbf qdiscs on: '$qdiscs'"
! ip netns exec "$site" tc qdisc show | grep -q tbf || fail "tbf inside the site without --uplink"
grep -q "^0 10.77.0.1 site$" "/run/lbcc-testbed/$name/hosts" || fail "hosts file lacks the site mark"

# Every host reaches every other over TCP (a listener on each, a connect from each).
for dst in 0 1 2 3; do
  addr=$("$T" addr --name "$name" "$dst")
  "$T" exec --name "$name" "$dst" -- /usr/bin/python3 -c '
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 17000)); s.listen(8); s.settimeout(20)
for _ in range(3):
    c, _ = s.accept(); c.sendall(b"ok"); c.close()
' "$addr" &
  listener=$!
  for src in 0 1 2 3; do
    ((src == dst)) && continue
    got=$("$T" exec --name "$name" "$src" -- /usr/bin/python3 -c '
import socket, sys, time
for attempt in range(100):
    try:
        s = socket.create_connection((sys.argv[1], 17000), timeout=5); break
    except ConnectionRefusedError:
        time.sleep(0.05)
print(s.recv(2).decode())
' "$addr")
    [[ "$got" == "ok" ]] || fail "host $src cannot reach host $dst"
  done
  wait "$listener" || fail "listener on host $dst failed"
done

# cut works for a site host too: host 1 vanishes from the site bridge.
"$T" cut --name "$name" 1
! ip -n "$site" link show v1 >/dev/null 2>&1 || fail "cut left v1 in the site"
"$T" down --name "$name"
! ip netns list | grep -q "^lbcc-$name-" || fail "down left namespaces behind"
echo "PASSED: site structure, shaping and reachability"
