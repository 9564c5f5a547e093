"""The regroup rules (core/runtime/regroup.py) without processes, stores or clocks: messages in,
commands out, time passed by hand. One test per rule."""
from __future__ import annotations

import pytest

from core.runtime import protocol as P
from tests.support.regroup import GB, TOTAL, WALL0, Job, at, ops

def test_first_regroup_runs_ranks_in_the_given_order() -> None:
    j = Job()
    j.warm("A", "B")
    assert j.m.ready_nodes() == {"A", "B"}
    assert j.m.regroup(["B", "A"], at(1)) == 1
    assert ops(j.m.tick(at(1))) == [("run", "B", 1, 0, 2), ("run", "A", 1, 1, 2)]
    run = j.m.status()
    assert run["phase"] == "running" and run["members"] == ["B", "A"] and run["world_size"] == 2
    assert run["ready"] == [] and run["workers"] == {"A": "running", "B": "running"}


def test_regroup_waits_for_warming_nodes_while_the_job_trains() -> None:
    j = Job()
    j.running(["A", "B"])
    j.start("C", 1)
    j.ev("C", P.EV_HELLO, 1)
    assert j.m.regroup(["A", "B", "C"], at(2)) == 2
    assert j.m.tick(at(3)) == []                      # C warming: nobody is stopped yet
    st = j.m.status()
    assert st["phase"] == "running" and st["pending"] == ["A", "B", "C"] and st["regrouping"]
    j.ev("C", P.EV_READY, 4, step=0)
    assert ops(j.m.tick(at(4))) == [("stop", "A", 1), ("stop", "B", 1)]
    assert j.m.status()["phase"] == "stopping"


def test_ready_timeout_leaves_late_nodes_out() -> None:
    j = Job(ready_timeout_s=30)
    j.running(["A", "B"])
    j.start("C", 1)                                    # never gets ready
    j.m.regroup(["A", "B", "C"], at(2))
    assert j.m.tick(at(31)) == []                     # 29 s: still waiting
    assert ops(j.m.tick(at(32.5))) == [("stop", "A", 1), ("stop", "B", 1)]
    assert j.m.status()["pending"] == ["A", "B"]


def test_ready_timeout_also_applies_when_nothing_runs() -> None:
    j = Job(ready_timeout_s=30)
    j.warm("A")
    j.start("B")
    j.m.regroup(["A", "B"], at(0))
    assert j.m.tick(at(10)) == []
    assert ops(j.m.tick(at(31))) == [("run", "A", 1, 0, 1)]


def test_stop_then_run_when_every_member_stopped() -> None:
    j = Job()
    j.running(["A", "B"])
    j.warm("C", t=1)
    j.m.regroup(["A", "B", "C"], at(2))
    j.m.tick(at(2))
    assert j.stopped(1, "A", t=3, step=50) == []
    assert j.m.tick(at(3)) == []                      # B has not reported yet
    j.stopped(1, "B", t=3.1, step=50)
    assert ops(j.m.tick(at(3.2))) == [("run", "A", 2, 0, 3), ("run", "B", 2, 1, 3),
                                      ("run", "C", 2, 2, 3)]
    g1, g2 = j.m.generations()
    assert g1["end_step"] == 50 and g1["ended_at"] == WALL0 + 3.2
    assert g2["members"] == ["A", "B", "C"] and g2["prev_size"] == 2 and g2["reason"] == "regroup"
    assert g2["incarnations"] == {"A": 1, "B": 1, "C": 1}
    assert j.m.status()["committed_step"] == 50


