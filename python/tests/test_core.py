"""The lbcc module: communicator operations on torch tensors (ranks as threads over the
loopback transport), codecs to and from bytes, the subspace codec, counters, and errors as
Python exceptions carrying the status code and message."""

import json
import os
import pickle

import numpy as np
import pytest
import torch

import lbcc
from conftest import run_ranks


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- Communicator operations. ---

def test_dense_collectives_in_place_and_async():
    def body(rank, comm):
        t = torch.full((1000,), float(rank + 1))
        ptr = t.data_ptr()
        comm.all_reduce(t)  # in place, zero-copy
        assert t.data_ptr() == ptr
        m = torch.full((7,), float(rank + 1), dtype=torch.bfloat16)
        request = comm.all_reduce(m, op="mean", async_op=True)
        assert isinstance(request, lbcc.Request)
        assert request.wait() is None and request.test()
        gathered = torch.empty(3 * 2)
        comm.all_gather(torch.tensor([rank, 10.0 * rank]), gathered)
        b = np.arange(5, dtype=np.int64) * (rank + 1)  # numpy arrays work too
        comm.broadcast(b, root=2)
        comm.barrier()
        blobs = comm.all_gather_bytes(bytes([rank]) * (rank + 1))
        return t[0].item(), m[0].item(), gathered.tolist(), b.tolist(), blobs

    for t0, m0, gathered, b, blobs in run_ranks(3, body):
        assert t0 == 6.0 and m0 == 2.0
        assert gathered == [0, 0, 1, 10, 2, 20]
        assert b == [0, 3, 6, 9, 12]
        assert blobs == [b"\x00", b"\x01\x01", b"\x02\x02\x02"]


def test_sparse_all_reduce_equals_decode_of_every_payload():
    """Every rank gets the same bits, equal to lbcc.decode of all ranks' payloads in rank
    order (computed here from the same inputs with separate states)."""
    shapes = [(128, 96), (300,)]
    deltas = [[randn(*s, seed=10 * r + i) for i, s in enumerate(shapes)] for r in range(4)]
    codec = lbcc.TopKEfCodec(top_k=64, beta=0.9, lr=0.5)
    rounds = 2

    def body(rank, comm):
        states = [codec.new_state() for _ in shapes]
        outs = []
        for _ in range(rounds):
            out = [torch.empty(s) for s in shapes]
            comm.sparse_all_reduce(deltas[rank], out, codec, states)
            outs.append(out)
        return outs, [torch.from_numpy(s.error) for s in states]

    results = run_ranks(4, body)
    states = [[codec.new_state() for _ in shapes] for _ in range(4)]
    for step in range(rounds):
        for i, s in enumerate(shapes):
            payloads = [codec.encode(deltas[r][i], states[r][i]) for r in range(4)]
            expected = torch.empty(s)
            lbcc.decode(payloads, expected, aggregation="sparseloco")
            for r in range(4):
                assert torch.equal(results[r][0][step][i], expected)
    for r in range(4):
        for i in range(len(shapes)):
            assert np.array_equal(results[r][1][i].numpy(), states[r][i].error)


def test_compressed_send_recv_and_link_counters():
    x = randn(64, 64, seed=3)
    codec = lbcc.DenseQuantCodec("int8", block=64)

    def body(rank, comm):
        if rank == 0:
            before = comm.link_counters(1)
            comm.send_compressed(x, 1, tag=7, codec=codec)
            after = comm.link_counters(1)
            return after["bytes_sent"] - before["bytes_sent"], after["link_class"]
        out = torch.zeros(64, 64)
        request = comm.recv_compressed(out, 0, tag=7, async_op=True)
        request.wait(timeout=30)
        return out, comm.bytes_by_class()

    (sent, link), (out, by_class) = run_ranks(2, body)
    assert sent == len(codec.encode(x))  # the int8 payload, not 4 bytes per element
    assert sent < x.numel() * 4 / 3
    assert link in ("fast", "slow")
    assert (out - x).abs().max() <= x.abs().max() / 127
    assert by_class["fast_received"] + by_class["slow_received"] >= sent


