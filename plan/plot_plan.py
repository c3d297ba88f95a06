"""Plots `lbcc plan --plot`'s sweep: compute utilization against slow-link bandwidth.

usage: plot_plan.py SWEEP.json OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        sweep = json.load(f)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for series in sweep["series"]:
        line, = ax.plot(series["mbit"], [100 * u for u in series["job"]],
                        label=f"{series['name']}: job")
        ax.plot(series["mbit"], [100 * u for u in series["worst"]], linestyle="--",
                color=line.get_color(), label=f"{series['name']}: worst replica")
    ax.axhline(100 * sweep["target"], color="grey", linewidth=0.8)
    ax.axvline(sweep["base_mbit"], color="grey", linewidth=0.8, linestyle=":")
    ax.set_xscale("log")
    ax.set_xlabel("slow-link down rate, geometric mean (Mbit/s); dotted: the job's links")
    ax.set_ylabel("compute utilization (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"lbcc plan: utilization vs link bandwidth (H = {sweep['H']})")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", linewidth=0.3)
    fig.tight_layout()
    fig.savefig(argv[2], dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
