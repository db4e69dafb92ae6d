"""Draw the documentation's stage diagram: ``python docs/_diagrams.py`` writes
``docs/_static/stage_diagram.png`` (committed, so building the site needs no drawing)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parent / "_static" / "stage_diagram.png"

# (title, detail, colour) of each node, left to right
NODES = [
    ("source", "sampler / keys\nits own thread\n(or a coroutine)", "#e2e8f0"),
    ("I/O stage", "read bytes\nconcurrency 64\ncoroutines or threads", "#bee3f8"),
    ("CPU stage", "decode, resize\nconcurrency 4\nthreads (GIL released)", "#c6f6d5"),
    ("aggregate", "group into\nbatches of 32", "#fefcbf"),
    ("collate", "one tensor\nper batch", "#fefcbf"),
    ("transfer", "pinned copy on\nits own CUDA stream", "#fed7e2"),
    ("sink", "buffer_size\nbatches ready", "#e9d8fd"),
]


def draw(path: Path = OUT) -> Path:
    fig, ax = plt.subplots(figsize=(13, 3.2))
    w, h, gap = 1.45, 1.5, 0.45
    for i, (title, detail, colour) in enumerate(NODES):
        x = i * (w + gap)
        box = FancyBboxPatch(
            (x, 0),
            w,
            h,
            boxstyle="round,pad=0.04,rounding_size=0.12",
            facecolor=colour,
            edgecolor="#2d3748",
            linewidth=1.2,
        )
        ax.add_patch(box)
        ax.text(
            x + w / 2, h - 0.28, title, ha="center", va="center", fontsize=11, fontweight="bold"
        )
        ax.text(x + w / 2, h / 2 - 0.18, detail, ha="center", va="center", fontsize=8.5)
        if i + 1 < len(NODES):
            ax.annotate(
                "",
                xy=(x + w + gap - 0.03, h / 2),
                xytext=(x + w + 0.03, h / 2),
                arrowprops={"arrowstyle": "-|>", "color": "#2d3748", "lw": 1.4},
            )
            ax.text(
                x + w + gap / 2, h / 2 + 0.16, "queue", ha="center", fontsize=7, color="#4a5568"
            )
    end = len(NODES) * (w + gap) - gap
    ax.annotate(
        "",
        xy=(end + 0.75, h / 2),
        xytext=(end + 0.03, h / 2),
        arrowprops={"arrowstyle": "-|>", "color": "#2d3748", "lw": 1.4},
    )
    ax.text(end + 0.8, h / 2, "your\ntraining\nloop", va="center", fontsize=10)
    ax.text(
        0,
        -0.38,
        "Every stage runs its own workers; the bounded queues between stages "
        "give back-pressure, so a slow stage never lets memory grow.",
        fontsize=9,
        color="#4a5568",
    )
    ax.set_xlim(-0.1, end + 1.6)
    ax.set_ylim(-0.55, h + 0.1)
    ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    print(draw())
