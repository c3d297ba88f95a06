"""Checks of a churn run (churn_smoke_test.sh, `hetero.py --churn`), from the ranks' JSON logs
(churn_worker.py) and the driver's summary: a pipeline stage was killed and restarted; the
membership services took the whole pipeline replica out (the surviving stage was told
replica_left, it did not leave by itself) and admitted it back as a unit (both stages at one
outer step, each shard's group without the replica over the same outer steps); every committed
outer step has one parameter hash, epoch and size on every member of its epoch; the final
parameters are identical on every member, the restarted stage included; loss keeps decreasing.

`analyse(rundir)` is also what hetero.py's churn table shows."""

import csv
import json
import os
import re
import sys


def load_logs(rundir):
    logs = []
    for fn in sorted(os.listdir(rundir)):
        if re.fullmatch(r"rank(\d+)\.(\d+)\.json", fn):
            with open(os.path.join(rundir, fn)) as f:
                logs.append(json.load(f))
    return logs


def analyse(rundir, driver_events):
    """The unit behaviour as the logs show it. Per (shard, committed outer step): the members'
    records (parameter hash, the exchange's epoch); per shard: the runs of committed steps
    without the pipeline replica (fewer members logged the step than the full count: the
    exchange's members); the surviving stages' notices; the stages' rejoins."""
    logs = load_logs(rundir)
    fulls = sum(1 for lg in logs if lg["kind"] == "full" and lg["incarnation"] == 0)
    pipes = len({lg["replica"] for lg in logs if lg["kind"] == "pipeline"})
    full_size = fulls + pipes
    records = {}
    for lg in logs:
        for o in lg["outer"]:
            records.setdefault((o["shard"], o["committed"]), []).append(
                {"name": lg["name"], "hash": o["hash"], "epoch": o["epoch"],
                 "epoch_after": o["epoch_after"], "size_after": o["size_after"],
                 "step": o["step"]})
    # A killed member may die between a commit and its log of it: its last logged step.
    killed = {e["killed"] for e in driver_events if e.get("killed")}
    last_of = {}
    for lg in logs:
        if lg["name"] in killed:
            for o in lg["outer"]:
                last_of[(lg["name"], o["shard"])] = o["committed"]
    steps = []
    for (shard, c), rs in sorted(records.items()):
        # The members of the epoch that exchanged step c: the members after step c - 1's
        # boundary, when no member came or went in between (the same epoch).
        before = records.get((shard, c - 1), [])
        expected = next((r["size_after"] for r in before if r["epoch_after"] == rs[0]["epoch"]),
                        None)
        excused = any(last_of.get((n, shard)) == c - 1 for n in killed)
        steps.append({"shard": shard, "committed": c, "step": rs[0]["step"],
                      "members": len(rs), "epoch": rs[0]["epoch"], "expected": expected,
                      "identical": (len({r["hash"] for r in rs}) == 1 and
                                    len({r["epoch"] for r in rs}) == 1),
                      "complete": expected is None or len(rs) == expected or
                                  (len(rs) == expected - 1 and excused)})
    absent = {}
    for shard in (0, 1):
        runs, cur = [], None
        for st in (x for x in steps if x["shard"] == shard):
            if st["members"] < full_size and cur is None:
                cur = {"from": st["committed"], "epochs": [st["epoch"]]}
            elif st["members"] < full_size:
                cur["epochs"].append(st["epoch"])
            elif cur is not None:
                cur["back"], cur["back_epoch"] = st["committed"], st["epoch"]
                runs.append(cur)
                cur = None
        if cur is not None:
            runs.append(dict(cur, back=None, back_epoch=None))
        absent[shard] = runs
    told, left_itself, rejoins = [], [], []
    for lg in logs:
        if lg["kind"] != "pipeline":
            continue
        for e in lg["events"]:
            if e.get("replica_left"):
                told.append({"name": lg["name"], "stage": lg["stage"], "step": e["step"],
                             "time": e["time"], "via": e.get("via"), "what": e["what"]})
            if "leaving (takes the replica out)" in e["what"]:
                left_itself.append({"name": lg["name"], "step": e["step"]})
        for j in lg["joins"]:
            if j["outer_step"] > 0:
                rejoins.append({"name": lg["name"], "stage": lg["stage"],
                                "outer_step": j["outer_step"], "epochs": j["epochs"],
                                "finished": bool(lg.get("final"))})
    return {"full_size": full_size, "steps": steps, "absent": absent, "told": told,
            "left_itself": left_itself, "rejoins": rejoins}