def test_first_step_closes_the_measurement() -> None:
    j = Job()
    j.running(["A", "B"])
    j.warm("C", t=5)
    j.m.regroup(["A", "B", "C"], at(10))              # decision
    j.m.tick(at(11))                                  # stop sent
    j.stopped(1, "A", "B", t=11.3, step=70)
    j.m.tick(at(11.5))                                # run sent
    for rank, n in enumerate("ABC"):
        j.ev(n, P.EV_SYNCED, 11.8, gen=2, rank=rank, step=70, checksum="c")
    assert j.m.busy()                                 # no first step yet
    j.ev("A", P.EV_FIRST_STEP, 12.0, gen=2, step=71)
    g = j.m.generations()[-1]
    assert g["requested_at"] == WALL0 + 10 and g["switch_at"] == WALL0 + 11
    assert g["published_at"] == WALL0 + 11.5 and g["synced_at"] == WALL0 + 11.8
    assert g["first_step_at"] == WALL0 + 12
    assert g["decision_s"] == pytest.approx(2.0) and g["switch_s"] == pytest.approx(1.0)
    assert g["start_step"] == 70
    st = j.m.status()
    assert st["size_since"] == WALL0 + 12 and st["committed_step"] == 71 and not st["regrouping"]
    assert not j.m.busy()
    j.ev("A", P.EV_FIRST_STEP, 13.0, gen=2, step=90)  # a repeat changes nothing
    assert j.m.generations()[-1]["decision_s"] == pytest.approx(2.0)


def test_lost_member_during_a_regroup_is_not_waited_for() -> None:
    j = Job()
    j.running(["A", "B"])
    j.warm("C", t=1)
    j.m.regroup(["A", "B", "C"], at(2))
    j.m.tick(at(2))                                   # stop sent to A and B
    j.stopped(1, "A", t=3, step=40)
    assert ops(j.m.node_lost("B", None, at(3.5))) == [("exit", "B")]
    assert ops(j.m.tick(at(3.6))) == [("run", "A", 2, 0, 2), ("run", "C", 2, 1, 2)]
    g1, g2 = j.m.generations()
    assert g1["failed"] and g2["reason"] == "regroup" and g2["members"] == ["A", "C"]
    assert j.m.status()["lost"] == ["B"]


def test_node_lost_while_running_regroups_on_the_survivors() -> None:
    j = Job()
    j.running(["A", "B", "C"])
    assert ops(j.m.node_lost("B", None, at(5))) == [("exit", "B")]
    assert ops(j.m.tick(at(5.1))) == [("stop", "A", 1), ("stop", "C", 1)]
    j.stopped(1, "A", "C", t=5.2, step=30, reason=P.STOP_FAILED)
    assert ops(j.m.tick(at(5.3))) == [("run", "A", 2, 0, 2), ("run", "C", 2, 1, 2)]
    g = j.m.generations()[-1]
    assert g["reason"] == "node_lost" and g["requested_at"] == WALL0 + 5


def test_pending_regroup_wins_over_a_failure_regroup() -> None:
    j = Job()
    j.running(["A", "B"])
    j.start("C", 1)
    j.ev("C", P.EV_HELLO, 1)
    j.m.regroup(["A", "B", "C"], at(2))               # waits for C
    j.m.node_lost("B", None, at(3))
    st = j.m.status()
    assert st["pending"] == ["A", "C"] and st["pending_generation"] == 2
    # the failed generation is stopped at once, C still warming
    assert ops(j.m.tick(at(3.1))) == [("stop", "A", 1)]
    j.stopped(1, "A", t=3.2, step=20, reason=P.STOP_FAILED)
    assert j.m.tick(at(3.3)) == []                    # nothing runs: wait for C's warm-up
    j.ev("C", P.EV_READY, 4, step=0)
    assert ops(j.m.tick(at(4))) == [("run", "A", 2, 0, 2), ("run", "C", 2, 1, 2)]
    g = j.m.generations()[-1]
    assert g["reason"] == "regroup" and g["requested_at"] == WALL0 + 2


def test_regroup_after_a_loss_keeps_the_callers_reason() -> None:
    j = Job()
    j.running(["A", "B", "C"])
    j.m.node_lost("C", None, at(1))
    assert j.m.regroup(["A", "B"], at(1.5)) == 2      # the same pending generation
    j.m.tick(at(1.6))
    j.stopped(1, "A", "B", t=1.7, step=9)
    j.m.tick(at(1.8))
    g = j.m.generations()[-1]
    assert g["reason"] == "regroup" and g["requested_at"] == WALL0 + 1   # the loss came first


