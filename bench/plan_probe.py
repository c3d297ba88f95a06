#!/usr/bin/env python3
"""Link probe for bench/plan_validate.sh: what the links deliver to the op's own pattern.

One process per emulated host (run inside its namespace by `tools/testbed exec`); every host
runs every phase at once with every other host. Three phases:

1. rate (the dense ring): every host sends to host (i + 1) mod N for --rate_seconds, so each
   down-link carries one flow, as a ring step does. With --chunk, as the transport's slow link
   sends: chunks of --chunk bytes, the receiver crediting each whole chunk (8 bytes back on the
   same connection, so through the sender's own down-link behind its left neighbour's data),
   at most --inflight bytes uncredited; with --segment, as comm's pipelined ring forwards: a
   host starts a segment only while it has started fewer than --slack (its own piece) plus the
   segments it has received, so a slow link holds the whole ring back. Without --chunk a plain
   stream with a --inflight socket buffer. The receiver counts the bytes that arrive in the
   middle of the run (the first and last --edge seconds left out): recv_bytes_per_second;
2. credit: stop and wait with --window bytes: send a window, wait for the receiver's 8-byte
   credit (sent once it has read the whole window; it returns through the sender's own
   down-link, behind the left neighbour's window), repeat for --seconds: credit_cycle_s, the
   median time per window;
3. burst (SparseAllReduce's direct exchange; with --burst_bytes): every host sends
   --burst_bytes to every other host at once, --burst_rounds rounds --burst_period apart (the
   links idle between, as between calls, so a shaper's bucket refills as it does there); per
   round the down-link's rate = bytes received / (last byte's arrival - the round's start):
   burst_bytes_per_second, the median over the rounds after the first (which opens the
   connections' congestion windows).

Writes {"rank", "recv_bytes_per_second", "credit_cycle_s", "burst_bytes_per_second", ...} to
--out. Traffic stays inside the testbed's namespaces.

  plan_probe.py --rank I --addrs A0,A1,... --port P --start UNIX_TIME --seconds S --window W
                [--rate_seconds R]
                [--chunk C --inflight B [--segment G --slack K]]
                [--burst_bytes X --burst_rounds R --burst_period T] --out FILE
"""
import argparse
import json
import socket
import threading
import time


def read_exactly(conn, buf, n):
    view = memoryview(buf)
    got = 0
    while got < n:
        k = conn.recv_into(view[got:n])
        if k == 0:
            return False
        got += k
    return True


