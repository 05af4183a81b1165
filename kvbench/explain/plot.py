"""The waterfall as a PNG: one horizontal bar per step, floating from what was left before it."""

from __future__ import annotations

from pathlib import Path

from kvbench.explain.waterfall import Waterfall


def plot_waterfall(waterfall: Waterfall, path: Path, title: str) -> Path:
    """Write the waterfall of ``waterfall.rows()`` to ``path`` (PNG); returns ``path``. Losses float
    from what was left before them, so the bars read top to bottom as total -> ideal -> ... -> hit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = waterfall.rows()
    figure, axis = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    for number, (_label, tokens, share, left) in enumerate(rows):
        is_loss = 1 < number < len(rows) - 1
        start = left if is_loss else 0
        color = "#d62728" if is_loss else ("#2ca02c" if number == len(rows) - 1 else "#1f77b4")
        axis.barh(number, tokens, left=start, color=color)
        axis.text(start + max(tokens, 0), number, f" {tokens:,} ({share:.1%})", va="center", fontsize=8)
    axis.set_yticks(range(len(rows)), [row[0] for row in rows], fontsize=8)
    axis.invert_yaxis()
    axis.set_xlabel("prompt tokens")
    axis.set_xlim(0, max(waterfall.total_tokens, 1) * 1.3)
    axis.set_title(title.replace(" (", "\n(", 1), fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
