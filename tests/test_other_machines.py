"""The learners on machines that are not Summit (bench/machines.py): a calm one whose idle
nodes stay for hours, its scheduler taking the first-named idle nodes, and a churning one whose
nodes come and go within minutes, its scheduler taking any. Nothing in the learners is fitted to
Summit, so each machine's own trace must set the horizon and the reclaim order, and `auto` must
come near whichever fixed horizon suits that machine, which is known only in hindsight."""
from __future__ import annotations

import json

import pytest

from bench.machines import FIXED, MACHINES, batch_machine, compare, main


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One trace of each machine, replayed under each fixed T_fwd and under auto (24 h)."""
    d = tmp_path_factory.mktemp("machines")
    return {m: compare(m, 1, 24.0, d) for m in MACHINES}


def test_each_machine_sets_its_own_horizon(runs):
    calm, churn = runs["calm"]["horizon_s"], runs["churn"]["horizon_s"]
    assert calm > 10 * churn and calm > 600.0


def test_auto_comes_near_the_best_fixed_horizon_of_each_machine(runs):
    best = {m: max(FIXED, key=lambda t: r["samples"][f"milp@{t:g}"]) for m, r in runs.items()}
    assert best["calm"] != best["churn"]          # no one fixed horizon suits both
    for m, r in runs.items():
        assert r["samples"]["auto"] >= 0.99 * r["samples"][f"milp@{best[m]:g}"], (m, r)
    calm = runs["calm"]["samples"]
    assert calm["auto"] >= 1.03 * calm["milp@10"]      # BFTrainer's 10 s


def test_the_reclaim_order_is_learned_only_where_the_scheduler_has_one(runs):
    assert runs["calm"]["order_direction"] == 1
    assert runs["churn"]["reclaims_seen"] > 100 and runs["churn"]["order_direction"] == 0


def test_the_generator_keeps_every_node_in_one_state_at_a_time(tmp_path):
    """Each node alternates idle, busy, idle ... from idle at the start; the "first" scheduler's
    first reclaim takes the first-named nodes."""
    path = batch_machine(tmp_path / "m.csv", 0.0, 6, arrive_s=600.0, run_s=1800.0, seed=3)
    rows = [line.split(",") for line in path.read_text().splitlines()[1:]]
    state: dict[str, str] = {}
    for _, node, s in rows:
        assert state.get(node, "busy") != s, (node, s)
        state[node] = s
    first_busy = rows[64][0]
    taken = [n for t, n, s in rows if s == "busy" and t == first_busy]
    assert taken == [f"m01n{i:02d}" for i in range(1, len(taken) + 1)]
    with pytest.raises(ValueError, match="first or random"):
        batch_machine(tmp_path / "x.csv", 0.0, 1, arrive_s=60.0, run_s=60.0, seed=1, order="last")


def test_the_bench_prints_a_table_and_json(capsys):
    assert main(["--seeds", "1", "--hours", "2", "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:6] == ["machine", "seed", "milp@10", "milp@60", "milp@300", "auto"]
    runs = json.loads(out[-1])["runs"]
    assert [r["machine"] for r in runs] == ["calm", "churn"]
    assert set(runs[0]["samples"]) == {"milp@10", "milp@60", "milp@300", "auto"}
