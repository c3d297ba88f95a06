"""One rank of tests/firewall_drop_test.sh: joins a job whose peer drops its packets and reports,
as one JSON line, how long the failure took against the timeout it was given.

  firewall_drop_timeout.py bootstrap ROOT_ADDR TIMEOUT    rank 1; the root's packets are dropped
  firewall_drop_timeout.py links ROOT_ADDR TIMEOUT RANK   rank RANK of 2 whose links are dropped
  firewall_drop_timeout.py member MASTER_ADDR TIMEOUT      an elastic member; the master's dropped
"""
import json
import sys
import time

import lbcc
import numpy as np


def main():
    what, address, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    rank = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    if what == "links" and rank == 0:
        lbcc.start_root(address, 2, session=7, timeout=timeout)
    uid = lbcc.unique_id_from_address(address, 7) if what != "member" else None
    started = time.monotonic()
    error = ""
    try:
        if what == "member":
            lbcc.ElasticGroup([np.zeros(4, np.float32)], master_address=address, job_id="fw",
                              join_timeout=timeout, op_timeout=timeout)
        else:
            comm = lbcc.Communicator.init(uid, 2, rank, timeout=timeout)
            comm.barrier()
    except Exception as e:  # The failure under test: any error, timed.
        error = str(e)
    print(json.dumps({"what": what, "rank": rank, "timeout": timeout,
                      "elapsed": time.monotonic() - started, "error": error}), flush=True)


if __name__ == "__main__":
    main()
