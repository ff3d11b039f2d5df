#!/usr/bin/env python3
"""Plots `troupe bench scale` rows (JSON lines) for docs/scale.md.

    build/bin/troupe bench scale > /tmp/scale.jsonl
    .venv/bin/python scripts/plot_scale.py /tmp/scale.jsonl docs/

writes scale_coordinator_ms.png (coordinator CPU ms per step against the generator count, one
line per learner count, with the budget) and scale_samples_per_s.png (simulated samples trained
per second: each generator adds a group of samples to every step).
"""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(rows_path, out_dir):
    rows = [json.loads(line) for line in open(rows_path) if line.startswith("{")]
    rows = [r for r in rows if r.get("suite") == "scale"]
    if not rows:
        sys.exit(f"plot_scale: no scale rows in {rows_path}")
    by_learners = defaultdict(list)
    for r in rows:
        by_learners[r["learners"]].append(r)
    figures = [
        ("scale_coordinator_ms.png", "ours", "coordinator CPU time per step (ms)", True),
        ("scale_samples_per_s.png", "samples_per_s", "simulated samples trained per second", False),
    ]
    for name, key, label, with_budget in figures:
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
        for learners in sorted(by_learners):
            pts = sorted(by_learners[learners], key=lambda r: r["generators"])
            ax.plot([r["generators"] for r in pts], [r[key] for r in pts], marker="o",
                    label=f"{learners} learner{'s' if learners > 1 else ''}")
        if with_budget:
            pts = sorted({r["generators"]: r["baseline"] for r in rows}.items())
            ax.plot([g for g, _ in pts], [b for _, b in pts], "k--", label="budget (1 ms per 100 generators)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("generators")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(f"{out_dir.rstrip('/')}/{name}")
        print(f"plot_scale: wrote {out_dir.rstrip('/')}/{name}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
