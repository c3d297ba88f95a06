"""Shared helpers of the lbcc tests: ranks as threads of this process (real concurrency: LBCC
releases the GIL while it waits) and free TCP ports for process launches."""

import random
import socket
import threading

import lbcc
import pytest


def run_ranks(nranks, body, backend="loopback", timeout=60.0, topology=None):
    """Runs body(rank, comm) on `nranks` threads, each with its own communicator; returns the
    results in rank order and re-raises the first rank's exception."""
    uid = lbcc.create_unique_id("127.0.0.1", timeout=timeout)
    results = [None] * nranks
    errors = [None] * nranks

    def main(rank):
        try:
            comm = lbcc.Communicator.init(uid, nranks, rank, backend=backend, timeout=timeout,
                                          topology=topology)
            try:
                results[rank] = body(rank, comm)
            finally:
                comm.close()
        except BaseException as e:  # Re-raised in the test's thread.
            errors[rank] = e

    threads = [threading.Thread(target=main, args=(r,)) for r in range(nranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout * 3)
    assert not any(t.is_alive() for t in threads), "a rank did not finish"
    for e in errors:
        if e is not None:
            raise e
    return results


def free_ports(count):
    """`count` consecutive free TCP ports on 127.0.0.1 (free when checked).

    Drawn below the kernel's ephemeral range: a port the kernel hands out for bind(port 0) or an
    outgoing connection (other tests running at the same time make many) could be taken again
    between this check and the launched ranks' bind ("Address already in use")."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    rng = random.Random()
    for _ in range(100):
        base = rng.randrange(10000, max(10001, low - count))
        sockets = []
        try:
            for p in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no free consecutive ports")


@pytest.fixture
def ranks():
    return run_ranks
