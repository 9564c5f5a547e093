"""bench/cohorts.py: the fate-sharing statistics placement by cohort rests on, on a trace whose
answer is known."""
from __future__ import annotations

import math

from bench.cohorts import first_fit, fragments, main, reclaim_order, together


def test_cohort_statistics_on_a_known_trace(tmp_path, capsys):
    # a01n01..n03 freed together at t=0; n01 and n02 reclaimed together, n03 30 s later;
    # b01n01 alone
    trace = tmp_path / "t.csv"
    trace.write_text("time,node,state\n"
                     "2021-02-10T00:00:00Z,a01n01,idle\n2021-02-10T00:00:00Z,a01n02,idle\n"
                     "2021-02-10T00:00:00Z,a01n03,idle\n2021-02-10T00:00:05Z,b01n01,idle\n"
                     "2021-02-10T00:10:00Z,a01n01,busy\n2021-02-10T00:10:00Z,a01n02,busy\n"
                     "2021-02-10T00:10:30Z,a01n03,busy\n2021-02-10T00:20:00Z,b01n01,busy\n")
    frags = fragments(trace)
    assert sorted(f[0] for f in frags) == ["a01n01", "a01n02", "a01n03", "b01n01"]
    assert together(frags, 0.0) == 2 / 6           # of the 6 ordered pairs, n01-n02 both ways
    assert together(frags, 60.0) == 1.0
    assert math.isnan(together(frags[3:], 0.0))   # no cohort of two
    order = reclaim_order(trace)            # n01 and n02 of n01..n03: positions 0 and 0.5
    assert order.count == 1 and order.mean == 0.25 and order.direction == 0    # one reclaim says little
    assert main(["--trace", str(trace), "--json"]) == 0
    out = capsys.readouterr().out
    assert "33.3%" in out and '"partial_reclaims": 1, "partial_reclaim_position": 0.25' in out


def test_first_fit_counts_reclaims_of_the_first_idle_nodes_in_name_order(tmp_path, capsys):
    # name order is natural: a01n1 < a01n2 < a01n3 < a01n10 < b01n1 (a plain string sort would
    # put a01n10 second, and the reclaim at 00:20 would not be the first two)
    trace = tmp_path / "t.csv"
    idle = "".join(f"2021-02-10T00:00:00Z,{n},idle\n" for n in ("b01n1", "a01n10", "a01n2", "a01n1", "a01n3"))
    trace.write_text("time,node,state\n" + idle +
                     "2021-02-10T00:10:00Z,a01n1,busy\n"                          # first of 5: first fit
                     "2021-02-10T00:20:00Z,a01n3,busy\n2021-02-10T00:20:00Z,a01n2,busy\n"   # first 2 of 4
                     "2021-02-10T00:30:00Z,b01n1,busy\n"                          # last of 2: not
                     "2021-02-10T00:40:00Z,a01n10,busy\n")                        # all that was idle
    fit = first_fit(trace)
    assert fit == {"reclaims": 3, "nodes": 4, "first_fit": 2, "first_fit_nodes": 3, "first_fit_under_half": 1,
                   "expected": round(1 / 5 + 1 / 6 + 1 / 2, 1), "multi": 1, "one_run": 1, "two_runs": 0}
    assert main(["--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "in name order, of 3" in out and "75.0%" in out


def test_runs_count_how_many_stretches_of_consecutive_idle_nodes_a_reclaim_took(tmp_path):
    # idle in name order: n1 n2 n3 n4 n5 n6. n2+n3 is one run; then of n1 n4 n5 n6, n1+n5+n6 is
    # two runs (n4 stays between them); then n4 alone is not a reclaim of two
    trace = tmp_path / "t.csv"
    idle = "".join(f"2021-02-10T00:00:00Z,a01n{i},idle\n" for i in (6, 5, 4, 3, 2, 1))
    trace.write_text("time,node,state\n" + idle +
                     "2021-02-10T00:10:00Z,a01n3,busy\n2021-02-10T00:10:00Z,a01n2,busy\n"
                     "2021-02-10T00:20:00Z,a01n1,busy\n2021-02-10T00:20:00Z,a01n6,busy\n"
                     "2021-02-10T00:20:00Z,a01n5,busy\n"
                     "2021-02-10T00:30:00Z,a01n4,busy\n")
    fit = first_fit(trace)
    assert (fit["multi"], fit["one_run"], fit["two_runs"]) == (2, 1, 1)