def test_split_topology_file_and_shard_communicators(tmp_path):
    """Two pipeline replicas of two stages: shard s = stage s of both; links between the
    islands are slow."""
    spec = {"nranks": 4, "islands": [[0, 1], [2, 3]],
            "replicas": [{"kind": "pipeline", "stages": [0, 1]},
                         {"kind": "pipeline", "stages": [2, 3]}]}
    path = tmp_path / "topology.json"
    path.write_text(json.dumps(spec))
    topology = lbcc.Topology.from_file(str(path))
    assert topology.num_shards == 2 and topology.shard_ranks(1) == [1, 3]
    assert topology.link(0, 1) == "fast" and topology.link(0, 2) == "slow"
    assert pickle.loads(pickle.dumps(topology)).to_json() == topology.to_json()

    def body(rank, comm):
        shards = lbcc.shard_communicators(comm)
        (shard, sub), = shards.items()
        t = torch.tensor([float(rank)])
        sub.all_reduce(t)
        odd = comm.split(rank % 2, key=-rank)  # key orders the new ranks
        return shard, sub.global_ranks, t.item(), odd.global_ranks, comm.link_counters(
            (rank + 2) % 4)["link_class"], comm.topology.role(rank)

    results = run_ranks(4, body, topology=str(path))
    assert [r[0] for r in results] == [0, 1, 0, 1]
    assert results[0][1] == [0, 2] and results[1][1] == [1, 3]
    assert [r[2] for r in results] == [2.0, 4.0, 2.0, 4.0]
    assert results[0][3] == [2, 0] and results[1][3] == [3, 1]
    assert all(r[4] == "slow" for r in results)
    assert results[3][5] == {"kind": "pipeline", "replica": 1, "stage": 1}


# --- Codecs and the subspace codec. ---

def test_topk_encode_decode_inspect_and_two_phase_state():
    codec = lbcc.TopKEfCodec(top_k=128, beta=0.5)
    x = randn(256, 128)
    state = codec.new_state()
    assert isinstance(state, lbcc.TopKEfState) and not state.initialized
    payload = codec.encode(x, state, commit=False)
    assert state.has_pending and state.pending_error is not None
    state.abort()
    assert not state.has_pending
    payload2 = codec.encode(x, state)  # commits
    assert payload2 == payload and not state.has_pending
    info = lbcc.inspect(payload)
    assert info["codec"] == "topk_ef" and info["shape"] == (256, 128)
    assert info["k_per_chunk"] == 128 and info["bits_per_param"] < 1
    out = torch.zeros(256, 128)
    lbcc.decode(payload, out)
    # e + decoded == x (lr 1, e was 0): error feedback keeps what was not sent.
    torch.testing.assert_close(out + torch.from_numpy(state.error), x, atol=1e-6, rtol=0)
    restored = lbcc.TopKEfState()
    restored.load(torch.from_numpy(state.error))
    assert codec.encode(x, restored) == codec.encode(x, state)


def test_dense_codecs_round_trip():
    x = randn(1000)
    for fmt, tol in (("int8", 1 / 127), ("int4", 1 / 7), ("bf16", 2 ** -8), ("fp16", 2 ** -10)):
        codec = lbcc.DenseQuantCodec(fmt, block=64)
        assert codec.new_state() is None
        out = torch.empty(1000)
        lbcc.decode(codec.encode(x), out)
        assert (out - x).abs().max() <= tol * x.abs().max(), fmt


