"""Checks of the smoke variant (smoke_test.sh): per run, loss decreases, every replica holds the
same bits after each outer step, and slow-link bytes match the payload accounting:
  - the pipeline's stage link carries exactly the subspace payloads (forward from stage 0,
    backward from stage 1; the codec's own size formula) plus at most 64 bytes per message;
  - the remaining slow-link bytes are the sparse all-reduce's: each rank's TopK-EF payload
    (encoded by the codec with a copy of its error feedback) to each slow peer of its shard
    (direct exchange), within 3 % plus 1 KiB of per-exchange metadata;
  - compressed runs: the boundary table was refreshed once per outer step on both stages (the
    basis version), and its updates moved less than a quarter of what dense V x d broadcasts
    would have."""

import json
import math
import os
import sys

out = sys.argv[1]
summary = json.load(open(os.path.join(out, "summary.json")))
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


check(not any(v.startswith("failed") for v in summary["missing"].values()), "every run finished")
for name, s in summary["results"].items():
    check(s["train_loss"] < s["first_loss"] - 0.3,
          f"{name}: loss decreases ({s['first_loss']:.3f} -> {s['train_loss']:.3f})")
    check(all(math.isfinite(e) for e in s["eval_losses"]) and len(set(s["eval_losses"])) >= 1,
          f"{name}: held-out loss finite ({s['eval_loss']:.3f})")
    expected_checks = summary["config"]["steps"] // summary["config"]["inner_steps"]
    check(s["identical"] and s["outer_checks"] == expected_checks,
          f"{name}: replicas bit-identical after each of {s['outer_checks']} outer steps")
    stage_sent = 0
    for r, link in s["stage_link"].items():
        payload = s["payload"][r]["boundary_sent"]
        sent = link["bytes_sent"]
        stage_sent += sent
        check(payload <= sent <= payload + 64 * link["messages_sent"],
              f"{name}: rank {r} stage link {sent} B = subspace payloads {payload} B "
              f"(+{sent - payload} B over {link['messages_sent']} messages)")
    if s["table_dense_bytes"]:
        outer_steps = summary["config"]["steps"] // summary["config"]["inner_steps"]
        lossy = name.endswith("_lossy")
        # Lossy: one refresh at the start (T = the initial embedding), then one per outer step.
        expected = outer_steps + (1 if lossy else 0)
        # Constrained: every rank shifts its embedding; lossy: only the pipeline's stages hold
        # a boundary table.
        check(expected in s["basis_versions"] if lossy else s["basis_versions"] == [expected],
              f"{name}: boundary table refreshed once per outer step (basis versions "
              f"{s['basis_versions']}, expected {expected})")
        check(0 < s["table_bytes"] < s["table_dense_bytes"] / 4,
              f"{name}: table updates {s['table_bytes']} B < 1/4 of dense broadcasts "
              f"{s['table_dense_bytes']} B")
    sparse_measured = sum(s["slow_sent_by_rank"].values()) - stage_sent
    sparse_payload = sum(p["sparse_sent"] for p in s["payload"].values())
    check(sparse_payload > 0 and
          abs(sparse_measured - sparse_payload) <= 0.03 * sparse_payload + 1024,
          f"{name}: sparse all-reduce slow-link bytes {sparse_measured} B ~ TopK-EF payloads "
          f"{sparse_payload} B")
if failures:
    sys.exit(f"{len(failures)} check(s) failed")
print("all smoke checks passed")