def test_a_failed_step_regroups_on_the_survivors_from_the_stop() -> None:
    j = Job()
    j.running(["A", "B"])
    # B's collective failed: it reports, the coordinator stops the rest
    assert ops(j.stopped(1, "B", t=7, step=33, reason=P.STOP_FAILED)) == [("stop", "A", 1)]
    j.stopped(1, "A", t=7.1, step=33, reason=P.STOP_FAILED)
    assert ops(j.m.tick(at(7.2))) == [("run", "A", 2, 0, 2), ("run", "B", 2, 1, 2)]
    g = j.m.generations()[-1]
    assert g["reason"] == "failure" and g["requested_at"] == WALL0 + 7 and g["switch_at"] == WALL0 + 7


def test_a_group_that_stopped_before_the_regroup_measures_from_the_stop() -> None:
    j = Job()
    j.running(["A", "B"])
    j.stopped(1, "B", t=7, step=33, reason=P.STOP_FAILED)   # stop sent to A at 7
    j.m.regroup(["A"], at(7.5))                       # the dispatcher decides after that
    j.stopped(1, "A", t=7.6, step=33, reason=P.STOP_FAILED)
    assert ops(j.m.tick(at(7.7))) == [("run", "A", 2, 0, 1)]
    j.ev("A", P.EV_FIRST_STEP, 8, gen=2, step=34)
    g = j.m.generations()[-1]
    assert g["reason"] == "regroup" and g["requested_at"] == WALL0 + 7
    assert g["decision_s"] == pytest.approx(1.0) and g["switch_s"] == pytest.approx(1.0)


def test_a_leaving_rank_regroups_without_it() -> None:
    j = Job()
    j.running(["A", "B"])
    assert ops(j.stopped(1, "B", t=4, step=12, reason=P.STOP_LEAVING)) == [("stop", "A", 1)]
    j.stopped(1, "A", t=4.1, step=12)                 # the group agreed on the stop step
    j.ev("B", P.EV_EXIT, 4.15, reason="sigterm")
    assert ops(j.m.tick(at(4.2))) == [("run", "A", 2, 0, 1)]
    g = j.m.generations()[-1]
    assert g["reason"] == "leave" and g["requested_at"] == WALL0 + 4 and g["prev_size"] == 2
    assert j.m.status()["workers"]["B"] == "gone" and j.m.status()["lost"] == []


def test_when_every_rank_leaves_the_job_pauses() -> None:
    j = Job()
    j.running(["A", "B"])
    j.stopped(1, "A", "B", t=4, step=12, reason=P.STOP_LEAVING)
    assert j.m.tick(at(4.2)) == []
    st = j.m.status()
    assert st["phase"] == "idle" and st["world_size"] == 0 and st["committed_step"] == 12
    assert st["workers"] == {"A": "exiting", "B": "exiting"}


def test_a_leaving_rank_among_staying_ones() -> None:
    j = Job()
    j.running(["A", "B", "C"])
    j.stopped(1, "C", t=4, step=12, reason=P.STOP_LEAVING)
    j.stopped(1, "A", "B", t=4.1, step=12)
    assert ops(j.m.tick(at(4.2))) == [("run", "A", 2, 0, 2), ("run", "B", 2, 1, 2)]
    assert j.m.generations()[-1]["reason"] == "leave"
    assert j.m.status()["workers"]["C"] == "exiting"


def test_incarnations_guard_node_lost_dismiss_and_events() -> None:
    j = Job()
    j.start("X")
    assert j.inc["X"] == 1
    assert ops(j.start("X")) == [("exit", "X")]       # the old process is told to leave
    assert j.inc["X"] == 2
    assert j.m.node_lost("X", 1, at(1)) == []         # news about the old process
    j.m.dismiss("X", 1, at(1))
    assert j.ev("X", P.EV_HELLO, 1, inc=1) == []
    st = j.m.status()
    assert st["workers"] == {"X": "starting"} and st["lost"] == []
    j.ev("X", P.EV_HELLO, 1)
    assert j.m.status()["workers"] == {"X": "warming"}
    assert ops(j.m.node_lost("X", 2, at(2))) == [("exit", "X")]
    st = j.m.status()
    assert st["workers"] == {"X": "gone"} and st["lost"] == ["X"]
    assert j.m.node_lost("X", None, at(3)) == []      # already gone: nothing more to send


