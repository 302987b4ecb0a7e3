"""Allocations over time in a chaos run, with every kill, restart and silent window marked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI
import matplotlib.pyplot as plt
from matplotlib.artist import Artist
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from benchmarks.chaos.analysis import Grant, Release, active_allocations

COLOURS = {
    "scheduler": "tab:red",
    "callback": "tab:purple",
    "predictor": "tab:orange",
    "gateway": "tab:brown",
    "nats-server": "black",
}
BIN_SECONDS = 5.0


def plot_run(report: dict[str, Any], records_file: Path, out: Path) -> None:
    records = json.loads(records_file.read_text())
    t0 = records["t0"]
    grants = [Grant(**{**g, "gpu_ids": tuple(g["gpu_ids"])}) for g in records["grants"]]
    releases = [Release(**r) for r in records["releases"]]
    ordered: list[Grant | Release] = sorted([*grants, *releases], key=lambda r: r.seq)
    held = active_allocations(ordered)

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    if grants:
        end = max(g.ts for g in grants) - t0
        bins = int(end // BIN_SECONDS) + 1
        per_bin = [0] * bins
        for g in grants:
            index = int((g.ts - t0) // BIN_SECONDS)
            if 0 <= index < bins:
                per_bin[index] += 1
        top.step(
            [i * BIN_SECONDS for i in range(bins)],
            [n / BIN_SECONDS for n in per_bin],
            where="post",
            label="allocations granted per second",
        )
    submitted = sorted(records["submitted"])
    if submitted:
        top.plot(
            [s - t0 for s in submitted],
            [0] * len(submitted),
            "|",
            markersize=3,
            alpha=0.2,
            color="tab:green",
            label="task submitted",
        )
    bottom.plot([t - t0 for t, _ in held], [n for _, n in held], label="allocations held")
    for axis in (top, bottom):
        for action in records["actions"]:
            x = action["started_at"] - t0
            if action["kind"] == "silent":
                axis.axvspan(x, x + (action["for_seconds"] or 0), color="grey", alpha=0.15)
            else:
                axis.axvline(x, color=COLOURS.get(action["target"], "tab:gray"), linestyle="--")
    handles: list[Artist] = [
        Line2D([], [], color=colour, linestyle="--", label=f"kill/restart {name}")
        for name, colour in COLOURS.items()
    ]
    handles.append(Rectangle((0, 0), 1, 1, color="grey", alpha=0.15, label="node silent"))
    top.legend(handles=top.get_legend_handles_labels()[0] + handles, fontsize=8, loc="upper left")
    top.set_ylabel("grants / s")
    bottom.set_ylabel("allocations held")
    bottom.set_xlabel("seconds since the first task")
    checks = ", ".join(f"{name} {c['value']}" for name, c in report.get("checks", {}).items())
    top.set_title(f"chaos run, seed {report['config']['seed']}: {checks}", fontsize=9)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
