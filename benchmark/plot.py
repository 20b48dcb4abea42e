"""Draw fraction of the HBM floor against M, one line per arm, from a benchmark results JSON.

    python -m benchmark.plot benchmark/results/decode_layer_<stamp>.json [more.json ...]

Writes <json stem>.png beside each JSON. decode_layer: one panel per (layer kind, context L);
decode_step: one panel. Needs matplotlib (run it on the dev machine if the GPU box lacks it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STYLE = {"stock": ("tab:blue", "o"), "upstream": ("tab:orange", "s"), "fused": ("tab:green", "^")}


def plot(path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = json.loads(path.read_text())
    rows = [r for r in d["results"] if r.get("us")]
    kinds = sorted({r["kind"] for r in rows}, key=lambda k: ["dense", "moe_idx", "moe"].index(k)
                   if k in ("dense", "moe_idx", "moe") else 9)
    ls = sorted({r["L"] for r in rows})
    arms = [a for a in STYLE if any(r["arm"] == a for r in rows)]
    fig, axes = plt.subplots(len(kinds), len(ls), figsize=(4.2 * len(ls), 3.2 * len(kinds)),
                             squeeze=False, sharey=True)
    for i, k in enumerate(kinds):
        for j, ctx in enumerate(ls):
            ax = axes[i][j]
            for a in arms:
                pts = sorted((r["M"], r["fraction_of_floor"]) for r in rows
                             if r["arm"] == a and r["kind"] == k and r["L"] == ctx)
                if pts:
                    c, mk = STYLE[a]
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], color=c, marker=mk, label=a)
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({r["M"] for r in rows}))
            ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.set_ylim(0, 1.0)
            ax.axhline(1.0, color="gray", lw=0.8, ls="--")
            ax.grid(alpha=0.3)
            ax.set_title(f"{k}, L={ctx}", fontsize=10)
            if i == len(kinds) - 1:
                ax.set_xlabel("rows M")
            if j == 0:
                ax.set_ylabel("fraction of HBM floor")
    axes[0][0].legend(fontsize=8, loc="upper left")
    m = d["meta"]
    fig.suptitle(f"{m['benchmark']}: GLM-5.3 TP8 rank on {m.get('gpu')}, floor at "
                 f"{m['bandwidth_Bps'] / 1e12:.2f} TB/s (device copy), commit {str(m.get('commit'))[:10]}",
                 fontsize=10)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main():
    for p in sys.argv[1:]:
        print(plot(Path(p)))


if __name__ == "__main__":
    main()
