"""DDP with the default hook on backend "lbcc" trains to the parameters Gloo's DDP reaches:
4 processes under torchrun, 20 SGD steps, small buckets. The reduction orders differ (LBCC's
ring starts chunk c at rank c + 1), so fp32 sums may differ in the last bit: within 1e-6.
Every rank holds identical bits under each backend."""

import os
import subprocess
import sys

import torch

from conftest import free_ports

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 4


def test_ddp_on_lbcc_matches_gloo(tmp_path):
    port = free_ports(1)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + sys.path), OMP_NUM_THREADS="1")
    # Python 3.11 + torch 1.13's torchrun crash with the default redirect: redirect explicitly.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(WORLD),
           "--master_addr", "127.0.0.1", "--master_port", str(port), "--redirects", "2",
           "--tee", "1", "--log_dir", str(tmp_path / "logs"),
           os.path.join(HERE, "ddp_backend_worker.py"), str(tmp_path)]
    run = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         timeout=300)
    assert run.returncode == 0, run.stdout.decode(errors="replace")[-4000:]
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    worst = 0.0
    for lbcc_p, gloo_p in zip(results[0]["lbcc"], results[0]["gloo"]):
        worst = max(worst, (lbcc_p - gloo_p).abs().max().item())
    print(f"largest |lbcc - gloo| parameter difference: {worst:.3g}")
    assert worst <= 1e-6
    for r in range(1, WORLD):
        for backend in ("lbcc", "gloo"):
            for a, b in zip(results[0][backend], results[r][backend]):
                assert torch.equal(a, b), f"rank {r} differs from rank 0 under {backend}"
