"""One rank of a heterogeneous training run (started by hetero.py; RANK, WORLD_SIZE and
LBCC_BOOTSTRAP_ADDR in the environment). Writes <outdir>/rank<r>.json: per-step loss (head
ranks), cumulative fast/slow bytes this rank sent, bit-identity checks, payload accounting."""

import argparse
import hashlib
import json
import os
import struct
import sys
import time

import torch

import lbcc
from lbcc.torch import PipelineBoundary, SparseLoCo, project_
from lbcc.torch.subspace import shift_embedding_

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import (Data, Stage0, Stage1, make_basis, project_stage0,  # noqa: E402
                   residual_writes)

# Boundary designs of a compressed run (../../shared/reference/subspace.md, "Two designs";
# docs/boundary_modes.md):
#   lossy:       nothing constrained; compressed pipelines send c = U^T (h - T[y]) + ids, T the
#                embedding synced at the last outer step (refreshed after every outer step; the
#                later stage rebuilds it from the sparse change), gradients back as U^T g. Only
#                the compressed replicas lose information; the global model is unconstrained.
#   constrained: Protocol Models: stage 0's residual writes and E kept in span(U) (every inner
#                step on compressed replicas, the H-th included; after every outer step on every
#                replica, with the embedding shift T <- T + (E - E U U^T), E <- E U U^T, and
#                the residual writes' error feedback projected too); the boundary is exact.
MODES = ("lossy", "constrained")


def flat(tensors):
    return torch.cat([t.detach().reshape(-1).to(torch.float32) for t in tensors]).contiguous()


def unflat(buf, tensors):
    i = 0
    for t in tensors:
        n = t.numel()
        t.copy_(buf[i:i + n].view_as(t))
        i += n


class DiLoCo:
    """Dense outer sync: mean pseudo-gradient (fp32 all-reduce per shard), outer Nesterov SGD."""

    def __init__(self, inner, groups, inner_steps, outer_lr=0.7, momentum=0.9, timeout=None):
        self.inner, self.h, self.lr, self.mom, self.timeout = inner, inner_steps, outer_lr, momentum, timeout
        self.groups = []
        with torch.no_grad():
            for params, comm in groups:
                buf = flat(params)
                comm.broadcast(buf, 0, timeout=timeout)
                unflat(buf, params)
                self.groups.append({"params": params, "comm": comm, "outer": flat(params),
                                    "m": torch.zeros_like(buf)})
        self.inner_step_count = 0

    def step(self):
        self.inner.step()
        self.inner_step_count += 1
        if self.inner_step_count % self.h == 0:
            self.outer_step()

    @torch.no_grad()
    def outer_step(self):
        for g in self.groups:
            delta = g["outer"] - flat(g["params"])
            g["comm"].all_reduce(delta, op="mean", timeout=self.timeout)
            g["m"].mul_(self.mom).add_(delta)
            g["outer"].sub_(self.lr * (delta + self.mom * g["m"]))
            unflat(g["outer"], g["params"])

    @torch.no_grad()
    def reset_outer(self):
        for g in self.groups:
            g["outer"].copy_(flat(g["params"]))


