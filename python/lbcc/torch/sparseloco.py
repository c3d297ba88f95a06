"""SparseLoCo: the outer optimizer of data parallelism over slow links, through LBCC.

Per replica and parameter tensor, every `inner_steps` inner steps (../shared/reference/
sparseloco.md):
  1. delta = theta_saved - theta_local                     (the pseudo-gradient)
  2. e = beta * e + outer_lr * delta                       (error feedback, in LBCC's codec)
  3. c = Q(TopK_chunked(e)); e = e - D(c)                  (LBCC's TopK-EF codec)
  4. every replica's c reaches every replica; the aggregate g is, per coordinate, the mean over
     the replicas that selected it (or the plain mean / sum), accumulated in rank order so every
     replica gets the same bits (Communicator.sparse_all_reduce)
  5. theta_saved = theta_saved * (1 - outer_lr * weight_decay)   (optional, decoupled)
     theta_saved = theta_saved - g        (or - outer_lr * sign(g) with sign=True)
     theta_local = theta_saved
The outer parameters are kept in fp32 in host memory, whatever the model's dtype and device.

SparseLoCo is a torch.optim.Optimizer: its param_groups are the inner optimizer's (so lr
schedulers such as StepLR drive the inner lr), zero_grad() is the inner one's, and
state_dict()/load_state_dict() hold the inner state, the outer parameters, the error feedback and
the step counters. The replicas are an lbcc.Communicator or a torch.distributed group whose
backend is "lbcc" (None: the default group); see lbcc.torch.communicator.

compat: None (LBCC's rules, the default: k = round(chunk_len * top_k / 4096) per chunk, 1-D
tensors in rows of their largest divisor <= 64, no clipping) or "templar" (templar's trainer:
k = top_k in every chunk, templar's 1-D chunking, and each peer's contribution clipped to the
median of the peers' norms before the mean; ../shared/reference/sparseloco.md, 7b).

overlap (docs/overlap.md): None (the above: step() blocks in the exchange), "delayed" or
"streaming". With overlap the exchange is posted with sparse_all_reduce(async_op=True) (bulk
priority) and runs while the next inner steps compute; its aggregate g is merged `delay` inner
steps after the post (default: "delayed" H, one outer step later, DiLoCoX's and PCCL's
one-step-delayed outer update; "streaming" H // F). Per tensor, besides the agreed outer
parameters theta_global, each replica keeps `start`, the point its not yet posted local progress
is measured from:
  at a post:   delta = start - theta_local; post delta; start = theta_local
  at a merge:  theta_global = theta_global - g             (weight decay / sign as above)
               theta_local  = theta_global + (theta_local - start); start = theta_global
The merge keeps the progress made since the post (theta_local - start) on top of the new global
parameters instead of discarding it, and replaces the replica's own posted progress by the
replicas' aggregate, which already holds it: nothing is applied twice and nothing local is lost.
The error feedback is the codec's, exactly as without overlap: every posted delta enters it once,
at its exchange's encode. That encode, the commit and the rollback run on the communicator's
worker thread, so while an exchange is in flight its states, deltas and outputs are not touched
from Python: error_feedback(), set_error_feedback(), state_dict() and load_state_dict() first
wait for the exchanges in flight (state_dict() then holds their aggregates, to be merged at
their due step after a resume). theta_global changes only at merges, with the same g in the same
order on every replica, so replicas stay bit-identical in their outer parameters.
"streaming" (Streaming DiLoCo) splits each communicator's tensors into F fragments of
consecutive tensors, balanced by elements; fragment f's rounds end at inner steps f*H//F + n*H,
each fragment with its own start, posts and merges, so the link carries a fragment at a time at
1/F of the peak. In one step, deltas are taken first, then due merges run, then posts go out.
"""

import collections
import concurrent.futures
import time

import torch

import lbcc
from lbcc.torch import backend
from lbcc.torch import elastic as elastic_glue

_VALUES_BY_BITS = {2: "binmean2", 4: "binmean4", 8: "binmean8", 16: "bf16", 32: "fp32"}

