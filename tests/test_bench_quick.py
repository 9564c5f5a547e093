"""Every benchmark of `make bench` in its quick mode (issue 50): each runs end to end and reports
what its table is about, so a change elsewhere cannot break `make bench` without a test failing.
These check that the benches work, not how fast anything is (bench.dashboard has its own file,
tests/test_bench_dashboard.py; those that start a test Slurm are in tests/test_bench_slurm_quick.py)."""
from __future__ import annotations

import re

import pytest

from tests.support.procs import ROOT, last_json, run_module


def test_every_benchmark_of_make_bench_has_a_quick_test():
    """A bench added to `make bench` without a test of its quick mode fails here."""
    make = (ROOT / "Makefile").read_text()
    recipe = make.split("\nbench:", 1)[1].split("\n\n", 1)[0]
    benches = re.findall(r"-m (bench\.\w+)", recipe)
    assert len(benches) >= 10 and "bench.startup" in benches
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py"))
    for bench in benches:
        assert re.search(rf'"{re.escape(bench)}",[^)]*"--quick"', tests), f"no test runs {bench} --quick"


def test_allocator_every_size_solved_and_highs_agrees():
    """The bench itself raises if HiGHS or CBC disagrees with the default policy's objective."""
    out = last_json(run_module("bench.allocator", "--quick", "--json", timeout=300))
    assert [(s["jobs"], s["nodes"]) for s in out["sizes"]][-1] == (100, 4734)
    for s in out["sizes"]:
        assert 0 < s["p50_ms"] <= s["p95_ms"] and s["highs_p50_ms"] > 0
    assert out["sizes"][0]["node_level_p50_ms"] is not None       # CBC solves the smallest size in time


def test_replay_one_day_under_each_policy_is_reproducible():
    out = last_json(run_module("bench.replay", "--quick", "--hours", "24", "--json", timeout=300))
    assert set(out["runs"]) == {"milp", "milp (again)", "even", "greedy"}
    assert out["reproducible"] and out["window"]["nodes"] == 4734 and out["window"]["simulated_hours"] == 24.0
    assert all(r["samples"] > 0 for r in out["runs"].values()) and out["milp_vs_even_samples"] > 0


def test_replay_window_before_any_job_ran_prints_no_ratio():
    """A window in which no policy processed a sample (the jobs had not started) is no crash."""
    out = last_json(run_module("bench.replay", "--quick", "--hours", "1", "--json", timeout=300))
    assert out["milp_vs_even_samples"] is None and out["runs"]["even"]["samples"] == 0


def test_rescale_local_and_torchrun_once_each():
    out = last_json(run_module("bench.rescale", "--quick", "--transport", "local,torchrun", "--json", timeout=300))
    local, torchrun = out["local"], out["torchrun"]
    assert local["grow_n"] == local["shrink_n"] == local["relaunch_grow_n"] == 1
    assert local["samples_exact"] and local["steps_continuous"] and local["checksums_equal"]
    assert local["leftover_processes"] == torchrun["leftover_processes"] == 0
    assert torchrun["restart_grow_n"] == 1


def test_vacate_local_and_ssh():
    out = last_json(run_module("bench.vacate", "--quick", "--json", timeout=300))
    for kind in ("local", "ssh"):
        assert out[kind]["vacate_n"] == 2 and out[kind]["vacate_ms_p50"] > 0, out


def test_jpa_every_policy_on_both_workloads():
    out = last_json(run_module("bench.jpa", "--quick", "--json", timeout=300))
    for workload in ("imagenet", "mixed"):
        assert set(out[workload]) == {"oracle", "noinfo", "even", "jpa"}
        assert all(v > 0 for v in out[workload].values())
        assert out["ratios"][workload]["jpa_vs_oracle"] > 0


def test_fairshare_three_runs_and_the_owners_add_up():
    """Every owner's node-hours add up to what the run used (each job of the set has an owner)."""
    out = last_json(run_module("bench.fairshare", "--quick", "--json", timeout=300))
    (r,) = out
    assert set(r["runs"]) == {"throughput", "fairshare", "fairshare+queue"} and r["smallest"] in r["owners"]
    for run in r["runs"].values():
        per_owner = run["per_owner"]
        assert sum(o["node_hours"] for o in per_owner.values()) == pytest.approx(run["used_node_hours"], abs=0.01)
        assert run["samples"] > 0 and 0 < run["jain_node_hours"] <= 1
