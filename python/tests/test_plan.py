"""lbcc.plan: the planning model through the extension (same JSON as `lbcc plan --json`)."""

import pytest

import lbcc
import lbcc.plan

FLAT = {"topology": {"nranks": 4},
        "rates": {"efficiency": 1, "default": {"up_mbit": 100000, "down_mbit": 100}},
        "collective": {"op": "allreduce", "bytes": 16 << 20}}


def test_collective_prediction():
    p = lbcc.plan.predict(FLAT)
    assert p["algorithm"] == "ring"
    assert p["wire_recv_bytes"] == 2 * 3 / 4 * (16 << 20)
    assert p["seconds"] == pytest.approx(2 * 3 / 4 * (16 << 20) / 12.5e6)


def test_job_and_recommendation():
    job = {"topology": {"nranks": 3, "replicas": [{"kind": "full", "rank": 0},
                                                  {"kind": "pipeline", "stages": [1, 2]}]},
           "rates": {"default": {"up_mbit": 100, "down_mbit": 100, "latency_ms": 5}},
           "model": {"params": 100_000_000, "stage_params": [50_000_000, 50_000_000],
                     "d": 1024, "seq_len": 1024, "tokens_per_step": 65536},
           "compute": {"default_tflops": 50},
           "job": {"H": 30, "target_utilization": 0.9}}
    p = lbcc.plan.predict(job)
    assert [r["kind"] for r in p["replicas"]] == ["full", "pipeline"]
    r = lbcc.plan.recommend(job)
    assert r["reached"]
    assert all(x["utilization"] >= 0.9 for x in r["least"]["replicas"])


def test_bad_input_names_the_field():
    with pytest.raises(lbcc.InvalidArgumentError, match="rates"):
        lbcc.plan.predict({"topology": {"nranks": 2}, "collective": {"bytes": 64}})
    bad = dict(FLAT, rates={"default": {"up_mbit": 0, "down_mbit": 1}})
    with pytest.raises(lbcc.InvalidArgumentError, match="up_mbit"):
        lbcc.plan.predict(bad)


# ---- lbcc.plan.ring: the context ring (plan/ring.h) ----------------------------------------

# Two ranks, causal, bf16, a link fast enough that the compute bounds every round.
RING = dict(context=1024, link_mbit=10000, d=128, attention_gflops=10, ranks=2, batch=2,
            heads=4, layers=3, codec="bf16")


def test_ring_keywords_reach_the_planner_by_hand():
    p = lbcc.plan.ring(codec_gelements_s=0.1, **RING)
    tokens = 2 * 512
    c_f = 4.0 * 2 * 512 * 512 * 128 / 10e9
    c_b = 2.5 * c_f
    e = 2 * tokens * 128 / 0.1e9  # encode or decode of one block: K and V, f32 elements
    assert p["ranks"] == 2 and p["tokens_per_rank"] == 512
    assert p["block_forward_s"] == pytest.approx(c_f, rel=1e-12)
    assert p["codec_gelements_s"] == pytest.approx(0.1, rel=1e-12)
    assert p["block_encode_s"] == pytest.approx(e, rel=1e-12)
    assert p["block_decode_s"] == pytest.approx(e, rel=1e-12)
    hop = p["round_backward_wire_s"] + p["round_latency_s"]
    assert hop < c_f
    # Forward: encode own K, V and decode them back, compute own, decode rank 0's, compute it.
    assert p["forward_s"] == pytest.approx(2 * e + c_f + e + c_f, rel=1e-12)
    # Backward: both blocks' gradients, encode rank 0's partial sum, one hop, its decode.
    assert p["backward_s"] == pytest.approx(2 * c_b + e + hop + e, rel=1e-12)
    assert p["ring_codec_s"] == pytest.approx(3 * 5 * e, rel=1e-12)
    assert p["ring_compute_s"] == pytest.approx(3 * 2 * (c_f + c_b), rel=1e-12)
    assert p["ring_s"] == pytest.approx(3 * (p["forward_s"] + p["backward_s"]), rel=1e-12)
    assert p["limit"] == "compute"


def test_ring_codec_term_follows_the_rate_and_defaults_per_codec():
    fast = lbcc.plan.ring(codec_gelements_s=0.2, **RING)
    slow = lbcc.plan.ring(codec_gelements_s=0.1, **RING)
    assert slow["ring_codec_s"] == pytest.approx(2 * fast["ring_codec_s"], rel=1e-12)
    assert slow["ring_s"] - fast["ring_s"] == pytest.approx(fast["ring_codec_s"], rel=1e-9)
    assert slow["ring_compute_s"] == fast["ring_compute_s"]
    assert slow["ring_wire_s"] == fast["ring_wire_s"]
    default = lbcc.plan.ring(**RING)  # the codec's own default (plan/ring.h)
    assert default["codec_gelements_s"] > 0 and default["ring_codec_s"] > 0
    job = lbcc.plan.ring_job(codec_gelements_s=0.1, **RING)
    assert job["ring"]["codec_gelements_s"] == 0.1
    assert "codec_gelements_s" not in lbcc.plan.ring_job(**RING)["ring"]
    assert lbcc.plan.predict(job) == slow


def test_ring_bad_keywords_name_themselves():
    with pytest.raises(lbcc.InvalidArgumentError, match="ring.codec_gelements_s"):
        lbcc.plan.ring(codec_gelements_s=0, **RING)
    with pytest.raises(lbcc.InvalidArgumentError, match="unknown key 'codec_gbytes_s'"):
        lbcc.plan.ring(codec_gbytes_s=1, **RING)
    with pytest.raises(lbcc.InvalidArgumentError, match="ring.codec"):
        lbcc.plan.ring(**dict(RING, codec="int8"))