def main(out):
    rundir = os.path.join(out, "churn_sparseloco")
    s = json.load(open(os.path.join(rundir, "summary.json")))
    u = analyse(rundir, s["events"])
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    check(not s["failed"], f"every process ended as planned ({'; '.join(s['failed']) or 'yes'})")
    kills = [e for e in s["events"] if e.get("killed")]
    check(len(kills) == len(s["plan"]) >= 1, f"{len(kills)} kill(s) of {len(s['plan'])} planned")
    victims = {p["victim"] for p in s["plan"]}
    rejoined = {(j["rank"], j["incarnation"]) for j in s["rejoined"] if j["finished"]}
    check(all(any(r == v and inc >= 1 for r, inc in rejoined) for v in victims),
          f"the killed stage's replacement rejoined and finished: {sorted(rejoined)}")
    check(all(j["state_bytes_received"] > 0 for j in s["rejoined"]),
          "every rejoin received the shared state: " +
          ", ".join(f"rank {j['rank']}.{j['incarnation']} {j['state_bytes_received']} B"
                    for j in s["rejoined"]))

    # The unit leaves: the surviving stage is told by its service, naming the killed stage.
    for k in kills:
        told = [t for t in u["told"] if f"({k['killed']})" in t["what"] and
                t["name"] != k["killed"]]
        check(bool(told), f"kill of {k['killed']}: the surviving stage was told replica_left "
                          "naming it: " + ("; ".join(f"{t['name']} via {t['via']} at step "
                                                     f"{t['step']}" for t in told) or "no"))
    check(not u["left_itself"], "no stage left by itself (the services took the replica out): " +
          (", ".join(f"{x['name']} at step {x['step']}" for x in u["left_itself"]) or "none"))
    # ... from both shards' groups over the same outer steps, and comes back as a unit.
    a0, a1 = u["absent"][0], u["absent"][1]
    check(len(a0) == len(a1) == len(kills),
          f"each shard's group was without the pipeline replica once per kill (shard 0: "
          f"{len(a0)}, shard 1: {len(a1)} run(s) of committed steps below "
          f"{u['full_size']} members)")
    for i, (x0, x1) in enumerate(zip(a0, a1)):
        # Every full replica exchanges shard 0, then shard 1, so a kill between the two
        # exchanges of one outer step leaves shard 0's commit of it with the replica and
        # shard 1's without: shard 1 may lose the replica one outer step before shard 0.
        check(x0["from"] - x1["from"] in (0, 1),
              f"out {i}: the replica left both shards at one outer step (first committed "
              f"without it: shard 0 step {x0['from']} epoch {x0['epochs'][0]}, shard 1 step "
              f"{x1['from']} epoch {x1['epochs'][0]}; shard 1 one step earlier only when the "
              "kill fell between a step's two exchanges)")
        joined = [j for j in u["rejoins"] if x0["back"] is not None and
                  j["outer_step"] == x0["back"] - 1]
        check(x0["back"] is not None and x0["back"] == x1["back"] and
              sorted(j["stage"] for j in joined) == [0, 1],
              f"out {i}: both stages admitted at one outer step and back in both shards from "
              f"the same committed step (shard 0: step {x0['back']} epoch {x0['back_epoch']}; "
              f"shard 1: step {x1['back']} epoch {x1['back_epoch']}; admitted: " +
              (", ".join(f"{j['name']} (stage {j['stage']}) at outer step {j['outer_step']}, "
                         f"epoch {list(j['epochs'].values())[0]}" for j in joined) or "none") +
              ")")
    rej = sorted({j["outer_step"] for j in u["rejoins"]})
    check(len(rej) == len(kills), f"every rejoin of a stage was its replica's (outer steps {rej})")

    bad = [x for x in u["steps"] if not x["identical"]]
    incomplete = [x for x in u["steps"] if not x["complete"]]
    least = min((x["members"] for x in u["steps"]), default=0)
    check(not bad and len(u["steps"]) >= 2 and least >= 2,
          f"every committed outer step has one parameter hash and one exchange epoch on its "
          f"members ({len(u['steps'])} (shard, step) records, each over >= {least} members; "
          f"differing: " +
          (", ".join(f"shard {x['shard']} step {x['committed']}" for x in bad) or "none") + ")")
    check(not incomplete, "every member of each step's epoch logged it (a killed member "
                          "excused for the step after its last one): " +
          (", ".join(f"shard {x['shard']} step {x['committed']}: {x['members']} of "
                     f"{x['expected']}" for x in incomplete) or "yes"))
    finals = s["final"]
    check(s["final_identical"] and all(len(v) == u["full_size"] for v in finals.values()),
          "final parameters identical on the members of each shard, restarted stage included: " +
          "; ".join(f"shard {k}: " + ", ".join(f"rank {r}.{i} step {c}" for r, i, c, _ in v)
                    for k, v in sorted(finals.items())))

    with open(os.path.join(rundir, "metrics.csv")) as f:
        losses = [float(r["loss"]) for r in csv.DictReader(f)]
    q = max(1, len(losses) // 4)
    quarters = [sum(losses[i * q:(i + 1) * q]) / q for i in range(4)]
    check(len(losses) >= 8 and all(b < a for a, b in zip(quarters, quarters[1:])) and
          s["train_loss"] < s["first_loss"] - 0.3,
          f"loss keeps decreasing (means of the run's quarters "
          f"{', '.join(f'{x:.3f}' for x in quarters)}; {s['first_loss']:.3f} -> "
          f"{s['train_loss']:.3f})")
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("all churn checks passed")


if __name__ == "__main__":
    main(sys.argv[1])
