"""The planning model (`lbcc plan`, plan/plan.h) from Python.

    import lbcc.plan
    job = {"topology": {"nranks": 4}, "rates": {"default": {"up_mbit": 100, "down_mbit": 100}},
           "collective": {"op": "sparse_allreduce", "bytes": 16 << 20}}
    lbcc.plan.predict(job)["seconds"]
    lbcc.plan.recommend(full_job)["least"]["replicas"]

A job is a dict (or JSON text) in the schema of docs/planning.md; results are dicts with the
same fields as `lbcc plan --json`. Bad input raises lbcc.InvalidArgumentError naming the field.
"""

import json

from lbcc import _lbcc


def _text(job):
    return job if isinstance(job, str) else json.dumps(job)


def predict(job):
    """One outer step (or the job's "collective") as a dict."""
    return json.loads(_lbcc.plan_predict(_text(job)))


def recommend(job):
    """The least compression per replica that reaches the target utilization, and compress-all."""
    return json.loads(_lbcc.plan_recommend(_text(job)))