def test_replacing_a_running_member_fails_its_generation() -> None:
    j = Job()
    j.running(["A", "B"])
    assert ops(j.start("B", 5)) == [("exit", "B")]    # restarted by the dispatcher
    assert ops(j.m.tick(at(5))) == [("stop", "A", 1)]
    j.stopped(1, "A", t=5.1, step=8, reason=P.STOP_FAILED)
    j.ev("B", P.EV_STOPPED, 5.1, inc=1, gen=1, step=8, reason=P.STOP_FAILED)  # the old B: ignored
    assert ops(j.m.tick(at(5.2))) == [("run", "A", 2, 0, 1)]
    assert j.m.generations()[0]["failed"] and j.m.generations()[0]["stopped"].keys() == {"A"}


def test_unknown_and_duplicate_nodes_are_refused() -> None:
    j = Job()
    j.start("A")
    with pytest.raises(ValueError):
        j.m.regroup(["Y"], at(0))
    with pytest.raises(ValueError):
        j.m.regroup(["A", "A"], at(0))


def test_regroup_leaves_out_nodes_whose_worker_is_gone() -> None:
    j = Job()
    j.warm("A", "B")
    j.ev("B", P.EV_EXIT, 0, reason="error")
    j.m.regroup(["A", "B"], at(1))
    assert j.m.status()["pending"] == ["A"]
    assert ops(j.m.tick(at(1))) == [("run", "A", 1, 0, 1)]


def test_regroup_to_the_running_members_changes_nothing() -> None:
    j = Job()
    j.running(["A", "B"])
    j.warm("C")
    assert j.m.regroup(["A", "B", "C"], at(1)) == 2
    assert j.m.regroup(["A", "B"], at(1.5)) == 1      # back to what runs: the pending one is dropped
    assert j.m.tick(at(2)) == [] and j.m.status()["pending"] is None


def test_heartbeat_timeout_marks_the_worker_lost() -> None:
    j = Job(heartbeat_timeout_s=15)
    j.running(["A", "B"])
    assert j.m.heartbeat_keys() == [("A", 1), ("B", 1)]
    assert j.m.heartbeats({("A", 1): b"1", ("B", 1): b"1"}, at(1)) == []
    assert j.m.heartbeats({("A", 1): b"2", ("B", 1): b"1"}, at(15.5)) == []   # 14.5 s: not yet
    assert ops(j.m.heartbeats({("A", 1): b"3", ("B", 1): b"1"}, at(16.5))) == [("exit", "B")]
    st = j.m.status()
    assert st["lost"] == ["B"] and st["workers"]["B"] == "gone" and st["pending"] == ["A"]
    assert j.m.heartbeat_keys() == [("A", 1)]
    assert ops(j.m.tick(at(16.6))) == [("stop", "A", 1)]


def test_a_heartbeat_without_genuine_news_does_not_keep_a_worker_alive() -> None:
    j = Job(heartbeat_timeout_s=15)
    j.running(["A", "B"])
    assert j.m.heartbeats({("A", 1): b"1", ("B", 1): b"1"}, at(1)) == []
    assert j.m.heartbeats({("A", 1): b"2", ("B", 1): None}, at(10)) == []     # forged/replayed
    assert ops(j.m.heartbeats({("A", 1): b"3", ("B", 1): None}, at(16.5))) == [("exit", "B")]
    assert j.m.status()["lost"] == ["B"]


def test_heartbeats_of_unconnected_or_replaced_workers_are_ignored() -> None:
    j = Job(heartbeat_timeout_s=1)
    j.start("A")
    assert j.m.heartbeat_keys() == []                 # never said hello
    j.ev("A", P.EV_HELLO, 0)
    j.start("A", 0.5)                                 # replaced: its heartbeat no longer counts
    assert j.m.heartbeats({("A", 1): b"0"}, at(10)) == []
    assert j.m.status()["lost"] == []


def test_dismissed_worker_gets_exit_once_out_of_the_group() -> None:
    j = Job()
    j.running(["A", "B", "C"])
    j.m.regroup(["A", "B"], at(1))
    j.m.dismiss("C", None, at(1))
    assert ops(j.m.tick(at(1))) == [("stop", "A", 1), ("stop", "B", 1), ("stop", "C", 1)]
    j.stopped(1, "A", "B", "C", t=1.1, step=5)
    assert ops(j.m.tick(at(1.2))) == [("run", "A", 2, 0, 2), ("run", "B", 2, 1, 2), ("exit", "C")]
    assert j.m.tick(at(1.3)) == []                    # exit is sent once


