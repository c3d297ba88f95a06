"""The planning model (`lbcc plan`, plan/plan.h) from Python.

    import lbcc.plan
    job = {"topology": {"nranks": 4}, "rates": {"default": {"up_mbit": 100, "down_mbit": 100}},
           "collective": {"op": "sparse_allreduce", "bytes": 16 << 20}}
    lbcc.plan.predict(job)["seconds"]
    lbcc.plan.recommend(full_job)["least"]["replicas"]
    lbcc.plan.ring(context=4096, ranks=4, link_mbit=100, d=256, heads=8, layers=4,
                   attention_gflops=20, codec="subspace", compression=0.95,
                   codec_gelements_s=0.1)["step_s"]

A job is a dict (or JSON text) in the schema of docs/planning.md; results are dicts with the
same fields as `lbcc plan --json`. Bad input raises lbcc.InvalidArgumentError naming the field.
"""

import json

from lbcc import _lbcc


def _text(job):
    return job if isinstance(job, str) else json.dumps(job)


def predict(job):
    """One outer step (or the job's "collective", or its "ring" step) as a dict."""
    return json.loads(_lbcc.plan_predict(_text(job)))


def recommend(job):
    """The least compression per replica that reaches the target utilization, and compress-all."""
    return json.loads(_lbcc.plan_recommend(_text(job)))


def ring_job(context, link_mbit, d, attention_gflops, ranks=4, latency_ms=0.0, message_ms=0.0,
             codec_gelements_s=None, **ring):
    """The plan document of a context-parallel ring step (what `lbcc plan ring`'s flags make):
    every rank behind a link of `link_mbit` up and down with `latency_ms` (one way) and
    `message_ms` per message (rates.message_ms); `codec_gelements_s` the caller's encode or
    decode rate of one rank in G f32 elements/s (ring.codec_gelements_s; None: the codec's
    default, plan/ring.h); `ring` holds the other fields of the "ring" section (batch, heads,
    layers, causal, codec, k, compression, components, mixture_block, coefficient_dtype,
    other_s, other_gflops, params, grad_tensors; docs/context_parallel.md, "Planning"). The
    planner rejects any other key, naming it."""
    section = dict(ring, context=context, d=d, attention_gflops=attention_gflops)
    if codec_gelements_s is not None:
        section["codec_gelements_s"] = codec_gelements_s
    return {"topology": {"nranks": ranks},
            "rates": {"default": {"up_mbit": link_mbit, "down_mbit": link_mbit,
                                  "latency_ms": latency_ms},
                      "message_ms": message_ms},
            "ring": section}


def ring(context, link_mbit, d, attention_gflops, ranks=4, latency_ms=0.0, message_ms=0.0,
         codec_gelements_s=None, **fields):
    """One step of context-parallel ring attention predicted (plan/ring.h): a dict with
    ring_s, ring_compute_s (block attention), ring_codec_s (the caller's encodes and decodes of
    the blocks, beside the compute on the same thread; block_encode_s, block_decode_s per
    block), ring_wire_s, forward_s, backward_s, other_s, allreduce_s, step_s, the payload bytes
    per round and the k a compression ratio picked. A bad field or an unknown keyword raises
    lbcc.InvalidArgumentError naming it ("ring.codec_gelements_s: ...", "ring: unknown key
    'dim'")."""
    return predict(ring_job(context, link_mbit, d, attention_gflops, ranks, latency_ms,
                            message_ms, codec_gelements_s, **fields))