def credit_phase(a, addrs, result):
    """Stop and wait over (rank -> rank + 1), credits back on the same connection."""
    n = len(addrs)
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((addrs[a.rank], a.port + 1))
    server.listen(1)
    # Every host has finished the rate phase by then (its last bytes drain a 1 MB tbf queue).
    start = a.start + a.rate_seconds + 1.0

    def serve():
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray(a.window)
        while read_exactly(conn, buf, a.window):
            conn.sendall(b"credit!!")
        conn.close()

    t = threading.Thread(target=serve)
    t.start()
    deadline = start + 30
    while True:
        try:
            out = socket.create_connection((addrs[(a.rank + 1) % n], a.port + 1), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)  # the right neighbour's listener is not up yet (start-up only)
    out.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while time.time() < start:
        time.sleep(0.001)
    block = bytes(a.window)
    credit = bytearray(8)
    cycles = []
    end = start + a.seconds
    while time.time() < end:
        t0 = time.time()
        out.sendall(block)
        if not read_exactly(out, credit, 8):
            break
        cycles.append(time.time() - t0)
    out.shutdown(socket.SHUT_WR)
    out.close()
    t.join()
    server.close()
    cycles = sorted(cycles[2:]) or [0.0]  # the first windows grow TCP's congestion window
    result["credit_cycle_s"] = cycles[len(cycles) // 2]
    result["credit_windows"] = len(cycles)
    result["window_bytes"] = a.window


def burst_phase(a, addrs, result):
    """Every host sends --burst_bytes to every other host at once, --burst_rounds times
    --burst_period apart (the links idle between, as between a SparseAllReduce's calls): per
    round, this host's down-link rate = what it received / (its last byte's arrival - the
    round's start)."""
    n = len(addrs)
    start = a.start + a.rate_seconds + a.seconds + 2.0  # after the credit phase
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((addrs[a.rank], a.port + 2))
    server.listen(n)
    ends = [[] for _ in range(a.burst_rounds)]
    lock = threading.Lock()

    def serve(conn):
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray(a.burst_bytes)
        for k in range(a.burst_rounds):
            if not read_exactly(conn, buf, a.burst_bytes):
                break
            with lock:
                ends[k].append(time.time())
        conn.close()

    def accept():
        conns = [server.accept()[0] for _ in range(n - 1)]
        ts = [threading.Thread(target=serve, args=(c,)) for c in conns]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    acceptor = threading.Thread(target=accept)
    acceptor.start()
    outs = []
    deadline = start + 30
    for peer in range(n):
        if peer == a.rank:
            continue
        while True:
            try:
                out = socket.create_connection((addrs[peer], a.port + 2), timeout=5)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)  # that host's listener is not up yet (start-up only)
        out.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        outs.append(out)
    block = bytes(a.burst_bytes)

    def send(out):
        for k in range(a.burst_rounds):
            when = start + k * a.burst_period
            while time.time() < when:
                time.sleep(min(0.001, max(0.0, when - time.time())))
            out.sendall(block)
        out.shutdown(socket.SHUT_WR)

    senders = [threading.Thread(target=send, args=(o,)) for o in outs]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    acceptor.join()
    for o in outs:
        o.close()
    server.close()
    got = (n - 1) * a.burst_bytes
    # The first round also opens the connections' congestion windows: left out.
    rates = [got / (max(e) - (start + k * a.burst_period))
             for k, e in enumerate(ends) if k > 0 and len(e) == n - 1]
    result["burst_bytes_per_second"] = sorted(rates)[len(rates) // 2] if rates else 0.0
    result["burst_rates"] = rates
    result["burst_bytes"] = a.burst_bytes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--addrs", required=True, help="comma-separated host addresses, rank order")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--start", type=float, required=True, help="when to start sending (time.time())")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rate_seconds", type=float,
                    help="the rate phase's length (default: --seconds, which the credit phase takes)")
    ap.add_argument("--edge", type=float, help="seconds left out at each end of the rate phase "
                    "(default: a fifth of --seconds, at most 0.75)")
    ap.add_argument("--window", type=int, default=262144, help="credit phase: bytes per window")
    ap.add_argument("--inflight", type=int, default=1 << 20,
                    help="rate phase: most bytes unacknowledged (the transport's window)")
    ap.add_argument("--chunk", type=int, default=0,
                    help="rate phase: credit per CHUNK bytes received, the sender keeping at most "
                    "--inflight bytes uncredited (the transport's window); 0: a socket buffer of "
                    "--inflight instead")
    ap.add_argument("--segment", type=int, default=0,
                    help="rate phase with --chunk: the ring's segment (a multiple of --chunk); a "
                    "host sends a segment only while it has sent fewer than --slack plus the "
                    "segments it has received (0: a free stream)")
    ap.add_argument("--slack", type=int, default=1, help="segments a host holds at the start")
    ap.add_argument("--burst_bytes", type=int, default=0,
                    help="burst phase: bytes each host sends to every other host per round "
                    "(0: no burst phase)")
    ap.add_argument("--burst_rounds", type=int, default=6)
    ap.add_argument("--burst_period", type=float, default=0.25, help="seconds between rounds")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.rate_seconds is None:
        a.rate_seconds = a.seconds
    if a.edge is None:
        a.edge = min(0.75, a.rate_seconds / 5)
    addrs = a.addrs.split(",")
    n = len(addrs)
    right = addrs[(a.rank + 1) % n]
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((addrs[a.rank], a.port))
    server.listen(1)
    result = {}

    def receive():
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        arrivals = []  # (time, bytes)
        buf = bytearray(1 << 20)
        total, credited = 0, 0
        while True:
            got = conn.recv_into(buf)
            if got == 0:
                break
            arrivals.append((time.time(), got))
            total += got
            if a.segment and total // a.segment > relay.received:
                with relay:
                    relay.received = total // a.segment
                    relay.notify()
            if a.chunk:
                # A credit per whole chunk received, as the transport's receiver gives one.
                while total - credited >= a.chunk:
                    credited += a.chunk
                    conn.sendall(b"credit!!")
        conn.close()
        # The steady part: from --edge after the first byte to --edge before the last, and only
        # while every sender was sending (after --start).
        counted, first, last = 0, None, None
        if arrivals:
            lo = max(arrivals[0][0], a.start) + a.edge
            hi = arrivals[-1][0] - a.edge
            for when, got in arrivals:
                if lo <= when <= hi:
                    if first is None:
                        first = when
                    else:
                        counted += got
                    last = when
        span = (last - first) if first is not None and last > first else 0
        result["recv_bytes_per_second"] = counted / span if span > 0 else 0.0
        result["counted_bytes"] = counted
        result["span_s"] = span

    # The ring's dependency (--segment): a host forwards a segment once it has received one, so
    # it may be at most --slack segments (its own piece) ahead of what came from its left.
    relay = threading.Condition()
    relay.received = 0
    t = threading.Thread(target=receive)
    t.start()
    deadline = a.start + 30
    while True:
        try:
            out = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            if not a.chunk:
                # At most --inflight bytes unacknowledged (the kernel doubles the value): an
                # unbounded flow overruns the tbf's queue in slow start.
                out.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, a.inflight // 2)
            out.settimeout(5)
            out.connect((right, a.port))
            out.settimeout(None)
            break
        except OSError:
            out.close()
            if time.time() > deadline:
                raise
            time.sleep(0.05)  # the right neighbour's listener is not up yet (start-up only)
    out.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while time.time() < a.start:
        time.sleep(0.001)
    end = a.start + a.rate_seconds
    if a.chunk:
        # The transport's slow-link credit window: at most --inflight bytes sent and not yet
        # credited, a credit per --chunk bytes (transport/link.cc), the credits returning
        # through this host's own down-link behind its left neighbour's data.
        block = bytes(a.chunk)
        credit = bytearray(8)
        outstanding, sent = 0, 0
        while time.time() < end:
            if a.segment and sent % a.segment == 0:
                with relay:
                    while sent // a.segment >= a.slack + relay.received and time.time() < end:
                        relay.wait(0.05)
                if time.time() >= end:
                    break
            out.sendall(block)
            outstanding += a.chunk
            sent += a.chunk
            while outstanding + a.chunk > a.inflight:
                if not read_exactly(out, credit, 8):
                    raise OSError("probe: the receiver closed")
                outstanding -= a.chunk
        out.shutdown(socket.SHUT_WR)
        while read_exactly(out, credit, 8):
            pass
    else:
        block = bytes(1 << 16)
        while time.time() < end:
            out.sendall(block)
    out.close()
    t.join()
    server.close()
    credit_phase(a, addrs, result)
    if a.burst_bytes > 0:
        burst_phase(a, addrs, result)
    result["rank"] = a.rank
    with open(a.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
