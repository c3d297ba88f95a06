"""One rank of test_sparseloco_overlap's process run: SparseLoCo(overlap=...) over UCX between
processes, results saved with torch.save.

Usage: sparseloco_overlap_worker.py UNIQUE_ID_HEX NRANKS RANK OUT_DIR OVERLAP FRAGMENTS STEPS
"""

import sys

import torch

import lbcc
import test_sparseloco_overlap as t


def main():
    uid, nranks, rank, out_dir = bytes.fromhex(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), \
        sys.argv[4]
    overlap, fragments, steps = sys.argv[5], int(sys.argv[6]), int(sys.argv[7])
    torch.set_num_threads(1)
    comm = lbcc.Communicator.init(uid, nranks, rank, backend="ucx", timeout=120)
    result = t._train(rank, comm, steps, overlap=overlap, fragments=fragments)
    torch.save(result, f"{out_dir}/rank{rank}.pt")
    comm.close()


if __name__ == "__main__":
    main()
