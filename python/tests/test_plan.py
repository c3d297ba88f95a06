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