def test_subspace_codec_round_trip_and_embedding_shift():
    basis = lbcc.SubspaceBasis.from_seed(64, 8, vocab_size=100, with_table=True, seed=9)
    assert basis.orthonormality_error() < 1e-6
    again = lbcc.SubspaceBasis.from_seed(64, 8, vocab_size=100, with_table=True, seed=9)
    assert again == basis and again.hash == basis.hash  # the same bits, regenerated
    assert lbcc.SubspaceBasis.parse(basis.serialize()) == basis
    assert pickle.loads(pickle.dumps(basis)) == basis
    u, table = torch.from_numpy(basis.u), torch.from_numpy(basis.table)
    ids = torch.randint(0, 100, (50,), dtype=torch.int32)
    h = table[ids.long()] + randn(50, 8) @ u.t()  # h - T[y] in span(U)
    codec = lbcc.SubspaceCodec(basis, coefficient_dtype="f32")
    payload, selectors = codec.encode_forward(h, ids)
    assert selectors is None and len(payload) == codec.forward_payload_bytes(50)
    assert lbcc.inspect_subspace(payload)["basis_hash"] == basis.hash
    h_out, ids_out = torch.empty(50, 64), torch.empty(50, dtype=torch.int32)
    codec.decode_forward(payload, h_out, ids_out)
    torch.testing.assert_close(h_out, h, atol=1e-5, rtol=1e-5)
    assert torch.equal(ids_out, ids)
    g = randn(50, 64)
    g_out = torch.empty(50, 64)
    codec.decode_backward(codec.encode_backward(g), g_out)
    torch.testing.assert_close(g_out, (g @ u) @ u.t(), atol=1e-5, rtol=1e-5)
    # Embedding shift: h0 = T[y] + E[y] unchanged, E in span(U), version + 1.
    e = randn(100, 64)
    h0 = table + e
    shifted = lbcc.shift_embedding(basis, e)
    assert shifted.version == basis.version + 1 and shifted.hash != basis.hash
    torch.testing.assert_close(torch.from_numpy(shifted.table) + e, h0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close((e @ u) @ u.t(), e, atol=1e-5, rtol=1e-5)
    w = randn(64, 30)
    lbcc.project_weight(basis, w, "rows")
    torch.testing.assert_close(u @ (u.t() @ w), w, atol=1e-5, rtol=1e-5)


# --- Errors. ---

def test_tensor_requirements_raise_type_and_value_errors():
    codec = lbcc.DenseQuantCodec()
    with pytest.raises(ValueError, match="contiguous"):
        codec.encode(randn(8, 8).t())
    with pytest.raises(TypeError, match="float32 tensor, got torch.float64"):
        codec.encode(torch.zeros(4, dtype=torch.float64))
    with pytest.raises(TypeError, match="torch.Tensor or numpy.ndarray"):
        codec.encode([1.0, 2.0])
    with pytest.raises(ValueError, match="CPU tensor"):
        codec.encode(torch.empty(4, device="meta"))
    with pytest.raises(ValueError, match="C-contiguous"):
        codec.encode(np.zeros((4, 4), dtype=np.float32).T)
    out = torch.zeros(4, requires_grad=True) * 2
    with pytest.raises(ValueError, match="autograd"):
        lbcc.decode(codec.encode(torch.zeros(4)), out)


def test_status_codes_become_exception_classes_with_code_and_message():
    with pytest.raises(lbcc.DataLossError) as e:
        lbcc.decode(b"not a payload", torch.zeros(3))
    assert e.value.code == "DATA_LOSS" and "truncated" in e.value.message
    assert str(e.value).startswith("DATA_LOSS: ")
    with pytest.raises(lbcc.InvalidArgumentError) as e:
        lbcc.TopKEfCodec(top_k=-1)
    assert isinstance(e.value, ValueError) and isinstance(e.value, lbcc.Error)
    assert e.value.code == "INVALID_ARGUMENT" and "top_k" in e.value.message
    with pytest.raises(lbcc.InvalidArgumentError, match="unique id"):
        lbcc.Communicator.init(b"short", 2, 0)
    payload = lbcc.DenseQuantCodec().encode(torch.zeros(4))
    corrupt = payload[:-1] + bytes([payload[-1] ^ 1])
    with pytest.raises(lbcc.DataLossError, match="checksum"):
        lbcc.decode(corrupt, torch.zeros(4))
    with pytest.raises(lbcc.InvalidArgumentError):
        lbcc.decode(payload, torch.zeros(5))
    with pytest.raises(lbcc.InvalidArgumentError):
        lbcc.Topology.from_json('{"nranks": 2, "typo": 1}')
    with pytest.raises(lbcc.NotFoundError):
        lbcc.SubspaceBasis.load("/nonexistent/basis")


def test_rank_with_nan_fails_every_rank_and_comm_stays_usable():
    codec = lbcc.TopKEfCodec()

    def body(rank, comm):
        delta = torch.ones(64, 64)
        if rank == 1:
            delta[3, 3] = float("nan")
        state = codec.new_state()
        with pytest.raises(lbcc.InvalidArgumentError) as e:
            comm.sparse_all_reduce([delta], [torch.empty(64, 64)], codec, [state])
        assert not state.has_pending
        t = torch.ones(2)
        comm.all_reduce(t)  # still usable
        return e.value.message, t.tolist()

    for message, t in run_ranks(3, body):
        assert "rank 1" in message and t == [3.0, 3.0]


def test_timeouts_abort_and_closed_communicators():
    def body(rank, comm):
        if rank == 0:
            out = torch.empty(4)
            request = comm.recv_compressed(out, 1, tag=99, async_op=True)
            with pytest.raises(lbcc.DeadlineExceededError) as e:
                request.wait(timeout=0.2)  # nothing was sent yet
            assert isinstance(e.value, TimeoutError) and not request.test()
        comm.barrier()
        if rank == 1:
            try:
                comm.send_compressed(torch.ones(4), 0, tag=99,
                                     codec=lbcc.DenseQuantCodec("bf16"))
            except (lbcc.UnavailableError, lbcc.CancelledError):
                pass  # Rank 0 may abort before this send's completion reached rank 1.
        else:
            request.wait(timeout=30)
            assert out.tolist() == [1.0] * 4
            comm.abort()  # Abrupt, on purpose: every rank's work fails from here on.
        with pytest.raises((lbcc.CancelledError, lbcc.UnavailableError,
                            lbcc.FailedPreconditionError)):
            comm.barrier(timeout=30)
        with pytest.raises(lbcc.FailedPreconditionError, match="failed earlier"):
            comm.all_reduce(torch.ones(2))
        with pytest.raises(lbcc.Error):
            comm.check()
        comm.close()
        with pytest.raises(lbcc.FailedPreconditionError, match="closed"):
            comm.barrier()
        return True

    assert run_ranks(2, body) == [True, True]


def test_bootstrap_with_a_missing_rank_is_deadline_exceeded(monkeypatch):
    monkeypatch.setenv("LBCC_SOCKET_IFNAME", "=lo")  # The root on loopback (default: not lo).
    uid = lbcc.create_unique_id(timeout=1)
    assert lbcc.unique_id_address(uid).startswith("127.0.0.1:")
    with pytest.raises(lbcc.DeadlineExceededError) as e:
        lbcc.Communicator.init(uid, 2, 0, backend="loopback", timeout=1)
    assert "rank(s) 1 of 2 never joined" in e.value.message


def test_create_unique_id_honours_lbcc_timeout_s(monkeypatch):
    monkeypatch.setenv("LBCC_SOCKET_IFNAME", "=lo")  # The root on loopback (default: not lo).
    monkeypatch.setenv("LBCC_TIMEOUT_S", "0")
    with pytest.raises(lbcc.InvalidArgumentError, match="LBCC_TIMEOUT_S='0'"):
        lbcc.create_unique_id()
    assert lbcc.unique_id_address(lbcc.create_unique_id(timeout=5)).startswith("127.0.0.1:")
    with pytest.raises(lbcc.InvalidArgumentError, match="timeout=0"):
        lbcc.create_unique_id(timeout=0)


def test_init_from_environment_without_launcher_is_invalid_argument(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "LBCC_BOOTSTRAP_ADDR"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(lbcc.InvalidArgumentError, match="RANK"):
        lbcc.init()


def test_mixture_basis_boundary_messages_carry_selectors():
    """A mixture basis (M = 2): the forward receive returns the selectors, the backward send
    takes them, and the sender rebuilds U_m U_m^T g per block."""
    basis = lbcc.SubspaceBasis.from_seed(32, 4, components=2, vocab_size=10, seed=2)
    u = torch.from_numpy(basis.u)
    ids = torch.arange(16, dtype=torch.int32) % 10
    # Tokens 0-7 in component 0's span, 8-15 in component 1's.
    h = torch.cat([randn(8, 4) @ u[:, :4].t(), randn(8, 4, seed=1) @ u[:, 4:].t()])
    g = randn(16, 32, seed=2)

    def body(rank, comm):
        codec = lbcc.SubspaceCodec(basis, coefficient_dtype="f32", mixture_block=8)
        if rank == 0:
            comm.send_subspace(h, 1, 0, codec, ids=ids)
            g_out = torch.empty(16, 32)
            comm.recv_subspace(g_out, 1, 0, codec, direction="backward")
            return g_out
        h_out, ids_out = torch.empty(16, 32), torch.empty(16, dtype=torch.int32)
        selectors = comm.recv_subspace(h_out, 0, 0, [codec], ids_out=ids_out)
        comm.send_subspace(g, 0, 0, codec, direction="backward", selectors=selectors)
        return h_out, ids_out, selectors

    g_out, (h_out, ids_out, selectors) = run_ranks(2, body)
    assert selectors == (8, bytes([0, 1]))
    torch.testing.assert_close(h_out, h, atol=1e-5, rtol=1e-5)
    assert torch.equal(ids_out, ids)
    expected = torch.cat([(g[:8] @ u[:, :4]) @ u[:, :4].t(), (g[8:] @ u[:, 4:]) @ u[:, 4:].t()])
    torch.testing.assert_close(g_out, expected, atol=1e-5, rtol=1e-5)


def test_fit_basis_recovers_the_subspace_of_its_samples():
    true = lbcc.SubspaceBasis.from_seed(24, 3, seed=4)
    u = torch.from_numpy(true.u)
    samples = (randn(500, 3) @ u.t()).contiguous()
    fitted = lbcc.fit_basis(samples, rank=3)
    v = torch.from_numpy(fitted.u)
    torch.testing.assert_close(v @ (v.t() @ samples.t()), samples.t(), atol=1e-4, rtol=1e-4)
    slow = lbcc.Topology.flat(3).with_slow_ranks([2])
    assert slow.link(0, 2) == "slow" and slow.replicas[2] == {"kind": "full", "ranks": [2]}


INTERRUPT_CHILD = r"""
import signal, threading, torch, lbcc
armed = False
def on_sigint(signum, frame):
    # Ctrl-C's KeyboardInterrupt, but only right around the blocking call (each arming takes
    # one signal), so the parent may signal repeatedly without hitting other code.
    global armed
    if armed:
        armed = False
        raise KeyboardInterrupt
signal.signal(signal.SIGINT, on_sigint)
uid = lbcc.create_unique_id()
other = {}
def rank1():
    comm = lbcc.Communicator.init(uid, 2, 1, backend="loopback", timeout=120)
    try:
        comm.barrier()
    except lbcc.Error as e:
        other["error"] = e.code
    comm.close()
t = threading.Thread(target=rank1)
t.start()
comm = lbcc.Communicator.init(uid, 2, 0, backend="loopback", timeout=120)
print("ready", flush=True)
while True:
    try:
        armed = True
        comm.recv_compressed(torch.empty(4), 1, tag=5)  # never sent: only Ctrl-C ends it
    except KeyboardInterrupt:
        pass
    armed = False
    try:
        comm.check()  # ok: the signal came before the call reached LBCC; again
    except lbcc.Error:
        break  # LBCC saw it while waiting and aborted the communicator
signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's signals still on their way
t.join()
print("interrupted", other.get("error"), flush=True)
"""


def test_ctrl_c_interrupts_a_blocking_call_and_fails_the_peers():
    """SIGINT while a rank waits in a blocking call raises KeyboardInterrupt there and aborts
    the communicator, so the other ranks fail instead of hanging. The parent repeats the signal
    until the child exits: one that lands before the call reached LBCC makes it try again."""
    import os
    import signal
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", INTERRUPT_CHILD], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=dict(os.environ))
    assert child.stdout.readline().decode().strip() == "ready"
    for _ in range(120):
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            continue
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, out.decode() + err.decode()
    # The interrupted rank aborted the communicator, so its peer's barrier failed too.
    assert out.decode().startswith("interrupted UNAVAILABLE") or \
        out.decode().startswith("interrupted CANCELLED"), out.decode()


def test_non_utf8_bytes_in_a_status_message_still_raise_lbcc_error(monkeypatch):
    # A path from the environment that is not UTF-8 ends up in the status message: the binding
    # decodes it with errors="replace" instead of raising UnicodeDecodeError.
    monkeypatch.setitem(os.environb, b"LBCC_TOPO_FILE", b"/nonexistent/topo-\xff.json")
    uid = lbcc.create_unique_id(timeout=5)
    with pytest.raises(lbcc.Error) as e:
        lbcc.Communicator.init(uid, 1, 0, backend="loopback", timeout=5)
    assert "topo-\ufffd.json" in e.value.message


def test_arguments_pybind_cannot_convert_raise_lbcc_argument_type_error():
    def body(rank, comm):
        delta, out = torch.ones(64), torch.zeros(64)
        with pytest.raises(lbcc.ArgumentTypeError) as e:
            comm.sparse_all_reduce([delta], [out], lbcc.TopKEfCodec(), states=[5])
        assert isinstance(e.value, TypeError) and isinstance(e.value, lbcc.Error)
        assert e.value.code == "INVALID_ARGUMENT"
        return True

    assert run_ranks(1, body) == [True]


def test_an_argument_error_still_takes_part_so_no_rank_falls_behind():
    # Issue 19 item 1: rank 0's float64 tensor raises TypeError before anything is posted. It
    # used to leave rank 0 one operation behind: its next all_reduce paired with rank 1's
    # previous one and both got 12.0 instead of 21.0, with no error. Now the call takes part
    # with an error contribution: rank 1's all_reduce fails naming rank 0, the next is right.
    def body(rank, comm):
        first = None
        try:
            if rank == 0:
                comm.all_reduce(torch.tensor([10.0], dtype=torch.float64))
            else:
                comm.all_reduce(torch.tensor([2.0]))
        except (TypeError, lbcc.Error) as e:
            first = e
        t = torch.tensor([10.0 if rank == 0 else 11.0])
        comm.all_reduce(t)
        return first, t.item()

    (e0, t0), (e1, t1) = run_ranks(2, body)
    assert isinstance(e0, TypeError) and "float64" in str(e0)
    assert isinstance(e1, lbcc.InvalidArgumentError) and "rank 0 rejected" in e1.message
    assert t0 == t1 == 21.0


def test_ranks_that_disagree_on_an_operation_fail_naming_the_field():
    codec = lbcc.TopKEfCodec(top_k=4)

    def body(rank, comm):
        delta, out = torch.ones(64), torch.zeros(64)
        aggregation = "sum" if rank == 1 else "sparseloco"
        with pytest.raises(lbcc.FailedPreconditionError) as e:
            comm.sparse_all_reduce([delta], [out], codec, [codec.new_state()],
                                   aggregation=aggregation)
        root_data = b"abc" if rank == 0 else None
        if rank == 0:
            with pytest.raises(TypeError):
                lbcc.broadcast_bytes(comm, "not bytes", root=0)
        else:
            with pytest.raises(lbcc.InvalidArgumentError, match="rank 0 rejected"):
                lbcc.broadcast_bytes(comm, None, root=0)
        return e.value.message, lbcc.broadcast_bytes(comm, root_data, root=0)

    for message, data in run_ranks(3, body):
        assert "rank 0 and rank 1 disagree on op 0's aggregation: sparseloco vs sum" in message
        assert data == b"abc"
