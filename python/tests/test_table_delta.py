"""The lossy pipeline boundary's table from Python: table deltas (lbcc.encode_table_delta /
apply_table_delta / inspect_table_delta), the table refresh (lbcc.refresh_table) and the table
update between two ranks (Communicator.send_table_update / recv_table_update, ranks as threads
over the loopback transport).

The table must end bit-identical to the sender's, so comparisons are on the int32 view of the
float32 bits, never with a tolerance."""

import pytest
import torch

import lbcc
from conftest import run_ranks

V, D, K = 50, 16, 4


def make_basis(version=0):
    return lbcc.SubspaceBasis.from_seed(model_dim=D, rank=K, vocab_size=V, with_table=True,
                                        table_stddev=0.5, seed=11, version=version)


def outer_step(before, fraction=0.05, seed=0):
    """`before` with about `fraction` of its elements changed, as an outer step would."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(before.shape, generator=g) < fraction
    after = before.clone()
    after[mask] += torch.randn(int(mask.sum()), generator=g)
    return after


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32),
                                              b.contiguous().view(torch.int32))


def test_round_trip_and_inspect():
    g = torch.Generator().manual_seed(1)
    before = torch.randn(V, D, generator=g)
    for fraction, encoding in ((0.0, "gaps"), (0.05, "gaps"), (1.0, "bitmap")):
        after = outer_step(before, fraction, seed=2)
        data = lbcc.encode_table_delta(before, after)
        assert isinstance(data, bytes)
        info = lbcc.inspect_table_delta(data)
        changed = int((before.view(torch.int32) != after.view(torch.int32)).sum())
        assert info == {"n": V * D, "m": changed, "encoding": encoding,
                        "position_bytes": info["position_bytes"], "bytes": len(data)}
        table = before.clone()
        assert lbcc.apply_table_delta(table, data) is None
        assert same_bits(table, after)
    # About 5 bytes per changed element at 5 %: far below the dense 4 bytes per element.
    data = lbcc.encode_table_delta(before, outer_step(before, 0.05, seed=3))
    assert len(data) < before.numel() * 4 // 3


def test_bits_not_values():
    before = torch.tensor([0.0, 1.0, float("nan")])
    after = torch.tensor([-0.0, 1.0, float("nan")])
    data = lbcc.encode_table_delta(before, after)
    assert lbcc.inspect_table_delta(data)["m"] == 1
    table = before.clone()
    lbcc.apply_table_delta(table, data)
    assert same_bits(table, after)


def test_corruption_is_data_loss_and_leaves_the_table_untouched():
    before = torch.arange(200, dtype=torch.float32)
    after = outer_step(before, 0.1, seed=4)
    data = lbcc.encode_table_delta(before, after)
    table = before.clone()
    for i in (0, 9, 20, len(data) // 2, len(data) - 1):
        bad = bytearray(data)
        bad[i] ^= 0x01
        with pytest.raises(lbcc.DataLossError):
            lbcc.apply_table_delta(table, bytes(bad))
        with pytest.raises(lbcc.DataLossError):
            lbcc.inspect_table_delta(bytes(bad))
    for bad in (data[:-1], data + b"\0", b"", b"LBCC" + bytes(60)):
        with pytest.raises(lbcc.DataLossError):
            lbcc.apply_table_delta(table, bad)
    assert same_bits(table, before)
    # Another size: InvalidArgumentError, which is a ValueError.
    longer = torch.zeros(201)
    with pytest.raises(ValueError, match="table of 201"):
        lbcc.apply_table_delta(longer, data)
    assert torch.equal(longer, torch.zeros(201))
    with pytest.raises(lbcc.InvalidArgumentError):
        lbcc.encode_table_delta(before, after[:-1])
    with pytest.raises(TypeError):
        lbcc.encode_table_delta(before.double(), after.double())


def test_refresh_table_ids():
    basis = make_basis(version=7)
    g = torch.Generator().manual_seed(5)
    embedding = torch.randn(V, D, generator=g)
    e0 = embedding.clone()
    lossy = lbcc.refresh_table(basis, embedding)  # mode="lossy" by default
    assert lossy.version == 8
    assert lossy.id == lbcc.refresh_table(basis, embedding.clone(), mode="lossy").id
    assert lossy.id != basis.id
    assert same_bits(torch.from_numpy(lossy.table), e0)
    assert same_bits(embedding, e0)  # untouched
    # Constrained: the embedding shift, in place, with the same id as shift_embedding's.
    e1, e2 = e0.clone(), e0.clone()
    constrained = lbcc.refresh_table(basis, e1, mode="constrained", arithmetic="portable")
    shifted = lbcc.shift_embedding(basis, e2, arithmetic="portable")
    assert constrained.id == shifted.id and constrained.version == 8
    assert same_bits(e1, e2) and not same_bits(e1, e0)
    with pytest.raises(lbcc.InvalidArgumentError):
        lbcc.refresh_table(basis, embedding, mode="exact")
    with pytest.raises(lbcc.InvalidArgumentError):
        lbcc.refresh_table(basis, torch.zeros(V, D + 1))
    no_vocab = lbcc.SubspaceBasis.from_seed(model_dim=D, rank=K)
    with pytest.raises(lbcc.FailedPreconditionError):
        lbcc.refresh_table(no_vocab, embedding)


def test_two_ranks_send_and_receive_the_update():
    """Stage 0 holds the embedding, stage 1 only the synced table: after the outer step the
    update makes stage 1's table bit-identical, both refresh to the same basis, and a corrupt
    message or another size fails without touching the table."""
    g = torch.Generator().manual_seed(6)
    before = torch.randn(V, D, generator=g)
    after = outer_step(before, 0.05, seed=7)
    expected_bytes = len(lbcc.encode_table_delta(before, after))
    basis = make_basis()

    def body(rank, comm):
        if rank == 0:
            sent = comm.send_table_update(before, after, peer=1, tag=5)
            comm.send_table_update(before, after, 1, tag=5, timeout=30.0)  # for the wrong size
            # A foreign message on the same tag: a dense-quantized tensor.
            comm.send_compressed(after, 1, 5, lbcc.DenseQuantCodec())
            return sent, lbcc.refresh_table(basis, after).id
        table = before.clone()
        received = comm.recv_table_update(table, peer=0, tag=5, timeout=30.0)
        assert same_bits(table, after)
        wrong = torch.zeros(V * D + 1)
        with pytest.raises(lbcc.InvalidArgumentError):
            comm.recv_table_update(wrong, 0, tag=5)
        assert torch.equal(wrong, torch.zeros(V * D + 1))
        kept = table.clone()
        with pytest.raises(lbcc.DataLossError):
            comm.recv_table_update(table, 0, tag=5)
        assert same_bits(table, kept)
        return received, lbcc.refresh_table(basis, table).id

    (sent, id0), (received, id1) = run_ranks(2, body)
    assert sent == received == expected_bytes
    assert id0 == id1 and id0[1] == basis.version + 1


def test_recv_timeout_aborts_the_communicator():
    def body(rank, comm):
        if rank == 0:
            table = torch.zeros(8)
            with pytest.raises(lbcc.DeadlineExceededError, match="aborted"):
                comm.recv_table_update(table, peer=1, tag=9, timeout=0.2)
            assert torch.equal(table, torch.zeros(8))
        with pytest.raises(ValueError):
            comm.send_table_update(torch.zeros(8), torch.ones(8), peer=1 - rank, timeout=-1.0)
        return rank

    assert run_ranks(2, body, timeout=20.0) == [0, 1]