def parser():
    """The one argument parser of a run (hetero.py builds the argument lists)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", choices=["ddp", "diloco", "sparseloco"], required=True)
    ap.add_argument("--k", type=int, default=0, help="boundary rank of compressed pipelines; 0: none")
    ap.add_argument("--mode", choices=MODES, default="lossy",
                    help="boundary design of compressed runs")
    ap.add_argument("--constrain-all", action="store_true",
                    help="constrained mode: full replicas project after every inner step too "
                         "(the control: must match compress-all)")
    ap.add_argument("--corpus", choices=["fortunes", "grammar"], default="fortunes")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--inner-steps", type=int, default=10)
    ap.add_argument("--top-k", type=float, default=64)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--topology", required=True)
    ap.add_argument("--outdir", required=True)
    ap.add_argument("--account", action="store_true", help="payload accounting (smoke test)")
    ap.add_argument("--overlap", choices=["none", "delayed", "streaming"], default="none",
                    help="sparseloco: the outer exchange overlapped with the next inner steps "
                         "(docs/overlap.md); uncompressed boundaries only")
    ap.add_argument("--fragments", type=int, default=2, help="--overlap streaming: fragments")
    ap.add_argument("--timeout", type=float, default=float(os.environ.get("LBCC_TIMEOUT_S", 300)))
    ap.add_argument("--bootstrap-port", type=int,
                    help="run on LBCC_BOOTSTRAP_ADDR's host at this port (batch runs)")
    return ap


def main():
    batch = argparse.ArgumentParser(add_help=False)
    batch.add_argument("--runs-file", help="a JSON file: a list of argument lists, one run each, "
                                           "run in this process one after the other")
    b, rest = batch.parse_known_args()
    if b.runs_file:  # torch and LBCC load once for all of them
        with open(b.runs_file) as f:
            runs = json.load(f)
        for argv in runs:
            run(parser().parse_args(argv))
    else:
        run(parser().parse_args(rest))


def run(a):
    overlap = None if a.overlap == "none" else a.overlap
    if overlap and (a.method != "sparseloco" or a.k or a.account):
        # The compressed boundary's table refresh and the constrained design's projections run
        # after each blocking outer step; the payload accounting assumes one too.
        raise SystemExit(f"worker.py: --overlap {a.overlap} takes --method sparseloco with an "
                         "uncompressed boundary (--k 0) and no --account")
    if a.bootstrap_port:
        host = os.environ["LBCC_BOOTSTRAP_ADDR"].rsplit(":", 1)[0]
        os.environ["LBCC_BOOTSTRAP_ADDR"] = f"{host}:{a.bootstrap_port}"
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)

    t_start = time.time()
    comm = lbcc.init(topology=a.topology, timeout=a.timeout)
    rank, topo = comm.rank, comm.topology
    role = topo.role(rank)
    replica = role["replica"]
    kind, stage = role["kind"], role["stage"]
    shards = lbcc.shard_communicators(comm)
    data = Data(a.seq, a.batch, a.corpus)
    vocab = len(data.vocab)
    half = a.layers // 2
    compressed_run = a.k and a.k < a.d
    k = a.k if compressed_run else a.d
    constrained = compressed_run and a.mode == "constrained"
    lossy = compressed_run and a.mode == "lossy"
    basis = make_basis(a.d, k, vocab, seed=7 + a.seed, table=constrained)
    # The model's own table: the constrained design's T; zero otherwise (the lossy boundary
    # keeps its T, the synced embedding, itself).
    table = (torch.from_numpy(basis.table).clone() if constrained and basis.has_table
             else torch.zeros(vocab, a.d))
    holds0 = kind == "full" or stage == 0
    holds1 = kind == "full" or stage == 1
    # Which replicas project stage 0 after every inner step: the constrained design's compressed
    # pipelines (their boundary must stay exact), and with --constrain-all the full ones too.
    project_inner = constrained and holds0 and (kind == "pipeline" or a.constrain_all)
    # The control's full replicas also take the gradient at the stage split as a compressed
    # pipeline's stage 0 gets it, U U^T g: projecting the weights alone leaves the out-of-subspace
    # gradient in AdamW's moments, which changes every coordinate's step size.
    split_u = (torch.from_numpy(basis.u).clone() if constrained and kind == "full" and
               a.constrain_all else None)
    s0 = Stage0(vocab, a.d, a.heads, half, a.seq, table, a.seed) if holds0 else None
    s1 = Stage1(vocab, a.d, a.heads, a.layers - half, a.seed) if holds1 else None
    if constrained and s0 is not None:
        project_stage0(s0, basis)  # the global model starts constrained
    groups = []
    if s0 is not None:
        groups.append((list(s0.parameters()), shards[0]))
    if s1 is not None:
        groups.append((list(s1.parameters()), shards[1]))
    params = [p for ps, _ in groups for p in ps]
    inner = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    boundary = None
    if kind == "pipeline":
        peer = topo.replicas[replica]["ranks"][1 - stage]
        if stage == 0:
            shared = s0.tok.detach().clone()
        else:
            # The later stage's copy of the synced embedding, from the same seed (and projection)
            # as every stage-0 holder's initial E (SparseLoCo broadcasts rank 0's, which is the
            # same): no traffic. A mismatch shows as differing basis ids in the identity check.
            ref = Stage0(vocab, a.d, a.heads, half, a.seq, table, a.seed)
            if constrained:
                project_stage0(ref, basis)
            shared = ref.tok.detach().clone()
            del ref
        boundary = PipelineBoundary(comm, peer, basis, mode=a.mode if compressed_run else "lossy",
                                    table=shared if compressed_run else None,
                                    coefficient_dtype="f32", timeout=a.timeout)
        if lossy:
            basis = boundary.refresh_table()  # T = the initial synced embedding, on both stages
    # The evaluation boundary of a pipeline replica 0: dense (k = d), so the global model is
    # evaluated as it is, unconstrained.
    eval_boundary = None
    if kind == "pipeline" and replica == 0:
        eval_boundary = PipelineBoundary(comm, peer, make_basis(a.d, a.d, vocab), tag=1,
                                         coefficient_dtype="f32", timeout=a.timeout)
    if a.method == "sparseloco":
        opt = SparseLoCo(inner, groups, inner_steps=a.inner_steps, top_k=a.top_k, beta=0.95,
                         outer_lr=1.0, value_bits=2, timeout=a.timeout, overlap=overlap,
                         fragments=a.fragments if overlap == "streaming" else None)
    elif a.method == "diloco":
        opt = DiLoCo(inner, groups, a.inner_steps, timeout=a.timeout)
    else:
        opt = None
        with torch.no_grad():
            for ps, c in groups:
                buf = flat(ps)
                c.broadcast(buf, 0, timeout=a.timeout)
                unflat(buf, ps)

    excluded = {"fast_sent": 0, "slow_sent": 0, "fast_received": 0, "slow_received": 0}

    def counters():
        b = comm.bytes_by_class()
        return {key: b[key] - excluded[key] for key in excluded}

    def excluding(fn):
        before = comm.bytes_by_class()
        result = fn()
        after = comm.bytes_by_class()
        for key in excluded:
            excluded[key] += after[key] - before[key]
        return result

    def identical():
        """True when every rank of each shard holds the same bits of that shard's parameters,
        and every rank that uses the basis holds the same basis (constrained: every rank; lossy:
        the compressed pipelines' stages, the only ones with a boundary table)."""
        ok = True
        uses_basis = constrained or (lossy and kind == "pipeline")
        mine = struct.pack("<?QI", uses_basis, basis.hash, basis.version)
        ids = {b for b in comm.all_gather_bytes(mine, timeout=a.timeout) if b[0]}
        ok &= len(ids) <= 1
        for ps, c in groups:
            digest = hashlib.sha256(flat(ps).numpy().tobytes()).digest()
            ok &= len(set(c.all_gather_bytes(digest, timeout=a.timeout))) == 1
        return ok

    index_of = {id(p): i for i, p in enumerate(params)}

    def after_outer():
        """The boundary's work after an outer step; returns the table-update bytes sent."""
        nonlocal basis
        sent = 0
        with torch.no_grad():
            if constrained and s0 is not None:
                # Every replica: residual writes (not E: the shift moves its out-of-subspace
                # part into T instead) back onto span(U), and their error feedback too, since
                # the next projection would drop what it holds outside span(U).
                project_stage0(s0, basis, embedding=False)
                feedback = opt.error_feedback()
                for tensor, side in residual_writes(s0):
                    i = index_of[id(tensor)]
                    if feedback[i] is not None:
                        opt.set_error_feedback(i, project_(feedback[i], basis, side))
            if boundary is not None:
                # Stage 0 sends the synced embedding's changed elements; stage 1 applies them
                # to its copy; both compute the next basis (lossy: T = E; constrained: the
                # shift, applied in place to stage 0's E).
                before = boundary.table_bytes_sent
                basis = boundary.sync_table(s0.tok.data if s0 is not None else None)
                sent = boundary.table_bytes_sent - before
                if constrained and s0 is not None:
                    s0.table.copy_(torch.from_numpy(basis.table))
            elif constrained:
                basis = shift_embedding_(basis, s0.tok, s0.table)
            if constrained:
                # Every replica takes the projected, shifted weights as its outer parameters.
                for p, o in zip(params, opt.outer_parameters()):
                    o.copy_(p)
        return sent

    excluding(comm.barrier)
    base = counters()
    # The pipeline stage link's own bytes, so data-parallel slow-link bytes can be told apart.
    stage_peer = topo.replicas[replica]["ranks"][1 - stage] if kind == "pipeline" else None
    stage_base = comm.link_counters(stage_peer)["bytes_sent"] if stage_peer is not None else 0
    stream = data.stream(replica, a.seed)
    tokens = a.batch * a.seq
    log = {"rank": rank, "kind": kind, "stage": stage, "replica": replica, "steps": [],
           "mode": a.mode if compressed_run else None, "seed": a.seed,
           "constrain_all": bool(a.constrain_all), "vocab": vocab,
           "identical": [], "payload": {"boundary_sent": 0, "sparse_sent": 0, "table_sent": 0}}
    slow_peers = {}
    for r in range(comm.nranks):
        if r != rank:
            slow_peers[r] = topo.link(rank, r) == "slow"
    t_train = time.time()
    cpu_train = time.process_time()
    # Compute utilization: the inner steps' wall time (batch, forward, backward with the
    # pipeline boundary's messages, inner optimizer, projections) and the training thread's CPU
    # time in them, over the training's wall time; the outer steps (exchanges and waits), DDP's
    # all-reduces and the identity checks count as not computing.
    compute_s = compute_cpu_s = checks_s = 0.0
    for step in range(1, a.steps + 1):
        t_step, cpu_step = time.perf_counter(), time.thread_time()
        lr = a.lr * min(1.0, step / 20)
        for g in inner.param_groups:
            g["lr"] = lr
        x, y = next(stream)
        inner.zero_grad(set_to_none=True)
        loss = None
        if kind == "full":
            h = s0(x)
            if split_u is not None:
                h.register_hook(lambda g: (g @ split_u) @ split_u.t())
            loss = s1(h, y)
            loss.backward()
        elif stage == 0:
            h = s0(x)
            boundary.send(h, x).backward()
            boundary.synchronize()
            log["payload"]["boundary_sent"] += boundary.codec.forward_payload_bytes(tokens)
        else:
            h, _ = boundary.recv(tokens)
            loss = s1(h.view(a.batch, a.seq, a.d), y)
            loss.backward()
            boundary.synchronize()
            log["payload"]["boundary_sent"] += boundary.codec.backward_payload_bytes(tokens)
        outer_now = step % a.inner_steps == 0
        if opt is None:  # dense DDP: mean gradient per shard every step
            compute_s += time.perf_counter() - t_step
            compute_cpu_s += time.thread_time() - cpu_step
            with torch.no_grad():
                for ps, c in groups:
                    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in ps]
                    buf = flat(grads)
                    c.all_reduce(buf, op="mean", timeout=a.timeout)
                    unflat(buf, grads)
                    for p, gr in zip(ps, grads):
                        p.grad = gr
            t_step, cpu_step = time.perf_counter(), time.thread_time()
            inner.step()
            compute_s += time.perf_counter() - t_step
            compute_cpu_s += time.thread_time() - cpu_step
        elif overlap:
            inner.step()
            compute_s += time.perf_counter() - t_step
            compute_cpu_s += time.thread_time() - cpu_step
            opt.after_inner_step()  # posts and merges; waits only for a late exchange
        else:
            inner.step()
            if project_inner:
                project_stage0(s0, basis)  # every inner step, the H-th included
            compute_s += time.perf_counter() - t_step
            compute_cpu_s += time.thread_time() - cpu_step
            opt.inner_step_count += 1
            if outer_now:
                if a.account and a.method == "sparseloco":
                    log["payload"]["sparse_sent"] += sparse_payload(opt, groups, slow_peers)
                opt.outer_step()
                if compressed_run:
                    update = after_outer()
                    log["payload"]["boundary_sent"] += update
                    log["payload"]["table_sent"] += update
        if outer_now and not overlap:
            # (With overlap an exchange is in flight here: a check on the same communicator
            # would queue behind it and wait. The outer parameters are checked after flush().)
            t_check = time.perf_counter()
            log["identical"].append([step, bool(excluding(identical))])
            checks_s += time.perf_counter() - t_check
        c = counters()
        log["steps"].append([step, None if loss is None else float(loss),
                             c["fast_sent"] - base["fast_sent"], c["slow_sent"] - base["slow_sent"]])
        if rank == 0 and (step % max(1, a.steps // 10) == 0 or step == a.steps):
            print(f"  step {step}/{a.steps} loss {float(loss) if loss is not None else float('nan'):.3f} "
                  f"rank-0 slow-link MB {(c['slow_sent'] - base['slow_sent']) / 1e6:.2f} "
                  f"({time.time() - t_train:.0f} s)", flush=True)
    if overlap:
        opt.flush()  # the exchanges in flight, merged
        with torch.no_grad():
            for p, o in zip(params, opt.outer_parameters()):
                p.copy_(o)  # the global model (each replica's own progress since its last post
                # is not in it), for the checks and the evaluation
    log["train_seconds"] = time.time() - t_train
    log["train_cpu_seconds"] = time.process_time() - cpu_train
    wall = log["train_seconds"] - checks_s
    log["utilization"] = {"compute_seconds": compute_s, "compute_cpu_seconds": compute_cpu_s,
                          "wall_seconds": wall, "util": compute_s / wall if wall > 0 else None,
                          "cpu_util": compute_cpu_s / wall if wall > 0 else None}
    log["overlap"] = a.overlap
    if overlap:
        log["identical"].append([a.steps, bool(excluding(identical))])
    log["basis"] = [basis.hash, basis.version]
    # What the authors' code would have moved for the same refreshes: the dense V x d fp32
    # table to the later stage after every outer step.
    log["table_dense_equivalent"] = (4 * vocab * a.d * (a.steps // a.inner_steps)
                                     if compressed_run and kind == "pipeline" and stage == 0
                                     else 0)
    total = counters()
    log["final_counters"] = {key: total[key] - base[key] for key in total}
    stage_sent = (comm.link_counters(stage_peer)["bytes_sent"] - stage_base
                  if stage_peer is not None else 0)
    log["final_counters"]["stage_sent"] = stage_sent
    # Everything else this rank sent on slow links is data-parallel synchronisation (and the
    # small world-communicator bookkeeping).
    stage_slow = stage_peer is not None and topo.link(rank, stage_peer) == "slow"
    log["final_counters"]["dp_slow_sent"] = (log["final_counters"]["slow_sent"] -
                                             (stage_sent if stage_slow else 0))
    log["final_counters"]["stage_slow"] = bool(stage_slow)
    if kind == "pipeline" and a.account:
        log["stage_link"] = comm.link_counters(stage_peer)
    # Held-out loss of the global model (after the last outer step every replica holds the
    # same bits), uncompressed, outside the byte counts: replica 0 evaluates it, in one process
    # (a full replica) or through its dense evaluation boundary (a pipeline). The first
    # compressed pipeline also evaluates it through its compressed boundary (what that replica
    # computes), for comparison.
    first_pipe = min(i for i, r in enumerate(topo.replicas) if r["kind"] == "pipeline")

    def evaluate(through):
        losses = []
        for xe, ye in data.held_out():
            if kind == "full":
                losses.append(float(s1(s0(xe), ye)))
            elif stage == 0:
                through.send(s0(xe), xe)
                through.synchronize()
            else:
                he, _ = through.recv(tokens)
                losses.append(float(s1(he.view(a.batch, a.seq, a.d), ye)))
        return sum(losses) / len(losses) if losses else None

    with torch.no_grad():
        log["eval_loss"] = (excluding(lambda: evaluate(eval_boundary)) if replica == 0
                            else None)
        log["eval_loss_boundary"] = (excluding(lambda: evaluate(boundary))
                                     if compressed_run and replica == first_pipe else None)
    log["setup_seconds"] = t_train - t_start
    log["run_seconds"] = time.time() - t_start
    with open(os.path.join(a.outdir, f"rank{rank}.json"), "w") as f:
        json.dump(log, f)
    excluding(comm.barrier)
    for c in shards.values():
        c.close()
    comm.close()


def sparse_payload(opt, groups, slow_peers):
    """Bytes this rank's sparse payloads will put on slow links in the coming outer step
    (direct exchange: each shard member's payload goes to every other member): the codec
    encodes each pseudo-gradient with a copy of its error-feedback state."""
    total = 0
    feedback = opt.error_feedback()
    outer = opt.outer_parameters()
    i = 0
    for ps, c in groups:
        size = 0
        for p in ps:
            state = opt.codec.new_state()
            if feedback[i] is not None:
                state.load(feedback[i].contiguous())
            delta = (outer[i] - p.detach()).contiguous()
            size += len(opt.codec.encode(delta, state, commit=False))
            i += 1
        slow = sum(1 for g in c.global_ranks if g != c.global_rank and slow_peers.get(g))
        total += size * slow
    return total


if __name__ == "__main__":
    main()
