"""One rank of a SparseLoCo job started by torchrun on several (emulated) hosts.

Usage (per node): torchrun --nnodes N --node_rank i --nproc_per_node P --master_addr HOST
    --master_port PORT --redirects 2 --tee 1 --log_dir DIR multinode_sparseloco.py OUT_DIR

lbcc.init() finds the other ranks through torchrun's own store (MASTER_ADDR:MASTER_PORT): no
port of LBCC's own besides the transport's. Each rank trains a small model on its own data with
lbcc.torch.SparseLoCo (constructor + step only) and writes OUT_DIR/rank<r>.json: its host name,
init seconds, bytes by link class and a digest of its final parameters (every replica must hold
the same bits).
"""

import hashlib
import json
import os
import socket
import sys
import time

import torch

import lbcc
from lbcc.torch import SparseLoCo

INNER_STEPS = 4
OUTER_STEPS = 3


def main():
    out_dir = sys.argv[1]
    torch.set_num_threads(1)
    start = time.monotonic()
    comm = lbcc.init(timeout=90)
    init_s = time.monotonic() - start
    rank = comm.rank
    torch.manual_seed(1234)  # The same initial model everywhere (SparseLoCo syncs it anyway).
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64))
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt = SparseLoCo(inner, comm, inner_steps=INNER_STEPS, top_k=64, beta=0.95, outer_lr=1.0,
                     value_bits=2, timeout=90)
    data = torch.Generator().manual_seed(100 + rank)  # Each replica its own data.
    losses = []
    for _ in range(INNER_STEPS * OUTER_STEPS):
        x = torch.randn(32, 64, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), x.flip(1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().contiguous().numpy().tobytes())
    record = {
        "rank": rank, "ranks": comm.nranks, "host": socket.gethostname(),
        "master_addr": os.environ.get("MASTER_ADDR"), "init_s": round(init_s, 3),
        "bytes": comm.bytes_by_class(), "digest": digest.hexdigest(), "losses": losses,
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    print(json.dumps({k: record[k] for k in ("rank", "host", "init_s", "bytes", "digest")}))
    # Close the communicator before the interpreter exits (which may skip destructors): every
    # rank says goodbye, so none waits for a peer that is gone.
    comm.close()


if __name__ == "__main__":
    main()
