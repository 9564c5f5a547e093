"""How many nodes the jobs could use (core/demand.py), on its own and as the controller counts it."""
from __future__ import annotations

from core.controller_config import ControllerConfig
from core.demand import node_demand
from core.objective import Cap
from core.quotas import Limits, QuotaBook
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


def owned(jid: str, owner: str, hi: int):
    j = job(jid, hi=hi)
    j.owner = owner
    return j


def test_node_caps_bound_what_their_jobs_count_together_inside_out():
    a1, a2, b1, c1 = owned("a1", "alice", 8), owned("a2", "alice", 8), owned("b1", "bob", 6), owned("c1", "carol", 5)
    caps = [Cap(10, ("a1", "a2"), "alice"), Cap(4, ("b1",), "bob"), Cap(12, ("a1", "a2", "b1"), "account ml")]
    assert node_demand([a1, a2, b1, c1], [], 0) == 27
    assert node_demand([a1, a2, b1, c1], [], 0, caps) == 12 + 5           # alice 10 + bob 4, the account 12
    assert node_demand([a1, b1, c1], [a2], 0, caps) == 8 + 4 + 5          # a2 not counted: no slot
    assert node_demand([a1, a2, b1, c1], [], 0, caps[:2]) == 10 + 4 + 5
    assert node_demand([a1, a2], [], 0, [Cap(0, ("a1", "a2", "zz"), "alice")]) == 0   # over a period quota


def test_the_controller_holds_no_node_for_an_owner_beyond_their_cap():
    nodes = [f"n{i}" for i in range(16)]
    ctl, _ = controller(nodes, ControllerConfig(max_jobs=4))
    ctl.quota.source = lambda: QuotaBook(users={"alice": Limits(max_nodes=3)})
    ctl.submit(owned("a", "alice", hi=8))
    ctl.submit(owned("b", "alice", hi=8))
    ctl.submit(owned("c", "bob", hi=5))
    ctl.step()
    assert ctl.node_demand()[0] == 3 + 5
    assert sum(len(ctl.held.get(j, [])) for j in ("a", "b")) <= 3
