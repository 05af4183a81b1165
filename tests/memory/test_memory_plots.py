"""``kvbench memory sharing``'s plot read as a user sees it: a long title wraps
inside the image instead of being cut at its edge, and the legend covers neither line."""

import numpy as np

from kvbench.memory import plots
from kvbench.memory.sharing import SharingConfig, simulate_parallel_sampling

LONG_TITLE = (
    "KV memory in use: parallel sampling, n = 8, prompt 100,000 tokens, 256 new tokens each, 16-token blocks"
)


def test_sharing_title_fits_and_legend_is_off_the_lines(tmp_path, monkeypatch):
    kept = []
    original = plots._save
    monkeypatch.setattr(
        plots, "_save", lambda figure, plt, path: (kept.append(figure), original(figure, plt, path))[1]
    )
    result = simulate_parallel_sampling(SharingConfig(20_000, 64, 8, 16, 0))
    plots.plot_sharing(result, tmp_path / "sharing.png", LONG_TITLE, bytes_per_block=128 * 1024)
    [figure] = kept
    figure.canvas.draw()
    axis = figure.axes[0]
    title = axis.title.get_window_extent()
    assert "\n" in axis.get_title() and axis.get_title().replace("\n", " ") == LONG_TITLE
    assert 0 <= title.x0 and title.x1 <= figure.bbox.x1  # inside the figure: nothing cut off
    assert axis.get_ylim()[0] == 0  # memory from zero: the gap between the lines is to scale
    legend = axis.get_legend().get_window_extent()
    points = np.concatenate(
        [axis.transData.transform(np.column_stack(line.get_data())) for line in axis.get_lines()]
    )
    assert not any(legend.contains(x, y) for x, y in points)
    assert (tmp_path / "sharing.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_wrapped_title_keeps_short_titles():
    assert plots.wrapped_title("short") == "short"
    assert all(len(line) <= 70 for line in plots.wrapped_title(LONG_TITLE).split("\n"))