def test_dismissing_a_member_regroups_without_it() -> None:
    j = Job()
    j.running(["A", "B"])
    j.m.dismiss("B", None, at(1))
    assert j.m.status()["pending"] == ["A"]
    assert ops(j.m.tick(at(1))) == [("stop", "A", 1), ("stop", "B", 1)]
    j.stopped(1, "A", "B", t=1.1, step=5)
    assert ops(j.m.tick(at(1.2))) == [("run", "A", 2, 0, 1), ("exit", "B")]
    assert j.m.generations()[-1]["reason"] == "dismiss"


def test_empty_regroup_pauses_the_job() -> None:
    j = Job()
    j.running(["A"])
    j.m.regroup([], at(1))
    j.m.tick(at(1))
    j.stopped(1, "A", t=1.1, step=9)
    assert j.m.tick(at(1.2)) == []
    st = j.m.status()
    assert st["phase"] == "idle" and st["ready"] == ["A"] and st["committed_step"] == 9
    assert j.m.regroup(["A"], at(2)) == 2             # a generation that never ran used no number


def test_finished_job_sends_exits() -> None:
    j = Job()
    j.running(["A", "B"])
    j.warm("C")
    j.stopped(1, "A", "B", t=9, step=j.m.total_steps, reason=P.STOP_FINISHED)
    assert j.m.tick(at(9.1)) == []                    # ends the generation
    assert ops(j.m.tick(at(9.2))) == [("exit", "A"), ("exit", "B"), ("exit", "C")]
    st = j.m.status()
    assert st["finished"] and st["samples_done"] == TOTAL and st["lost_samples"] == 0
    assert j.m.regroup(["C"], at(10)) == 1            # nothing starts after the end


def test_generations_failing_before_their_first_step_fail_the_job() -> None:
    j = Job(max_failed_generations=2)
    j.running(["A", "B"])
    j.m.node_lost("B", None, at(1))                   # gen 1 had its first step: not counted
    j.m.tick(at(1))
    j.stopped(1, "A", t=1.1, step=3, reason=P.STOP_FAILED)
    j.warm("C", t=1.1)
    j.m.regroup(["A", "C"], at(1.1))
    assert ops(j.m.tick(at(1.2))) == [("run", "A", 2, 0, 2), ("run", "C", 2, 1, 2)]
    j.stopped(2, "A", t=2, step=3, reason=P.STOP_FAILED)
    j.stopped(2, "C", t=2, step=3, reason=P.STOP_FAILED)
    assert ops(j.m.tick(at(2.1)))[0] == ("run", "A", 3, 0, 2)   # 1 failure in a row
    j.stopped(3, "A", "C", t=3, step=3, reason=P.STOP_FAILED)
    assert j.m.tick(at(3.1)) == []
    st = j.m.status()
    assert st["failed"] and "2 generations in a row" in st["error"] and st["pending"] is None
    assert ops(j.m.tick(at(3.2))) == [("exit", "A"), ("exit", "C")]
    assert j.m.regroup(["A", "C"], at(4)) == 3        # nothing starts after a failure


def test_close_stops_the_running_group_and_sends_exits() -> None:
    j = Job()
    j.running(["A", "B"])
    j.warm("C")
    j.m.close()
    assert ops(j.m.tick(at(1))) == [("stop", "A", 1), ("exit", "A"), ("stop", "B", 1),
                                    ("exit", "B"), ("exit", "C")]
    assert not j.m.quiet()
    for n in "ABC":
        j.ev(n, P.EV_EXIT, 1.1, reason="exit")
    assert j.m.quiet()


def test_progress_of_the_running_generation_commits_steps() -> None:
    j = Job()
    j.running(["A", "B"])
    j.m.progress_read({"gen": 0, "step": 500, "loss": 9.0})        # an old generation's record
    assert j.m.status()["committed_step"] == 1 and j.m.status()["loss"] is None
    j.m.progress_read({"gen": 1, "step": 40, "loss": 0.5, "step_time_s": 0.02,
                       "samples_per_second": 3200.0})
    st = j.m.status()
    assert st["committed_step"] == 40 and st["loss"] == 0.5 and st["samples_per_second"] == 3200.0
    assert st["samples_done"] == 40 * GB


