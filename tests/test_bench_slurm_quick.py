"""The benchmarks of `make bench` that start a test Slurm or OpenPBS, in their quick mode: apart from
tests/test_bench_quick.py because they share this host's Slurm resources, and so run with the
other Slurm tests one at a time (tests/conftest.py)."""
from __future__ import annotations

from tests.support.procs import last_json, run_module


def test_slurm_gives_nodes_back_to_a_real_slurm():
    out = last_json(run_module("bench.slurm", "--quick", "--json", timeout=300))
    assert out["rounds"] == 2 and out["nodes"] == 2 and out["main_nodes"] == 1 and out["dispatch"] == "pilot"
    assert 0 < out["leave_ms_p50"] <= out["vacate_ms_p50"] and out["main_start_ms_p50"] > 0


def test_preemption_times_a_pair_of_main_jobs_on_a_real_slurm():
    out = last_json(run_module("bench.preemption", "--quick", "--json", timeout=300))
    row = out["exit_ms"]["0"]
    assert out["repeats"] == 1 and set(out["exit_ms"]) == {"0"}
    assert row["free_ms_p50"] > 0 and row["preempted_ms_p50"] > 0
    # Each figure is rounded to 0.1 ms on its own, so the difference may be off by one in the last place.
    assert abs(row["added_ms_p50"] - (row["preempted_ms_p50"] - row["free_ms_p50"])) <= 0.11


def test_pbs_gives_vnodes_back_to_a_real_openpbs():
    out = last_json(run_module("bench.pbs", "--quick", "--json", timeout=400))
    assert out["rounds"] == 2 and out["nodes"] == 2 and out["dispatch"] == "pilot"
    assert 0 < out["signal_ms_p50"] < out["vacate_ms_p50"] and out["harvester_share_ms_p50"] > 0
    assert out["main_start_ms_p50"] > 0 and out["reharvest_ms_p50"] > 0


def test_a_cold_start_on_a_real_slurm_gives_the_job_every_held_node():
    out = last_json(run_module("bench.coldstart", "--quick", "--json", timeout=400))
    (run,) = out["runs"]
    assert out["nodes"] == 16 and run["held_max"] == 16 and run["job_max"] == 16 and out["goal_met"]
    assert 0 < run["submitted_all_s"] <= run["last_pilot_s"] and run["to_95_s"] <= run["to_100_s"]
    assert run["submit_rpcs"] >= 16 and run["hub_peak"] == 16 and run["rss_mb"] > 0
