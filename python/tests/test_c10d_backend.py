"""torch.distributed backend "lbcc": ProcessGroupGlooTest's cases ported one for one
(c10d_worker.py), on 4 ranks as processes (LBCC over UCX on 127.0.0.1), plus LBCC's own
operations on dist groups (sparse_all_reduce, compressed send/recv, SparseLoCo, the DDP hook)
and bad input across ranks. A skipped case says why; the dead-peer case checks that the
survivors get LBCC's RuntimeError ("LBCC <CODE>: ..."), not a hang.

SparseLoCo on the default group is compared with test_sparseloco's pure-PyTorch reference
(same tolerance and reason as there)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import free_ports

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 4


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("c10d")
    port = free_ports(1)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + sys.path))
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "c10d_worker.py"), str(r),
                               str(WORLD), str(port), str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(WORLD)]
    logs = [p.communicate(timeout=240)[0].decode(errors="replace") for p in procs]
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} failed:\n{logs[r]}"
    print("\n".join(logs))
    return {"out": out, "ranks": [json.load(open(out / f"rank{r}.json")) for r in range(WORLD)]}


sys.path.insert(0, HERE)
CASE_NAMES = [line.split("def ")[1].split("(")[0]
              for line in open(os.path.join(HERE, "c10d_worker.py"))
              if line.startswith("def test_")]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_case(results, name):
    ranks = range(WORLD - 1) if name == "test_dead_peer_fails_within_timeout" else range(WORLD)
    outcomes = {r: results["ranks"][r].get(name, "missing") for r in ranks}
    if all(o.startswith("skip") for o in outcomes.values()):
        pytest.skip(outcomes[0][len("skip: "):])
    for r, o in outcomes.items():
        assert o == "ok", f"rank {r}: {o}"


def test_sparseloco_on_default_group_matches_reference(results):
    import torch

    import sparseloco_common as common
    from test_sparseloco import ReferenceSparseLoCo, assert_close

    steps = [torch.load(results["out"] / f"sparseloco_rank{r}.pt") for r in range(WORLD)]
    assert WORLD == common.RANKS
    ref = ReferenceSparseLoCo(seed=1, replicas=WORLD, top_k=128, beta=0.95, outer_lr=1.0, bits=2,
                              aggregation="sparseloco")
    for step in range(common.OUTER_STEPS):
        ref.outer_step(step)
        for r in range(WORLD):
            assert all(torch.equal(a, b) for a, b in zip(steps[r][step]["params"],
                                                          steps[0][step]["params"]))
            assert_close(steps[r][step]["ef"], ref.errors[r], f"rank {r} ef, step {step}")
        assert_close(steps[0][step]["params"], ref.theta, f"params after step {step}")