def test_resuming_behind_the_committed_step_counts_lost_samples() -> None:
    j = Job()
    j.running(["A", "B"])
    j.m.progress_read({"gen": 1, "step": 40})
    j.m.node_lost("A", None, at(1))
    j.m.node_lost("B", None, at(1))                   # both gone: only the checkpoint is left
    j.m.tick(at(1))
    j.warm("C", t=2)
    j.m.regroup(["C"], at(2))
    j.m.tick(at(2))
    j.ev("C", P.EV_SYNCED, 3, gen=2, rank=0, step=30, restored=True, checksum="c")
    st = j.m.status()
    assert st["committed_step"] == 30 and st["lost_samples"] == 10 * GB


def test_malformed_events_raise_and_older_generations_are_ignored() -> None:
    j = Job()
    j.running(["A"])
    with pytest.raises(KeyError):
        j.ev("A", P.EV_SYNCED, 1, rank=0, step=0)     # no generation
    assert j.ev("A", P.EV_STOPPED, 1, gen=99, step=1, reason="stop") == []
    assert j.m.worker_event({"ev": P.EV_HELLO, "node": "nobody", "inc": 1}, at(1)) == []


# ---- after a harvester restart: a new machine adopts the workers that rejoin -----------------
def rejoin(j: Job, node: str, inc: int, t: float, *, gen: int, step: int, running: bool,
           members: list[str]) -> list[Send]:
    j.inc[node] = inc
    return j.ev(node, P.EV_REJOIN, t, inc=inc, gen=gen, rank=members.index(node) if node in members else 0,
                world=len(members), members=members, step=step, running=running, k=7)


def test_workers_that_rejoin_still_running_make_their_generation_current_without_a_regroup() -> None:
    j = Job()
    assert rejoin(j, "B", 3, 0.0, gen=5, step=410, running=True, members=["A", "B"]) == []
    assert rejoin(j, "A", 2, 0.1, gen=5, step=412, running=True, members=["A", "B"]) == []
    st = j.m.status()
    assert (st["phase"], st["generation"], st["members"], st["committed_step"]) == ("running", 5, ["A", "B"], 412)
    assert not st["regrouping"] and j.m.tick(at(0.2)) == []
    assert j.m.gens[-1].reason == "resumed" and j.m.gens[-1].incarnations == {"A": 2, "B": 3}
    inc, _ = j.m.worker_started("C", at(0.3))       # a new worker gets a fresh number, the next gen
    assert inc == 1 and j.m.regroup(["A", "B"], at(0.3)) == 5
    assert j.m.worker_started("A", at(0.4))[0] == 3, "incarnations go on above the adopted one"


def test_a_rejoin_from_a_group_that_failed_meanwhile_stops_and_regroups_the_rest() -> None:
    j = Job()
    rejoin(j, "A", 1, 0.0, gen=2, step=100, running=True, members=["A", "B", "C"])
    cmds = rejoin(j, "B", 1, 0.1, gen=2, step=99, running=False, members=["A", "B", "C"])
    assert ops(cmds) == [("stop", "A", 2)]         # B's group failed while nobody listened
    j.stopped(2, "A", t=0.2, step=100, reason=P.STOP_FAILED)
    j.m.regroup(["A", "B"], at(0.3))
    assert ops(j.m.tick(at(0.3))) == [("run", "A", 3, 0, 2), ("run", "B", 3, 1, 2)]
    assert j.m.status()["committed_step"] == 100


def test_a_rejoin_of_a_replaced_worker_is_told_to_exit() -> None:
    j = Job()
    j.warm("A")                                     # incarnation 1 is current here
    j.m.worker_started("A", at(0.0))                # and now 2
    cmds = j.m.worker_event({"ev": P.EV_REJOIN, "node": "A", "inc": 1, "pid": 9, "gen": 1, "rank": 0,
                             "world": 1, "members": ["A"], "step": 3, "running": True, "k": 0}, at(0.1))
    assert ops(cmds) == [("exit", "A")] and cmds[0].inc == 1
