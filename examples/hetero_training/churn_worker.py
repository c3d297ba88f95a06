"""One rank of a churn run (hetero.py --churn): the "hetero" layout (ranks 0 and 1 full
replicas, ranks 2 -> 3 a two-stage pipeline replica) with data parallelism over elastic groups,
one per shard (lbcc.torch.SparseLoCo(elastic=True), lbcc.torch.elastic.join; docs/elastic.md),
so a pipeline stage can be killed and restarted while the others keep training.

- Rank 0 hosts the two membership services (lbcc.ElasticMaster, one job per shard: shard 0 =
  every full replica + stage 0 of the pipeline, shard 1 = every full replica + stage 1), which
  share one lbcc.ElasticUnits, and is never killed. The stages join their shard's job as stage
  0 and 1 of pipeline replica "pipe<replica>" (replica=, stage=, replica_stages=), so the
  services treat the pipeline replica as a unit ("Pipeline replicas as units" in
  docs/elastic.md).
- The pipeline's stages talk over a communicator of their own (two ranks, one per incarnation of
  the pair). When a stage dies, its service takes the whole pipeline replica out of both
  shards' groups at once: the full replicas' exchange in flight retries over the new epoch, and
  the surviving stage is told: its group call raises FailedPreconditionError with
  lbcc.elastic.replica_left(e), or, when its stage link failed first (during inner steps),
  group.replica_left_error() returns that error. The survivor never leaves by itself unless the
  service still counts it a member after that wait (the stage link failed, not the stage).
- The survivor then re-forms the stage link with the restarted stage and both join again: the
  services hold them until both stages are back and admit them together at one outer step;
  each receives its shard's outer parameters there (checked by XXH3 against every member's),
  its error feedback and inner optimizer start at zero.
- The restarted stage (--incarnation N) is a fresh process: it rebuilds the model (the basis
  from the run's seed), joins, and starts at the job's committed step.

Writes <outdir>/rank<r>.<incarnation>.json: per inner step (global step, loss on head ranks,
shard sizes), per committed outer step each shard's parameter hash (sha256 of the outer
parameters), the exchange's epoch and the group's epoch and size after the next boundary
(compared across the members by check_churn.py), joins (the outer step and epoch of each
admission) and membership events (with `replica_left` for the
survivor's notice)."""

import hashlib
import json
import os
import struct
import sys
import threading
import time

import torch

import lbcc
import lbcc.torch.elastic as elastic_glue
from lbcc import errors
from lbcc.torch import PipelineBoundary, SparseLoCo

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Data, Stage0, Stage1, make_basis, project_stage0  # noqa: E402
from worker import parser as run_parser  # noqa: E402


def parser():
    ap = run_parser()
    ap.add_argument("--master-host", required=True, help="the membership services' host (rank 0)")
    ap.add_argument("--master-ports", required=True, help="P0,P1: one service per shard")
    ap.add_argument("--pair-port", type=int, required=True,
                    help="bootstrap port of the pipeline pair's first incarnation (+N for the "
                         "Nth)")
    ap.add_argument("--incarnation", type=int, default=0, help="restarts of this rank so far")
    ap.add_argument("--pair-index", type=int, default=0,
                    help="the pipeline pair's incarnation this process starts in (restarts of "
                         "either stage so far)")
    ap.add_argument("--job", default="hetero-churn")
    ap.add_argument("--pair-timeout", type=float, default=20.0,
                    help="seconds a stage-link operation may take before the peer counts as lost")
    ap.add_argument("--hold", help="a restarted rank: start (interpreter, torch, lbcc loaded) "
                                   "and wait until this file exists before taking part")
    return ap


class StageLinkLost(Exception):
    """The link to the pipeline's other stage failed (inner steps): ask the service why."""


class ReplicaLeft(Exception):
    """The membership service took this stage's pipeline replica out (`error`: what it said)."""

    def __init__(self, error, where):
        super().__init__(str(error))
        self.error, self.where = error, where


