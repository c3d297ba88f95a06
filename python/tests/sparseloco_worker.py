"""One rank of test_sparseloco: SparseLoCo through LBCC over UCX, results saved with torch.save.

Usage: sparseloco_worker.py UNIQUE_ID_HEX RANK OUT_DIR
  1. world: 4 replicas, OUTER_STEPS outer steps; parameters and error feedback after each;
     then the last outer step again from a state_dict taken before it, in a fresh optimizer.
  2. split: the world split into two groups {0, 2} and {1, 3} (per-shard groups), each training
     its own model for two outer steps with other options.
"""

import copy
import sys

import torch

import lbcc
import sparseloco_common as common
from lbcc.torch import SparseLoCo


def snapshot(model, opt):
    return {"params": [p.detach().clone() for p in model.parameters()],
            "ef": opt.error_feedback()}


def main():
    uid = bytes.fromhex(sys.argv[1])
    rank = int(sys.argv[2])
    out_dir = sys.argv[3]
    torch.set_num_threads(1)
    comm = lbcc.Communicator.init(uid, common.RANKS, rank, backend="ucx", timeout=120)

    # 1. World.
    seed = 1
    model = common.build_model(seed)
    inner = torch.optim.AdamW(model.parameters(), lr=common.INNER_LR)
    opt = SparseLoCo(inner, comm, inner_steps=common.INNER_STEPS, top_k=128, beta=0.95,
                     outer_lr=1.0, value_bits=2)
    record = {"steps": [], "resumed": None}
    saved = None
    for outer in range(common.OUTER_STEPS):
        if outer == common.OUTER_STEPS - 1:
            saved = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))
        for i in range(common.INNER_STEPS):
            common.inner_step(model, opt, seed, rank, outer, i)
            opt.step()
        record["steps"].append(snapshot(model, opt))

    # The last outer step again, from the checkpoint, in a fresh model and optimizer.
    model2 = common.build_model(seed + 7)
    inner2 = torch.optim.AdamW(model2.parameters(), lr=common.INNER_LR)
    opt2 = SparseLoCo(inner2, comm, inner_steps=common.INNER_STEPS, top_k=128, beta=0.95,
                      outer_lr=1.0, value_bits=2)
    model2.load_state_dict(saved[0])
    opt2.load_state_dict(saved[1])
    outer = common.OUTER_STEPS - 1
    for i in range(common.INNER_STEPS):
        common.inner_step(model2, opt2, seed, rank, outer, i)
        opt2.step()
    record["resumed"] = snapshot(model2, opt2)

    # 2. Split into per-shard groups.
    color = rank % 2
    shard = comm.split(color, rank)
    seed = 10 + color
    model = common.build_model(seed)
    inner = torch.optim.AdamW(model.parameters(), lr=common.INNER_LR)
    opt = SparseLoCo(inner, shard, inner_steps=common.INNER_STEPS, top_k=64, beta=0.9,
                     outer_lr=0.8, value_bits=4, aggregation="mean")
    record["split"] = {"color": color, "shard_rank": shard.rank, "steps": []}
    for outer in range(2):
        for i in range(common.INNER_STEPS):
            common.inner_step(model, opt, seed, shard.rank, outer, i)
            opt.step()
        record["split"]["steps"].append(snapshot(model, opt))
    torch.save(record, f"{out_dir}/rank{rank}.pt")
    shard.close()
    comm.close()


if __name__ == "__main__":
    main()
