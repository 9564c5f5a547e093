"""How many nodes the jobs could use (core/demand.py), on its own and as the controller counts it."""
from __future__ import annotations

from core.controller_config import ControllerConfig
from core.demand import node_demand
from tests.support.sim import controller, job


def test_queued_jobs_count_only_up_to_the_free_running_slots():
    running = [job("r1", hi=4), job("r2", hi=2)]
    queued = [job("q1", hi=8), job("q2", hi=16)]
    assert node_demand(running, queued, free_slots=0) == 6
    assert node_demand(running, queued, free_slots=1) == 14       # queue order: q1 first
    assert node_demand(running, queued, free_slots=5) == 30
    assert node_demand([], [], free_slots=3) == 0


def test_the_controller_counts_running_queued_and_just_submitted_jobs_and_the_nodes_they_hold():
    nodes = [f"n{i}" for i in range(6)]
    ctl, _ = controller(nodes, ControllerConfig(max_jobs=2))
    assert ctl.node_demand() == (0, [])
    ctl.submit(job("a", hi=3))
    assert ctl.node_demand() == (3, [])                            # registered, not yet stepped
    ctl.submit(job("b", hi=4))
    ctl.submit(job("c", hi=5))                                     # no running slot left for it
    ctl.step()
    demand, used = ctl.node_demand()
    assert demand == 7 and sorted(used) == sorted(ctl.owner) and len(used) == 6
    ctl.cancel("a")
    ctl.step()
    assert ctl.node_demand()[0] == 9                               # b and c, which took a's slot
