"""A DistributedDataParallel communication hook that all-reduces gradient buckets through LBCC,
compressed.

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("lbcc")              # DDP's own group (parameter broadcast, ...)
    model = DDP(model)
    state = lbcc.torch.CompressedAllReduceState(None, codec="int8")  # the default group's
    # (or, beside a Gloo group: CompressedAllReduceState(lbcc.init(), codec="int8"))
    model.register_comm_hook(state, lbcc.torch.compressed_allreduce_hook)

Codecs:
  "int8", "int4" (blockwise absmax), "bf16", "fp16": dense quantization; every rank's quantized
      bucket reaches every rank, which averages them in rank order.
  "topk": chunked top-k with error feedback (e = beta * e + g; send top-k of e; e -= sent),
      then the mean over ranks. Buckets are identified by their index, so the first
      `start_iter` iterations (default 2; DDP rebuilds its buckets after the first) run a dense
      fp32 all-reduce through LBCC instead, like PyTorch's PowerSGD hook.
Every rank gets the same bits, so replicas stay identical. The hook returns at once; a helper
thread completes each bucket's future when LBCC has finished it, so communication overlaps the
rest of the backward pass.
"""

import queue
import threading

import torch

import lbcc
from lbcc.torch import backend

_DENSE = ("int8", "int4", "bf16", "fp16")


class _Completer:
    """Completes torch futures when LBCC requests finish, in posting order (one thread)."""

    def __init__(self):
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="lbcc-ddp-hook", daemon=True)
        self._thread.start()

    def submit(self, request, future, out, buffer):
        self._queue.put((request, future, out, buffer))

    def close(self):
        self._queue.put(None)
        self._thread.join()

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            request, future, out, buffer = item
            try:
                request.wait()
                result = out.view(-1)[:buffer.numel()].view(buffer.shape).to(
                    device=buffer.device, dtype=buffer.dtype)
            except BaseException as e:  # Handed to whoever waits on the future.
                future.set_exception(e)
                continue
            future.set_result(result)


class CompressedAllReduceState:
    """State of compressed_allreduce_hook: the communicator, codec and error feedback.

    Args:
      comm: an lbcc.Communicator whose ranks are DDP's ranks, in the same order, or a
        torch.distributed group with backend "lbcc" (None: the default group, DDP's own when
        it runs on backend "lbcc"); construct the state on every rank (a collective for a
        group: its lbcc.torch.communicator() is made then).
      codec: "int8", "int4", "bf16", "fp16" or "topk".
      block: elements per scale of int8 / int4.
      top_k, beta, values: the TopK-EF options (values selected per 4096, error decay,
        value coding of the selected entries: "bf16" keeps gradients' small values accurate).
      aggregation: "mean" (the gradient average DDP expects) or, for top-k, "sparseloco".
      start_iter: iterations run densely before compression starts (top-k only).
      timeout: seconds one bucket's exchange may take (default: the communicator's).
    """

    def __init__(self, comm=None, codec="int8", *, block=256, top_k=256, beta=1.0,
                 values="bf16", aggregation="mean", start_iter=None, timeout=None):
        self.comm = backend.communicator(comm)
        self.kind = codec
        if codec in _DENSE:
            self.codec = lbcc.DenseQuantCodec(format=codec, block=block)
            self.start_iter = 0 if start_iter is None else start_iter
        elif codec == "topk":
            self.codec = lbcc.TopKEfCodec(top_k=top_k, beta=beta, lr=1.0, values=values)
            self.start_iter = 2 if start_iter is None else start_iter
        else:
            raise ValueError(f"CompressedAllReduceState: unknown codec {codec!r} "
                             f"(int8, int4, bf16, fp16, topk)")
        self.aggregation = aggregation
        self.timeout = timeout
        self.iteration = 0
        self.calls = 0
        self.states = {}
        self._completer = _Completer()

    def close(self):
        """Stops the helper thread (after the futures already handed out are complete)."""
        self._completer.close()

    def __getstate__(self):
        raise TypeError("CompressedAllReduceState holds a communicator and cannot be pickled")


def _as_rows(flat):
    """A flat bucket as [rows, 64] (zero-padded when needed): TopK-EF chunks a 1-D tensor by the
    largest divisor of its length up to 64, which degenerates for lengths with no such divisor
    (a prime length: chunks of one element, all selected); rows of 64 keep the density at
    top_k / 4096 whatever the bucket's size."""
    n = flat.numel()
    rows = -(-n // 64)
    if n == rows * 64:
        return flat.view(rows, 64)
    padded = torch.zeros(rows * 64, dtype=flat.dtype)
    padded[:n] = flat
    return padded.view(rows, 64)


def compressed_allreduce_hook(state, bucket):
    """DDP communication hook: the mean of the bucket over the ranks, compressed by LBCC."""
    buffer = bucket.buffer()
    grads = buffer.detach().to("cpu", torch.float32).contiguous().view(-1)
    if state.iteration < state.start_iter:
        out = torch.empty_like(grads)
        request = state.comm.all_reduce(grads, out, op="mean", async_op=True,
                                        timeout=state.timeout)
    elif state.kind == "topk":
        grads = _as_rows(grads)
        out = torch.empty_like(grads)
        key = bucket.index()
        ef = state.states.get(key)
        if ef is None or ef.shape != tuple(grads.shape):
            ef = state.codec.new_state()
            ef.reset(tuple(grads.shape))
            state.states[key] = ef
        request = state.comm.sparse_all_reduce([grads], [out], state.codec, [ef],
                                               aggregation=state.aggregation, async_op=True,
                                               timeout=state.timeout)
    else:
        out = torch.empty_like(grads)
        request = state.comm.sparse_all_reduce([grads], [out], state.codec, None,
                                               aggregation="mean", async_op=True,
                                               timeout=state.timeout)
    state.calls += 1
    if bucket.is_last():
        state.iteration += 1
    future = torch.futures.Future()
    state._completer.submit(request, future, out, buffer)
    return future
