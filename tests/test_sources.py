"""The node sources on small real files: the trace reader (core/sources/trace.py) and the static
source (core/sources/static.py)."""
from __future__ import annotations

import pytest

from core.errors import InputError
from core.sources.static import StaticSource
from core.sources.trace import TraceSource, select_nodes
from core.timeutil import parse_iso
from tests.support.files import write_trace
from tests.support.sim import T0


def test_trace_batches_coalesce_and_report_net_changes(tmp_path):
    trace = write_trace(tmp_path / "t.csv", [
        ("2021-02-10T00:00:00Z", "a01n01", "idle"),
        ("2021-02-10T00:00:00Z", "a01n02", "idle"),
        ("2021-02-10T00:10:00Z", "a01n01", "busy"),   # idle -> busy -> idle in one second:
        ("2021-02-10T00:10:00Z", "a01n01", "idle"),   # the job there was preempted, node back
        ("2021-02-10T00:10:00Z", "a01n03", "idle"),
        ("2021-02-10T00:10:00Z", "a01n03", "busy"),   # busy -> idle -> busy: nothing to report
        ("2021-02-10T00:10:01Z", "a01n02", "busy"),
        ("2021-02-10T00:10:02Z", "zzz", "idle"),      # not in the subset
    ])
    src = TraceSource(trace, ["a01n01", "a01n02", "a01n03"], start=parse_iso("2021-02-10T00:05:00Z"))
    assert src.initial_idle() == ["a01n01", "a01n02"]
    batches = list(src.batches())
    assert [(t - T0, [(e.kind.value, e.node) for e in evs]) for t, evs in batches] == [
        (600.0, [("node_leave", "a01n01"), ("node_join", "a01n01")]),
        (601.0, [("node_leave", "a01n02")]),
    ]
    merged = list(TraceSource(trace, ["a01n01", "a01n02", "a01n03"], coalesce=5.0).batches())
    assert len(merged) == 2  # 00:00 batch, then 00:10:00..00:10:01 merged into one


def test_select_nodes_first_n_and_racks():
    names = [f"a{r:02d}n{i:02d}" for r in range(1, 4) for i in range(1, 19)]
    assert select_nodes(names, first=5) == names[:5]
    assert select_nodes(names, racks="a02") == names[18:36]
    assert select_nodes(names, racks="a01-a02,a03", first=40) == names[:40]
    with pytest.raises(ValueError):
        select_nodes(names, racks="b01")


@pytest.mark.parametrize("line, words", [
    ("2021-02-10T00:00:00Z,a01n01", "expected 3 fields"),
    ("2021-02-10T00:00:00Z,a01n01,down", "unknown state 'down'"),
    ("yesterday,a01n01,idle", "bad time"),
    ("2021-02-09T00:00:00Z,a01n01,idle", "goes back in time"),
])
def test_trace_errors_name_file_and_line(tmp_path, line, words):
    p = tmp_path / "bad.csv"
    p.write_text("time,node,state\n2021-02-10T00:00:00Z,a01n02,idle\n" + line + "\n")
    with pytest.raises(InputError) as e:
        TraceSource(p, []).validate()
    assert e.value.line == 3 and words in str(e.value) and "bad.csv:3" in str(e.value)


def test_static_source_rejects_unknown_and_duplicate_nodes():
    with pytest.raises(ValueError):
        StaticSource(["a", "a"])
    with pytest.raises(KeyError):
        StaticSource(["a"]).reclaim("b", 0.0)
