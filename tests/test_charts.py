"""The chart helpers every page uses: "—" for 0/0, whole-number ticks for counts, job legend
labels with id and name, a linear histogram in whole runs, and an empty state without axes."""
from __future__ import annotations

import pytest

from app.charts import DASH, NO_DATA, count_axis, count_step, empty_figure, histogram, legend_label, ratio
from app.grid import BUSY_COLOUR, IDLE_COLOUR, JOB_COLOURS, RESCALE_COLOUR


def test_ratio_of_nothing_is_a_dash_not_a_percentage():
    assert ratio(0.0, 0.0) == DASH == "—"
    assert ratio(5.0, 0.0) == DASH
    assert ratio(0.0, 10.0) == "0.0 %"
    assert ratio(1.0, 3.0) == "33.3 %"
    assert ratio(float("nan"), 1.0) == DASH


@pytest.mark.parametrize("top,step", [(0, 1), (1, 1), (3, 1), (6, 1), (7, 2), (12, 2), (13, 5), (60, 10),
                                      (64, 20), (4734, 1000)])
def test_count_ticks_are_whole_numbers(top, step):
    assert count_step(top) == step
    axis = count_axis("nodes", top)
    assert isinstance(axis["dtick"], int) and axis["dtick"] >= 1 and axis["tick0"] == 0
    assert axis["tickformat"] == ",d" and axis["title"]["text"] == "nodes"
    assert top / axis["dtick"] <= 6


def test_legend_labels_tell_jobs_of_one_name_apart():
    a, b = legend_label("j0060", "resnet18", 60), legend_label("j0059", "resnet18", 59)
    assert a == "j0060 resnet18 · 60 nodes" and b == "j0059 resnet18 · 59 nodes"
    assert legend_label("u-1a2b", None, 1) == "u-1a2b · 1 node"
    assert legend_label("j1", "vgg16", 2, probing=True) == "j1 vgg16 · 2 nodes (probing)"


def test_histogram_counts_whole_runs_on_a_linear_scale():
    centres, counts, width = histogram([1.0, 1.1, 2.0, 10.0], bins=9)
    assert sum(counts) == 4 and all(isinstance(c, int) for c in counts)
    assert width == pytest.approx(1.0) and centres[0] == pytest.approx(1.5)
    assert counts[0] == 2 and counts[-1] == 1
    assert histogram([]) == ([], [], 0.0)
    assert sum(histogram([3.0, 3.0])[1]) == 2


def test_empty_figure_has_words_and_no_axes():
    fig = empty_figure("Nodes over time")
    assert fig["data"] == []
    assert fig["layout"]["xaxis"]["visible"] is False and fig["layout"]["yaxis"]["visible"] is False
    assert fig["layout"]["annotations"][0]["text"] == NO_DATA


def _rgb(c: str) -> tuple[int, int, int]:
    return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)


def _distance(a: str, b: str) -> float:
    return sum((x - y) ** 2 for x, y in zip(_rgb(a), _rgb(b))) ** 0.5


def test_job_colours_stand_apart_from_each_other_and_from_idle_busy_rescale_and_gaps():
    assert len(set(JOB_COLOURS)) == len(JOB_COLOURS) >= 10
    others = (BUSY_COLOUR, IDLE_COLOUR, RESCALE_COLOUR, "#ffffff")
    for i, a in enumerate(JOB_COLOURS):
        for b in JOB_COLOURS[i + 1:]:
            assert _distance(a, b) > 60, (a, b)
        for o in others:
            assert _distance(a, o) > 60, (a, o)
    assert _distance(IDLE_COLOUR, "#ffffff") > 60, "idle nodes must not look like the empty gaps"