def role_of(topo, rank):
    for i, rep in enumerate(topo["replicas"]):
        if rep["kind"] == "full" and rep["rank"] == rank:
            return i, "full", None
        if rep["kind"] == "pipeline" and rank in rep["stages"]:
            return i, "pipeline", rep["stages"].index(rank)
    raise ValueError(f"rank {rank} has no replica in the topology")


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main():
    a = parser().parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    topo = json.load(open(a.topology))
    replica, kind, stage = role_of(topo, rank)
    ports = [int(p) for p in a.master_ports.split(",")]
    jobs = [f"{a.job}-shard{s}" for s in (0, 1)]
    fulls = sum(1 for rep in topo["replicas"] if rep["kind"] == "full")
    pipes = len(topo["replicas"]) - fulls
    unit = f"pipe{replica}" if kind == "pipeline" else None
    name = f"rank{rank}.{a.incarnation}"
    t_start = time.time()
    log = {"rank": rank, "kind": kind, "stage": stage, "replica": replica, "unit": unit,
           "name": name, "incarnation": a.incarnation, "pid": os.getpid(), "steps": [],
           "outer": [], "events": [], "joins": [], "eval_loss": None}
    out_path = os.path.join(a.outdir, f"rank{rank}.{a.incarnation}.json")
    with open(os.path.join(a.outdir, f"rank{rank}.{a.incarnation}.pid"), "w") as f:
        f.write(str(os.getpid()))  # hetero.py --churn kills this process by its pid

    cur = {"step": None}

    def save():
        with open(out_path + ".tmp", "w") as f:
            json.dump(log, f)
        os.replace(out_path + ".tmp", out_path)

    def event(step, what, **fields):
        """A membership event at `step` (None: this process's last step, if it had one)."""
        step = cur["step"] if step is None else step
        log["events"].append(dict(fields, time=time.time(), step=step, what=what))
        print(f"  [rank {rank}.{a.incarnation}] step {step}: {what}", flush=True)
        save()  # a killed process keeps what it saw

    masters = []
    if rank == 0:
        # One ElasticUnits for both shards' services: a stage that leaves takes its whole
        # pipeline replica out of both groups, and the replica is admitted back as a unit.
        units = lbcc.ElasticUnits()
        masters = [lbcc.ElasticMaster(jobs[s], listen=f"{a.master_host}:{ports[s]}",
                                      min_members=fulls + pipes, bootstrap_host=a.master_host,
                                      units=units)
                   for s in (0, 1)]
        with open(os.path.join(a.outdir, "masters.ready"), "w") as f:
            f.write("\n".join(m.address for m in masters) + "\n")

    data = Data(a.seq, a.batch, a.corpus)
    vocab = len(data.vocab)
    half = a.layers // 2
    compressed = bool(a.k) and a.k < a.d
    if compressed and a.mode != "constrained":
        sys.exit("churn_worker: a compressed churn run takes --mode constrained, with a fixed "
                 "basis (after each outer step every member re-projects stage 0's residual "
                 "writes and E: T never changes, so a restarted stage rebuilds the basis from "
                 "the seed; a refreshed table's versions would have to travel with the shared "
                 "state)")
    basis = make_basis(a.d, a.k if compressed else a.d, vocab, seed=7 + a.seed)
    table = torch.from_numpy(basis.table).clone() if basis.has_table else torch.zeros(vocab, a.d)
    holds = [kind == "full" or stage == 0, kind == "full" or stage == 1]
    tokens = a.batch * a.seq
    progress = os.path.join(a.outdir, "progress") if rank == 0 else None
    H = a.inner_steps

    def build():
        """Fresh model parts, one inner AdamW and one elastic SparseLoCo per shard held."""
        s0 = Stage0(vocab, a.d, a.heads, half, a.seq, table, a.seed) if holds[0] else None
        s1 = Stage1(vocab, a.d, a.heads, a.layers - half, a.seed) if holds[1] else None
        if compressed and s0 is not None:
            project_stage0(s0, basis)
        opts = {}
        for s, part in enumerate((s0, s1)):
            if part is not None:
                inner = torch.optim.AdamW(part.parameters(), lr=a.lr, betas=(0.9, 0.95),
                                          weight_decay=0.0)
                opts[s] = SparseLoCo(inner, elastic=True, inner_steps=H, top_k=a.top_k,
                                     beta=0.95, outer_lr=1.0, value_bits=2, timeout=a.timeout)
        return s0, s1, opts

    def join(opts):
        """Joins each shard held; a stage as stage `stage` of pipeline replica `unit` (its
        service holds it until every stage of the replica is back)."""
        groups, received = {}, 0
        unit_options = ({} if unit is None else
                        dict(replica=unit, stage=stage, replica_stages=2))
        for s in sorted(opts):
            groups[s] = elastic_glue.join(opts[s], master_address=f"{a.master_host}:{ports[s]}",
                                          job_id=jobs[s], name=name, op_timeout=a.timeout,
                                          join_timeout=3 * a.timeout,  # a loaded start-up
                                          **unit_options)
            received += groups[s].stats["state_bytes_received"]
        return groups, received

    def adapt(s0, opts):
        """The `project` adaptation after an outer step (every member; a newcomer after its
        first boundary, whose received outer parameters are the members' before theirs)."""
        if compressed and s0 is not None:
            with torch.no_grad():
                project_stage0(s0, basis)
                for p, o in zip(s0.parameters(), opts[0].outer_parameters()):
                    o.copy_(p)

    def record_outer(groups, opts, step):
        for s, g in groups.items():
            # epoch: the exchange's; epoch_after, size_after: the group's after the next
            # step's boundary (where newcomers admitted at this commit received the state).
            log["outer"].append({"shard": s, "committed": g.step, "step": step,
                                 "hash": digest(opts[s].outer_parameters()),
                                 "epoch": g.exchange_epoch, "epoch_after": g.epoch,
                                 "size_after": g.size})
            for msg in g.membership_changes:
                event(step, f"shard {s}: retried: {msg}", retried=True, shard=s)
            g.membership_changes.clear()
        save()  # a member killed later still shows the steps it committed

    def pair_comm(incarnation):
        """The pipeline pair's communicator of this incarnation (two ranks, stage 0 the root)."""
        os.environ.update(RANK=str(stage), WORLD_SIZE="2",
                          LBCC_BOOTSTRAP_ADDR=f"{os.environ['HETERO_PAIR_HOST']}:"
                                              f"{a.pair_port + incarnation}")
        deadline = time.time() + a.timeout
        while True:
            try:
                return lbcc.init(timeout=a.pair_timeout)
            except (errors.DeadlineExceededError, errors.UnavailableError) as e:
                if time.time() > deadline:
                    raise
                event(None, f"waiting for the other stage ({type(e).__name__}: {str(e)[:300]})")

    def group_calls(fn, where):
        """Runs `fn` (group calls); the replica's departure raises ReplicaLeft."""
        try:
            return fn()
        except errors.FailedPreconditionError as e:
            if kind == "pipeline" and lbcc.elastic.replica_left(e):
                raise ReplicaLeft(e, where) from e
            raise

    def pair_barrier(pair, what):
        try:
            return pair.all_gather_bytes(what, timeout=a.pair_timeout)
        except errors.Error as e:
            raise StageLinkLost(f"stage link: {type(e).__name__}: {e}") from e

    incarnation = a.pair_index  # of the pipeline pair: +1 each time it re-forms
    first_session = True
    while True:
        s0, s1, opts = build()
        if a.hold:  # ready (corpus, basis, model built); hetero.py creates it at the restart
            while not os.path.exists(a.hold):
                time.sleep(0.02)
            a.hold = None
        pair = boundary = None
        if kind == "pipeline":
            pair = pair_comm(incarnation)
            boundary = PipelineBoundary(pair, 1 - stage, basis, coefficient_dtype="f32",
                                        timeout=a.pair_timeout)
            event(None, f"pipeline pair {incarnation} up")
        groups = {}
        try:
            groups, received = group_calls(lambda: join(opts), "join")
            step0 = groups[min(groups)].step
            log["joins"].append({"step": step0 * H, "outer_step": step0,
                                 "epochs": {s: g.epoch for s, g in groups.items()},
                                 "sizes": {s: g.size for s, g in groups.items()},
                                 "state_bytes_received": received,
                                 "state_bytes": sum(g.stats["state_bytes"]
                                                    for g in groups.values())})
            if pair is not None:
                # The services admit a pipeline replica's stages at one outer step (each in
                # its shard's job): a difference would be the library's bug, not churn.
                steps = [struct.unpack("<Q", b)[0] for b in
                         pair_barrier(pair, struct.pack("<Q", step0))]
                if len(set(steps)) != 1:
                    raise RuntimeError(f"the stages were admitted at different outer steps "
                                       f"{steps}")
            if step0 > 0 and 0 in opts:
                adapt(s0, opts)  # the members projected after sending the state
            if not first_session or a.incarnation:
                event(step0 * H, f"joined at outer step {step0} (" +
                      ", ".join(f"shard {s}: epoch {g.epoch}, {g.size} members"
                                for s, g in groups.items()) +
                      f"), shared state received {received} B", joined=True,
                      outer_step=step0)
            stream = data.stream(replica, a.seed + 101 * incarnation)
            for step in range(step0 * H + 1, a.steps + 1):
                cur["step"] = step
                lr = a.lr * min(1.0, step / 20)
                for opt in opts.values():
                    for pg in opt.param_groups:
                        pg["lr"] = lr
                x, y = next(stream)
                for opt in opts.values():
                    opt.zero_grad(set_to_none=True)
                loss = None
                try:
                    if kind == "full":
                        loss = s1(s0(x), y)
                        loss.backward()
                    elif stage == 0:
                        boundary.send(s0(x), x).backward()
                        boundary.synchronize()
                    else:
                        h, _ = boundary.recv(tokens)
                        loss = s1(h.view(a.batch, a.seq, a.d), y)
                        loss.backward()
                        boundary.synchronize()
                except errors.Error as e:
                    if kind != "pipeline":
                        raise
                    raise StageLinkLost(f"stage link: {type(e).__name__}: {e}") from e

                def outer():
                    for s in sorted(opts):  # shard 0's outer step first, on every member
                        opts[s].step()  # every H-th: the elastic exchange, then the boundary
                group_calls(outer, f"the outer step at step {step}" if step % H == 0 else
                            f"step {step}")
                if step % H == 0:
                    adapt(s0, opts)
                    record_outer(groups, opts, step)
                elif compressed and kind == "pipeline" and stage == 0:
                    project_stage0(s0, basis)
                log["steps"].append([step, None if loss is None else float(loss)] +
                                    [groups[s].size if s in groups else None for s in (0, 1)])
                if progress:
                    with open(progress + ".tmp", "w") as f:
                        f.write(str(step))
                    os.replace(progress + ".tmp", progress)
                if rank == 0 and (step % max(1, a.steps // 10) == 0 or step == a.steps):
                    print(f"  step {step}/{a.steps} loss {float(loss):.3f} shard sizes "
                          f"{groups[0].size}, {groups[1].size} ({time.time() - t_start:.0f} s)",
                          flush=True)
            if pair is not None:
                # Both stages are past their last group call before either leaves (a stage's
                # leave takes the replica out, which would fail the other's last exchange).
                pair_barrier(pair, b"done")
            break
        except (StageLinkLost, ReplicaLeft) as e:
            if isinstance(e, StageLinkLost):
                event(None, f"lost the link to the other stage ({e}): asking the service")
                # The service takes the replica out when the other stage is gone (a killed
                # process at once, a silent one after the peer timeout); this stage makes no
                # group call meanwhile.
                told = groups[min(groups)].replica_left_error(a.timeout) if groups else None
                if told is None:
                    # Still a member: the link failed, not the stage; leaving takes the replica
                    # out, and both stages come back as for a departure.
                    event(None, "still a member after the wait: leaving (takes the replica out)")
                elif not lbcc.elastic.replica_left(told):
                    raise told
                else:
                    event(None, f"told replica_left (replica_left_error): {told}",
                          replica_left=True, via="replica_left_error")
            else:
                event(None, f"told replica_left ({e.where}): {e.error}", replica_left=True,
                      via="group call")
            for g in groups.values():
                try:
                    g.leave()  # out already (told); else this takes the replica out
                except errors.Error:
                    pass
            save()
            if pair is not None:  # closing endpoints to a dead peer may take its timeout
                threading.Thread(target=pair.close, daemon=True).start()
            incarnation += 1
            first_session = False

    if kind == "full":
        with torch.no_grad():
            losses = [float(s1(s0(xe), ye)) for xe, ye in data.held_out()]
        log["eval_loss"] = sum(losses) / len(losses)
    log["run_seconds"] = time.time() - t_start
    log["final"] = {s: {"committed": g.step, "hash": digest(opts[s].outer_parameters())}
                    for s, g in groups.items()}
    save()
    if rank == 0:
        # The services stay up until every other member has left.
        deadline = time.time() + 120
        while any(m.members > 1 for m in masters) and time.time() < deadline:
            time.sleep(0.1)
    for g in groups.values():
        try:
            g.leave()
        except errors.Error as e:
            if not (kind == "pipeline" and lbcc.elastic.replica_left(e)):
                raise  # the other stage's leave took the replica out first: expected
    for m in masters:
        m.stop()
    if pair is not None:
        pair.close()


if __name__ == "__main__":
    main()
