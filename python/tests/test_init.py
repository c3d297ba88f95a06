"""lbcc.init() without a unique id: through a torch store (torchrun's way), and the launchers'
bad input named at once."""

import threading

import pytest
import torch
import torch.distributed as dist

import lbcc

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK",
               "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "SLURM_PROCID", "LBCC_BOOTSTRAP_ADDR",
               "TORCHELASTIC_USE_AGENT_STORE")


@pytest.fixture
def clean_env(monkeypatch):
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_init_through_a_store_publishes_rank_0s_unique_id(clean_env):
    store = dist.HashStore()
    results, errors = [None] * 3, [None] * 3

    def rank_main(rank):
        try:
            for _ in range(2):  # Two communicators in a row: each call its own key.
                comm = lbcc.init(store=store, nranks=3, rank=rank, backend="loopback",
                                 listen_host="127.0.0.1", timeout=30)
                t = torch.full((4,), float(rank + 1))
                comm.all_reduce(t, op="sum")
                results[rank] = (comm.rank, comm.nranks, t.tolist())
                comm.close()
        except BaseException as e:  # Re-raised in the test's thread.
            errors[rank] = e

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for e in errors:
        if e is not None:
            raise e
    assert results == [(r, 3, [6.0] * 4) for r in range(3)]


def test_unresolvable_master_addr_is_named(clean_env):
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv("MASTER_ADDR", "no-such-host.invalid")
    clean_env.setenv("MASTER_PORT", "29500")
    with pytest.raises(lbcc.InvalidArgumentError, match="'no-such-host.invalid'"):
        lbcc.init(backend="loopback")


def test_mpirun_launch_without_libmpi_names_the_library(clean_env):
    clean_env.setenv("OMPI_COMM_WORLD_RANK", "1")
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "2")
    clean_env.setenv("LBCC_MPI_LIBRARY", "libmpi-not-installed.so.99")
    with pytest.raises(lbcc.FailedPreconditionError, match="libmpi-not-installed.so.99"):
        lbcc.init(backend="loopback")


def test_bad_slurm_node_list_is_named(clean_env):
    clean_env.setenv("SLURM_PROCID", "0")
    clean_env.setenv("SLURM_NTASKS", "2")
    clean_env.setenv("SLURM_STEP_NODELIST", "node[01-03")
    with pytest.raises(lbcc.InvalidArgumentError, match=r"Slurm node list 'node\[01-03'"):
        lbcc.init(backend="loopback")


def test_interface_list_matching_nothing_is_named(monkeypatch):
    monkeypatch.setenv("LBCC_SOCKET_IFNAME", "=no-such-if0")
    with pytest.raises(lbcc.InvalidArgumentError, match="LBCC_SOCKET_IFNAME='=no-such-if0'"):
        lbcc.create_unique_id(timeout=5)