# compat -> (TopKEfCodec keywords, sparse_all_reduce keywords).
_COMPAT = {
    None: ({}, {}),
    "templar": ({"k_rule": "per_chunk", "chunk_1d": "templar"}, {"clip_to_median_norm": True}),
}


def compat_missing(compat):
    """What this build of lbcc lacks for `compat` (empty when it has everything)."""
    codec_keywords, exchange_keywords = _COMPAT[compat]
    missing = []
    if codec_keywords:
        try:
            lbcc.TopKEfCodec(**codec_keywords)
        except TypeError:
            missing.append("TopKEfCodec(" + ", ".join(f"{k}=" for k in codec_keywords) + ")")
    doc = lbcc.Communicator.sparse_all_reduce.__doc__ or ""
    missing += [f"sparse_all_reduce({k}=)" for k in exchange_keywords if k not in doc]
    return missing


class SparseLoCo(torch.optim.Optimizer):
    """Wraps an inner optimizer; call step() after every inner backward.

    Args:
      inner: any torch optimizer over the model's parameters (AdamW in the paper).
      comm: the replicas that average these parameters: an lbcc.Communicator (e.g. one made by
        split() or lbcc.shard_communicators() for per-shard groups of pipeline replicas), a
        torch.distributed group with backend "lbcc" (dist.new_group(...)), or None for the
        default group; or a list of (params, communicator or group) pairs when groups of
        parameters sync over different communicators (a full replica that takes part in every
        shard).
      inner_steps: H, inner steps per outer step.
      top_k: values selected per 64 x 64 chunk (per 4096 elements), e.g. 64 (1.56 %).
      chunk: the chunk edge target; LBCC's codec implements the reference's 64.
      beta: error-feedback decay. outer_lr: applied to the pseudo-gradient before compression.
      value_bits: 2, 4 or 8 (bin-mean quantizer, 6 sigma), 16 (bf16) or 32 (fp32); or
        `values` naming any LBCC value coding ("absmax8", ...).
      aggregation: "sparseloco" (mean over the replicas that selected a coordinate), "mean"
        (over all replicas) or "sum".
      weight_decay, sign: the reference's optional decoupled decay and sign of the aggregate.
      sync_initial: broadcast the parameters from rank 0 of each communicator first, so every
        replica starts from the same bits.
      timeout: seconds one exchange may take (default: the communicator's).
      compat: None (LBCC's rules) or "templar" (see the module doc).
      overlap: None (blocking outer steps), "delayed" or "streaming" (see the module doc).
      fragments: F, streaming's fragments per communicator (default 2; 1 for "delayed").
      delay: inner steps from an exchange's post to its merge, 1..H (default H for "delayed",
        H // F for "streaming").
    """

    def __init__(self, inner, comm=None, *, inner_steps=15, top_k=64, chunk=64, beta=0.95,
                 outer_lr=1.0, value_bits=2, values=None, aggregation="sparseloco",
                 weight_decay=0.0, sign=False, index_coding="auto", range_sigmas=6.0,
                 sync_initial=True, timeout=None, compat=None, elastic=False, overlap=None,
                 fragments=None, delay=None):
        if chunk != 64:
            raise lbcc.errors.make_error(
                "UNIMPLEMENTED",
                f"SparseLoCo: chunk {chunk}: LBCC's TopK-EF codec chunks with edge 64 (the "
                "reference's); choose top_k to set the density")
        if not isinstance(inner, torch.optim.Optimizer):
            raise TypeError(f"SparseLoCo: inner must be a torch.optim.Optimizer, got "
                            f"{type(inner).__name__}")
        if inner_steps < 1:
            raise ValueError("SparseLoCo: inner_steps must be >= 1")
        if values is None:
            if value_bits not in _VALUES_BY_BITS:
                raise ValueError(f"SparseLoCo: value_bits must be one of {sorted(_VALUES_BY_BITS)}")
            values = _VALUES_BY_BITS[value_bits]
        if aggregation not in ("sparseloco", "mean", "sum"):
            raise ValueError("SparseLoCo: aggregation must be sparseloco, mean or sum")
        if compat not in _COMPAT:
            raise ValueError(f"SparseLoCo: compat must be None or 'templar', got {compat!r}")
        if compat == "templar" and aggregation != "sparseloco":
            raise ValueError("SparseLoCo: compat='templar' aggregates as 'sparseloco' "
                             f"(mean over the selecting peers), got aggregation={aggregation!r}")
        missing = compat_missing(compat)
        if missing:
            raise lbcc.errors.make_error(
                "UNIMPLEMENTED",
                f"SparseLoCo: compat={compat!r} needs {', '.join(missing)}, which this build of "
                "lbcc lacks")
        codec_keywords, self._exchange_keywords = _COMPAT[compat]
        overlap, fragments, delay = _overlap_options(overlap, fragments, delay, inner_steps,
                                                     elastic)
        # What torch.optim.Optimizer.__init__ sets, without copying the inner's param groups:
        # param_groups below is the inner optimizer's list itself.
        torch._C._log_api_usage_once("python.optimizer")
        self.defaults = dict(inner.defaults)
        self._hook_for_profile()
        self.state = collections.defaultdict(dict)
        self._warned_capturable_if_run_uncaptured = True
        self.inner = inner
        self.options = dict(inner_steps=inner_steps, top_k=float(top_k), chunk=chunk,
                            beta=float(beta), outer_lr=float(outer_lr), values=values,
                            aggregation=aggregation, weight_decay=float(weight_decay),
                            sign=bool(sign), index_coding=index_coding,
                            range_sigmas=float(range_sigmas), compat=compat,
                            overlap=overlap, fragments=fragments, delay=delay)
        self.codec = lbcc.TopKEfCodec(top_k=top_k, beta=beta, lr=outer_lr, values=values,
                                      indices=index_coding, range_sigmas=range_sigmas,
                                      **codec_keywords)
        self.timeout = timeout
        # elastic=True: replicas come and go (lbcc.torch.elastic.join makes the group and takes
        # the members' outer parameters); a failed exchange is retried over the next epoch.
        self.elastic = bool(elastic)
        if self.elastic and comm is not None:
            raise ValueError("SparseLoCo(elastic=True): pass comm=None and join with "
                             "lbcc.torch.elastic.join(opt, master_address=..., job_id=...)")
        self.sync_initial = sync_initial and not self.elastic
        if isinstance(comm, (list, tuple)):
            groups = [(list(params), c) for params, c in comm]
        else:
            groups = [([p for g in inner.param_groups for p in g["params"]], comm)]
        self._groups = []
        for params, c in groups:
            self._groups.append({"params": [], "comm": None if self.elastic else _communicator(c),
                                 "outer": [],
                                 "states": []})
            self._add_params(self._groups[-1], params)
        self.inner_step_count = 0
        self.outer_step_count = 0
        # Overlap: per communicator group, the fragments' [begin, end) tensor ranges, and the
        # exchanges in flight or received but not merged yet, in post order.
        self._pending = []
        self._elastic_worker = None
        if overlap is not None:
            for group in self._groups:
                if len(group["params"]) < fragments:
                    raise ValueError(f"SparseLoCo: fragments={fragments} but a communicator "
                                     f"syncs {len(group['params'])} tensors")
                group["fragments"] = _fragment_ranges(group["params"], fragments)
        self.exchanges_posted = 0
        self.exchanges_merged = 0
        # Seconds spent waiting for exchanges in flight (at merges, flush() and the accessors):
        # the part of the overlapped exchanges the inner steps did not hide.
        self.exchange_wait_seconds = 0.0

    @property
    def param_groups(self):
        """The inner optimizer's param groups (lr schedulers set their lr)."""
        return self.inner.param_groups

    @param_groups.setter
    def param_groups(self, groups):
        self.inner.param_groups = groups

    @torch.no_grad()
    def _add_params(self, group, params):
        for p in params:
            if self.sync_initial:
                buf = p.detach().to("cpu", torch.float32).contiguous().clone()
                group["comm"].broadcast(buf, 0, timeout=self.timeout)
                p.copy_(buf)
            outer = p.detach().to("cpu", torch.float32).contiguous().clone()
            state = self.codec.new_state()
            group["params"].append(p)
            if self.options["overlap"] is not None:
                group.setdefault("start", []).append(outer.clone())
            group["outer"].append(outer)
            group["states"].append(state)
            self.state[p] = {"outer": outer, "error_feedback": state}

    def add_param_group(self, param_group):
        """Adds a param group to the inner optimizer; its parameters sync over the (single)
        communicator. Collective when sync_initial: every replica must add the same group."""
        if not hasattr(self, "_groups"):
            raise RuntimeError("SparseLoCo: pass the parameters to the inner optimizer")
        if len(self._groups) != 1:
            raise ValueError("SparseLoCo.add_param_group: this optimizer syncs over several "
                             "communicators; which one the new parameters use is ambiguous")
        if self.options["overlap"] is not None:
            raise ValueError("SparseLoCo.add_param_group: not with overlap (the fragments are "
                             "fixed at construction)")
        before = len(self.inner.param_groups)
        self.inner.add_param_group(param_group)
        params = [p for g in self.inner.param_groups[before:] for p in g["params"]]
        self._add_params(self._groups[0], params)

    def zero_grad(self, set_to_none=True):
        self.inner.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        """One inner step; every `inner_steps`-th call also runs the outer step."""
        loss = self.inner.step(closure)
        self.after_inner_step()
        return loss

    def after_inner_step(self):
        """What step() runs after the inner optimizer's step: counts it, then the outer work
        due (the outer step; with overlap the posts and merges). For trainers that step the
        inner optimizer themselves (to time it, or to project weights in between)."""
        self.inner_step_count += 1
        if self.options["overlap"] is not None:
            self._overlap_step()
        elif self.inner_step_count % self.options["inner_steps"] == 0:
            self.outer_step()

    def _exchange(self, group, deltas, aggregates):
        """The compressed all-reduce of one communicator's pseudo-gradients into `aggregates`.
        The one place an outer step talks to the replicas: an elastic variant (replicas that
        come and go, lbcc.elastic) replaces this method."""
        if group["comm"] is None:
            raise RuntimeError("SparseLoCo(elastic=True): join the elastic group first "
                               "(lbcc.torch.elastic.join(opt, master_address=..., job_id=...))")
        group["comm"].sparse_all_reduce(deltas, aggregates, self.codec, group["states"],
                                        aggregation=self.options["aggregation"],
                                        timeout=self.timeout, **self._exchange_keywords)

    @torch.no_grad()
    def outer_step(self):
        """Pseudo-gradients, compressed exchange through LBCC, outer SGD (see module doc)."""
        o = self.options
        if o["overlap"] is not None:
            raise ValueError("SparseLoCo.outer_step: with overlap, step() posts and merges the "
                             "exchanges (flush() merges those in flight now)")
        for group in self._groups:
            params, outer = group["params"], group["outer"]
            deltas = [(saved - p.detach().to("cpu", torch.float32)).contiguous()
                      for p, saved in zip(params, outer)]
            aggregates = [torch.empty_like(d) for d in deltas]
            self._exchange(group, deltas, aggregates)
            for p, saved, g in zip(params, outer, aggregates):
                if o["weight_decay"]:
                    saved.mul_(1.0 - o["outer_lr"] * o["weight_decay"])
                if o["sign"]:
                    saved.sub_(torch.sign(g).mul_(o["outer_lr"]))
                else:
                    saved.sub_(g)
                p.copy_(saved)
        self.outer_step_count += 1
        if self.elastic:
            elastic_glue.after_outer_step(self)  # the next step's boundary (newcomers' state)

    # --- Overlap (module doc, docs/overlap.md). ---

    def _post(self, group, deltas, aggregates, states):
        """Posts one fragment's exchange; returns what wait() finishes. On a communicator:
        sparse_all_reduce(async_op=True), whose encode, commit and rollback of `states` run on
        the communicator's worker thread. On an elastic group (blocking, retried over new
        epochs): the optimizer's one exchange thread runs it (the call releases the GIL)."""
        if group["comm"] is None:
            raise RuntimeError("SparseLoCo(elastic=True): join the elastic group first "
                               "(lbcc.torch.elastic.join(opt, master_address=..., job_id=...))")
        if self.elastic:
            if self._elastic_worker is None:
                self._elastic_worker = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="sparseloco-exchange")
            return _FutureRequest(self._elastic_worker.submit(
                group["comm"].sparse_all_reduce, deltas, aggregates, self.codec, states,
                aggregation=self.options["aggregation"]))
        return group["comm"].sparse_all_reduce(
            deltas, aggregates, self.codec, states, aggregation=self.options["aggregation"],
            timeout=self.timeout, async_op=True, **self._exchange_keywords)

    @torch.no_grad()
    def _overlap_step(self):
        """After inner step s: take the deltas of the fragments whose round ends at s, merge
        the exchanges due at s, post the taken deltas."""
        o = self.options
        h, s = o["inner_steps"], self.inner_step_count
        posts = []
        for gi, group in enumerate(self._groups):
            nfrag = len(group["fragments"])
            for f, (begin, end) in enumerate(group["fragments"]):
                if (s - f * h // nfrag) % h != 0 or s < f * h // nfrag or s == 0:
                    continue
                deltas = [(start - p.detach().to("cpu", torch.float32)).contiguous()
                          for p, start in zip(group["params"][begin:end],
                                              group["start"][begin:end])]
                posts.append((gi, f, deltas))
        due = [e for e in self._pending if e["due"] <= s]
        for entry in due:
            self._merge(entry)
        merged_fragment0 = any(e["fragment"] == 0 for e in due)
        if self.elastic and merged_fragment0:
            elastic_glue.after_outer_step(self)  # newcomers' state, between two exchanges
        for gi, f, deltas in posts:
            group = self._groups[gi]
            begin, end = group["fragments"][f]
            aggregates = [torch.empty_like(d) for d in deltas]
            request = self._post(group, deltas, aggregates, group["states"][begin:end])
            for p, start in zip(group["params"][begin:end], group["start"][begin:end]):
                start.copy_(p.detach().to("cpu", torch.float32))
            self._pending.append({"group": gi, "fragment": f, "post": s, "due": s + o["delay"],
                                  "request": request, "deltas": deltas,
                                  "aggregates": aggregates})
            self.exchanges_posted += 1

    def _wait(self, entry):
        """Finishes an exchange in flight (raises its error); its aggregate is then readable."""
        request = entry.get("request")
        if request is not None:
            entry["request"] = None
            t0 = time.perf_counter()
            try:
                request.wait()
            finally:
                self.exchange_wait_seconds += time.perf_counter() - t0
            entry["deltas"] = None

    def _drain(self):
        """Waits for every exchange in flight (not merging them): the error-feedback states are
        the caller's again."""
        for entry in list(self._pending):
            self._wait(entry)

    @torch.no_grad()
    def _merge(self, entry):
        o = self.options
        try:
            self._wait(entry)
        finally:
            # A failed exchange is dropped: applied by no replica (its outcome is agreed: every
            # rank commits or every rank rolls its states back), and its error raises here, as
            # a blocking step's would (docs/overlap.md, "Failures").
            self._pending.remove(entry)
        group = self._groups[entry["group"]]
        begin, end = group["fragments"][entry["fragment"]]
        for p, saved, start, g in zip(group["params"][begin:end], group["outer"][begin:end],
                                      group["start"][begin:end], entry["aggregates"]):
            if o["weight_decay"]:
                saved.mul_(1.0 - o["outer_lr"] * o["weight_decay"])
            if o["sign"]:
                saved.sub_(torch.sign(g).mul_(o["outer_lr"]))
            else:
                saved.sub_(g)
            local = p.detach()
            if local.dtype == torch.float32 and local.device.type == "cpu":
                local.sub_(start).add_(saved)  # the same bits as saved + (local - start)
            else:
                p.copy_(saved + (local.to("cpu", torch.float32) - start))
            start.copy_(saved)
        self.exchanges_merged += 1
        if entry["fragment"] == len(group["fragments"]) - 1 and entry["group"] == len(
                self._groups) - 1:
            self.outer_step_count += 1

    @torch.no_grad()
    def flush(self):
        """Merges every exchange in flight now (e.g. at the end of training, so the model holds
        every posted round); no-op without overlap. Every replica must flush at the same step.
        Elastic: the group's boundary follows, as after every merge."""
        merged = bool(self._pending)
        for entry in list(self._pending):
            self._merge(entry)
        if self.elastic and merged:
            elastic_glue.after_outer_step(self)

    def outer_parameters(self):
        """The fp32 outer parameters (theta_saved), in parameter order over all groups."""
        return [t for g in self._groups for t in g["outer"]]

    def error_feedback(self):
        """Copies of the error-feedback buffers (None where a tensor was never exchanged); waits
        for the exchanges in flight (their encode and commit write the buffers)."""
        self._drain()
        return [torch.from_numpy(s.error) if s.initialized else None
                for g in self._groups for s in g["states"]]

    @torch.no_grad()
    def set_error_feedback(self, index, error):
        """Replaces the error-feedback buffer of parameter `index` (parameter order over all
        groups) with `error` (same shape), e.g. projected onto a subspace the next outer step's
        re-projection keeps. The buffer must exist (after the first outer step)."""
        self._drain()
        states = [s for g in self._groups for s in g["states"]]
        outer = self.outer_parameters()
        if tuple(error.shape) != tuple(outer[index].shape):
            raise ValueError(f"SparseLoCo.set_error_feedback: shape {tuple(error.shape)}, "
                             f"parameter {index} has {tuple(outer[index].shape)}")
        if not states[index].initialized:
            raise ValueError(f"SparseLoCo.set_error_feedback: parameter {index} has no error "
                             f"feedback yet (before its first outer step)")
        states[index].load(error.detach().to("cpu", torch.float32).contiguous())

    def state_dict(self):
        """torch's shape (the inner optimizer's "state" and "param_groups") plus "sparseloco":
        the outer parameters, the error feedback, the step counters and the options. With
        overlap also "overlap": each tensor's start and the exchanges posted and not merged yet
        (waited for here: their aggregates, to be merged at their due step after a resume)."""
        state = self.inner.state_dict()
        self._drain()
        state["sparseloco"] = {
            "outer": [t.clone() for t in self.outer_parameters()],
            "error_feedback": self.error_feedback(),
            "inner_step_count": self.inner_step_count,
            "outer_step_count": self.outer_step_count,
            "options": dict(self.options),
        }
        if self.options["overlap"] is not None:
            state["sparseloco"]["overlap"] = {
                "start": [t.clone() for g in self._groups for t in g["start"]],
                "pending": [{"group": e["group"], "fragment": e["fragment"], "post": e["post"],
                             "due": e["due"], "aggregates": [a.clone() for a in e["aggregates"]]}
                            for e in self._pending],
                "exchanges_posted": self.exchanges_posted,
                "exchanges_merged": self.exchanges_merged,
            }
        return state

    @torch.no_grad()
    def load_state_dict(self, state_dict):
        """Restores state_dict()'s result (also the earlier {"inner": ..., "outer": ...} form)."""
        if "sparseloco" in state_dict:
            mine = state_dict["sparseloco"]
            inner = {k: v for k, v in state_dict.items() if k != "sparseloco"}
        elif "inner" in state_dict:
            mine, inner = state_dict, state_dict["inner"]
        else:
            raise ValueError("SparseLoCo.load_state_dict: not a SparseLoCo state dict (no "
                             "'sparseloco' entry)")
        self._drain()
        for key in ("top_k", "beta", "outer_lr", "values", "aggregation", "compat", "overlap",
                    "fragments", "delay"):
            if mine["options"].get(key) != self.options[key]:
                raise ValueError(f"SparseLoCo.load_state_dict: option {key} was "
                                 f"{mine['options'].get(key)!r}, this optimizer has "
                                 f"{self.options[key]!r}")
        outer = self.outer_parameters()
        states = [s for g in self._groups for s in g["states"]]
        if len(mine["outer"]) != len(outer) or len(mine["error_feedback"]) != len(states):
            raise ValueError(f"SparseLoCo.load_state_dict: the state holds {len(mine['outer'])} "
                             f"parameters, this optimizer {len(outer)}")
        for i, (current, saved) in enumerate(zip(outer, mine["outer"])):
            if tuple(saved.shape) != tuple(current.shape):
                raise ValueError(f"SparseLoCo.load_state_dict: parameter {i} has shape "
                                 f"{tuple(saved.shape)} in the state, {tuple(current.shape)} here")
        self.inner.load_state_dict(inner)
        for current, saved in zip(outer, mine["outer"]):
            current.copy_(saved)
        for i, error in enumerate(mine["error_feedback"]):
            if error is None:
                states[i].reset(tuple(outer[i].shape))
            else:
                states[i].load(error.to(torch.float32).contiguous())
        self.inner_step_count = mine["inner_step_count"]
        self.outer_step_count = mine["outer_step_count"]
        if self.options["overlap"] is not None:
            ov = mine["overlap"]
            for current, saved in zip([t for g in self._groups for t in g["start"]], ov["start"]):
                current.copy_(saved)
            self._pending = [{"group": e["group"], "fragment": e["fragment"], "post": e["post"],
                              "due": e["due"], "request": None, "deltas": None,
                              "aggregates": [a.clone() for a in e["aggregates"]]}
                             for e in ov["pending"]]
            self.exchanges_posted = ov["exchanges_posted"]
            self.exchanges_merged = ov["exchanges_merged"]


class _FutureRequest:
    """A concurrent.futures.Future as an lbcc.Request (wait() returns or raises)."""

    def __init__(self, future):
        self._future = future

    def test(self):
        return self._future.done()

    def wait(self, timeout=None):
        return self._future.result(timeout)


def _overlap_options(overlap, fragments, delay, inner_steps, elastic):
    """Checked (overlap, fragments, delay): None/None/None without overlap."""
    if overlap in (None, "none"):
        if fragments not in (None, 1) or delay is not None:
            raise ValueError("SparseLoCo: fragments and delay need overlap='delayed' or "
                             "'streaming'")
        return None, None, None
    if overlap not in ("delayed", "streaming"):
        raise ValueError(f"SparseLoCo: overlap must be None, 'delayed' or 'streaming', got "
                         f"{overlap!r}")
    if overlap == "delayed":
        if fragments not in (None, 1):
            raise ValueError("SparseLoCo: overlap='delayed' syncs the model at once "
                             "(fragments=1); fragments need overlap='streaming'")
        fragments = 1
    fragments = 2 if fragments is None else int(fragments)
    if not 1 <= fragments <= inner_steps:
        raise ValueError(f"SparseLoCo: fragments must be in 1..inner_steps ({inner_steps}), "
                         f"got {fragments}")
    if delay is None:
        delay = inner_steps if overlap == "delayed" else max(1, inner_steps // fragments)
    delay = int(delay)
    if not 1 <= delay <= inner_steps:
        raise ValueError(f"SparseLoCo: delay must be in 1..inner_steps ({inner_steps}), got "
                         f"{delay}")
    if elastic and (fragments != 1 or delay != inner_steps):
        raise ValueError("SparseLoCo(elastic=True): overlap='delayed' with delay=inner_steps "
                         "only (the group's boundary runs between two exchanges)")
    return overlap, fragments, delay


def _fragment_ranges(params, fragments):
    """[begin, end) ranges of consecutive tensors, each non-empty, balanced by elements."""
    sizes = [p.numel() for p in params]
    total = sum(sizes)
    ranges, begin, acc = [], 0, 0
    for f in range(fragments):
        end = begin + 1
        acc += sizes[begin]
        target = total * (f + 1) / fragments
        left = len(sizes) - (fragments - f - 1)  # the later fragments need a tensor each
        while end < left and acc + sizes[end] / 2 <= target:
            acc += sizes[end]
            end += 1
        if f == fragments - 1:
            end = len(sizes)
        ranges.append((begin, end))
        begin = end
    return ranges


def _communicator(comm):
    """An lbcc.Communicator as it is; a dist group (None: the default one) as its communicator."""
    if isinstance(comm, lbcc.Communicator):
        return comm
    if comm is None and not torch.distributed.is_initialized():
        raise ValueError("SparseLoCo: comm is None and torch.distributed has no default group; "
                         "pass an lbcc.Communicator or call init_process_group(backend='lbcc')")
    return backend.communicator(comm)
