"""Checks of the churn smoke variant (churn_smoke_test.sh, `hetero.py --churn`): a pipeline stage
was killed and restarted; the pipeline replica left both shards' groups and rejoined at an outer
step; every committed outer step was bit-identical on every member of its epoch; the final
parameters are identical on every member, the restarted stage included; loss decreases."""

import csv
import json
import os
import sys

out = sys.argv[1]
s = json.load(open(os.path.join(out, "churn_sparseloco", "summary.json")))
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


check(not s["failed"], f"every process ended as planned ({'; '.join(s['failed']) or 'yes'})")
kills = [e for e in s["events"] if "killed (SIGKILL)" in e["what"]]
check(len(kills) == len(s["plan"]) >= 1, f"{len(kills)} kill(s) of {len(s['plan'])} planned")
victims = {p["victim"] for p in s["plan"]}
rejoined = {(j["rank"], j["incarnation"]) for j in s["rejoined"] if j["finished"]}
check(all(any(r == v and inc >= 1 for r, inc in rejoined) for v in victims),
      f"the killed stage's replacement rejoined and finished: {sorted(rejoined)}")
check(all(j["state_bytes_received"] > 0 for j in s["rejoined"]),
      "every rejoin received the shared state: " +
      ", ".join(f"rank {j['rank']}.{j['incarnation']} {j['state_bytes_received']} B"
                for j in s["rejoined"]))
with open(os.path.join(out, "churn_sparseloco", "metrics.csv")) as f:
    rows = list(csv.DictReader(f))
steps = [int(r["step"]) for r in rows if r["shard0_members"]]
sizes = [(int(r["shard0_members"]), int(r["shard1_members"])) for r in rows
         if r["shard0_members"]]
# (Rank 0's view after each of its steps; at the very end the others leave as they finish.)
low = next((i for i, x in enumerate(sizes) if x == (2, 2)), None)
back = next((i for i, x in enumerate(sizes) if low is not None and i > low and x == (3, 3)), None)
# Rank 0 records its view only after a committed step: when the replacement is admitted at the
# very retry that follows the loss, no step commits at 2 members, and the loss shows as the
# survivors' retries or leaves instead (the final check below shows the replacement inside).


def step_of(e):
    try:
        return int(e["step"])
    except (KeyError, TypeError, ValueError):
        return None


kill_step = min((step_of(e) for e in kills if step_of(e) is not None), default=None)
reformed = [e for e in s["events"]
            if kill_step is not None and (step_of(e) or -1) >= kill_step
            and ("retried" in e["what"] or "left the data-parallel group" in e["what"])]
if low is not None and back is not None:
    check(True, f"both shards went down to 2 members (step {steps[low]}) and back to 3 "
                f"(step {steps[back]})")
else:
    check(bool(reformed) and
          any(x == (3, 3) for i, x in enumerate(sizes) if steps[i] >= (kill_step or 0)),
          "the membership re-formed around the loss without a step at 2 members (" +
          "; ".join(f"step {e['step']}: {e['what'][:60]}" for e in reformed[:3]) + ") and rank 0 "
          "saw both shards at 3 members after it")
check(s["identical"] and s["outer_checks"] >= 2 and s["min_members_compared"] >= 2,
      f"every committed outer step bit-identical on its members ({s['outer_checks']} (shard, "
      f"step) checks, each over >= {s['min_members_compared']} members)")
finals = s["final"]
check(s["final_identical"] and all(len(v) == 3 for v in finals.values()),
      "final parameters identical on the 3 members of each shard, restarted stage included: " +
      "; ".join(f"shard {k}: " + ", ".join(f"rank {r}.{i} step {c}" for r, i, c, _ in v)
                for k, v in sorted(finals.items())))
check(s["train_loss"] < s["first_loss"] - 0.3,
      f"loss decreases ({s['first_loss']:.3f} -> {s['train_loss']:.3f})")
if failures:
    sys.exit(f"{len(failures)} check(s) failed")
print("all churn checks passed")
