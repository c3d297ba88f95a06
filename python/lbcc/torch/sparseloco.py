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
"""

import torch

import lbcc

_VALUES_BY_BITS = {2: "binmean2", 4: "binmean4", 8: "binmean8", 16: "bf16", 32: "fp32"}


class SparseLoCo:
    """Wraps an inner optimizer; call step() after every inner backward.

    Args:
      inner: any torch optimizer over the model's parameters (AdamW in the paper).
      comm: the lbcc.Communicator of the replicas that average these parameters (e.g. one made
        by split() or lbcc.shard_communicators() for per-shard groups of pipeline replicas); or a
        list of (params, communicator) pairs when groups of parameters sync over different
        communicators (a full replica that takes part in every shard).
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
    """

    def __init__(self, inner, comm, *, inner_steps=15, top_k=64, chunk=64, beta=0.95,
                 outer_lr=1.0, value_bits=2, values=None, aggregation="sparseloco",
                 weight_decay=0.0, sign=False, index_coding="auto", range_sigmas=6.0,
                 sync_initial=True, timeout=None):
        if chunk != 64:
            raise lbcc.errors.make_error(
                "UNIMPLEMENTED",
                f"SparseLoCo: chunk {chunk}: LBCC's TopK-EF codec chunks with edge 64 (the "
                "reference's); choose top_k to set the density")
        if inner_steps < 1:
            raise ValueError("SparseLoCo: inner_steps must be >= 1")
        if values is None:
            if value_bits not in _VALUES_BY_BITS:
                raise ValueError(f"SparseLoCo: value_bits must be one of {sorted(_VALUES_BY_BITS)}")
            values = _VALUES_BY_BITS[value_bits]
        if aggregation not in ("sparseloco", "mean", "sum"):
            raise ValueError("SparseLoCo: aggregation must be sparseloco, mean or sum")
        self.inner = inner
        self.options = dict(inner_steps=inner_steps, top_k=float(top_k), chunk=chunk,
                            beta=float(beta), outer_lr=float(outer_lr), values=values,
                            aggregation=aggregation, weight_decay=float(weight_decay),
                            sign=bool(sign), index_coding=index_coding,
                            range_sigmas=float(range_sigmas))
        self.codec = lbcc.TopKEfCodec(top_k=top_k, beta=beta, lr=outer_lr, values=values,
                                      indices=index_coding, range_sigmas=range_sigmas)
        self.timeout = timeout
        if isinstance(comm, (list, tuple)):
            groups = [(list(params), c) for params, c in comm]
        else:
            params = [p for g in inner.param_groups for p in g["params"]]
            groups = [(params, comm)]
        self._groups = []
        for params, c in groups:
            with torch.no_grad():
                if sync_initial:
                    for p in params:
                        buf = p.detach().to("cpu", torch.float32).contiguous().clone()
                        c.broadcast(buf, 0, timeout=timeout)
                        p.copy_(buf)
                outer = [p.detach().to("cpu", torch.float32).contiguous().clone()
                         for p in params]
            states = [self.codec.new_state() for _ in params]
            self._groups.append({"params": params, "comm": c, "outer": outer, "states": states})
        self.inner_step_count = 0
        self.outer_step_count = 0

    @property
    def param_groups(self):
        return self.inner.param_groups

    def zero_grad(self, set_to_none=True):
        self.inner.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        """One inner step; every `inner_steps`-th call also runs the outer step."""
        loss = self.inner.step(closure)
        self.inner_step_count += 1
        if self.inner_step_count % self.options["inner_steps"] == 0:
            self.outer_step()
        return loss

    @torch.no_grad()
    def outer_step(self):
        """Pseudo-gradients, compressed exchange through LBCC, outer SGD (see module doc)."""
        o = self.options
        for group in self._groups:
            params, outer, states = group["params"], group["outer"], group["states"]
            deltas = [(saved - p.detach().to("cpu", torch.float32)).contiguous()
                      for p, saved in zip(params, outer)]
            aggregates = [torch.empty_like(d) for d in deltas]
            group["comm"].sparse_all_reduce(deltas, aggregates, self.codec, states,
                                            aggregation=o["aggregation"], timeout=self.timeout)
            for p, saved, g in zip(params, outer, aggregates):
                if o["weight_decay"]:
                    saved.mul_(1.0 - o["outer_lr"] * o["weight_decay"])
                if o["sign"]:
                    saved.sub_(torch.sign(g).mul_(o["outer_lr"]))
                else:
                    saved.sub_(g)
                p.copy_(saved)
        self.outer_step_count += 1

    def outer_parameters(self):
        """The fp32 outer parameters (theta_saved), in parameter order over all groups."""
        return [t for g in self._groups for t in g["outer"]]

    def error_feedback(self):
        """Copies of the error-feedback buffers (None where a tensor was never exchanged)."""
        return [torch.from_numpy(s.error) if s.initialized else None
                for g in self._groups for s in g["states"]]

    def state_dict(self):
        return {
            "inner": self.inner.state_dict(),
            "outer": [t.clone() for t in self.outer_parameters()],
            "error_feedback": self.error_feedback(),
            "inner_step_count": self.inner_step_count,
            "outer_step_count": self.outer_step_count,
            "options": dict(self.options),
        }

    @torch.no_grad()
    def load_state_dict(self, state):
        for key in ("top_k", "beta", "outer_lr", "values", "aggregation"):
            if state["options"].get(key) != self.options[key]:
                raise ValueError(f"SparseLoCo.load_state_dict: option {key} was "
                                 f"{state['options'].get(key)!r}, this optimizer has "
                                 f"{self.options[key]!r}")
        self.inner.load_state_dict(state["inner"])
        outer = self.outer_parameters()
        states = [s for g in self._groups for s in g["states"]]
        if len(state["outer"]) != len(outer) or len(state["error_feedback"]) != len(states):
            raise ValueError("SparseLoCo.load_state_dict: the number of parameters differs")
        for mine, saved in zip(outer, state["outer"]):
            mine.copy_(saved)
        for i, error in enumerate(state["error_feedback"]):
            if error is None:
                states[i].reset(tuple(outer[i].shape))
            else:
                states[i].load(error.to(torch.float32).contiguous())
        self.inner_step_count = state["inner_step_count"]
        self.outer_step_count = state["outer_step_count"]
