"""Whose fault a lost node is (issue 56, items 1-2): node faults hold the node out until a check
passes and never count against the job; the job's own error fails it when it comes from every
node it held (within seconds, with the step) or follows it across distinct nodes; one node's
error alone does not. Pure rules first, then real worker processes (local transport) with a
real store."""
from __future__ import annotations

import os
import signal
import sys
import time

from core import failures
from core.assemble import build
from core.dispatchers.blame import JobFaults, consequence, node_caused, signature
from core.dispatchers.node_health import NodeHealth
from core.failures import Failure
from core.schemas import JobSpec
from core.settings import HarvesterSettings
from tests.support.files import ROOT
from tests.support.procs import leftovers
from tests.support.waiting import wait

SCRIPT = ROOT / "tests" / "data" / "scripts" / "raise_at_step.py"


def exc(node: str, msg: str = "FileNotFoundError: [Errno 2] No such file or directory: '/x'") -> Failure:
    return failures.named(failures.EXCEPTION, msg, node)


def test_what_is_the_nodes_fault_and_what_is_nobodys():
    assert node_caused(failures.named(failures.UNREACHABLE, "node3 did not answer", "node3"))
    assert node_caused(failures.named(failures.HUNG, "no heartbeat from node3 for 15 s", "node3"))
    assert node_caused(failures.from_exit([], -signal.SIGKILL, "n"))
    assert node_caused(failures.from_exit([], -signal.SIGTERM, "n"))
    assert not node_caused(failures.from_exit([], -signal.SIGSEGV, "n")), "a crash of the script is its own"
    assert not node_caused(exc("n"))
    assert not node_caused(failures.from_exit(["Traceback (most recent call last):", "MemoryError"], 1, "n"))
    peer = failures.from_exit(["Traceback (most recent call last):",
                               "RuntimeError: Connection closed by peer [10.0.0.3]:1234"], 1, "n")
    assert peer.kind == failures.PEER_LOST and consequence(peer) and not node_caused(peer)
    assert not consequence(exc("n"))


def test_the_same_error_from_every_node_fails_the_job_and_one_nodes_does_not():
    f = JobFaults(window_s=3600.0, max_nodes=3)
    assert f.add("a", exc("a"), ["a", "b", "c"], 0.0) is None
    assert f.add("b", exc("b"), ["b", "c"], 0.5) is None
    why = f.add("c", exc("c"), ["c"], 1.0)
    assert why and "every node" in why, why
    lone = JobFaults(window_s=3600.0, max_nodes=3)
    assert lone.add("a", exc("a"), ["a", "b"], 0.0) is None, "one node's error: the job shrinks and trains on"
    assert lone.add("a", exc("a", "ValueError: other"), ["a", "b"], 100.0) is None
    assert lone.add("b", exc("b", "KeyError: 'x'"), ["a", "b"], 200.0) is None, "different errors on 2 nodes"
    assert "3 distinct nodes" in (lone.add("c", exc("c", "OSError: disk"), ["b", "c"], 300.0) or "")
    addresses = [exc(n, f"[rank{i}]: RuntimeError: bad reply from 10.0.0.{i}:2950{i} (pid 41{i}23)")
                 for i, n in enumerate("ab")]
    assert signature(addresses[0]) == signature(addresses[1]), "ranks' addresses and PIDs differ, the error does not"


def test_errors_further_apart_than_seconds_are_not_one_error_everywhere():
    f = JobFaults(window_s=3600.0, max_nodes=5)
    assert f.add("a", exc("a"), ["a", "b"], 0.0) is None
    assert f.add("b", exc("b"), ["b", "c"], 60.0) is None, "a minute later: not one error everywhere"
    assert f.add("c", exc("c"), ["c", "d"], 120.0) is None
    single = JobFaults(window_s=3600.0, max_nodes=5)
    assert "only node" in (single.add("a", exc("a"), ["a"], 0.0) or "")


def test_a_held_out_node_is_checked_with_back_off_and_comes_back_when_a_check_passes():
    h = NodeHealth(first_check_s=0.05, max_check_s=0.2)
    assert h.hold_out("n1", "n1 did not answer") and not h.hold_out("n1", "again"), "the first reason stays"
    assert h.is_out("n1") and h.due() == []
    time.sleep(0.06)
    assert h.due() == ["n1"] and h.due() == [], "one check at a time"
    h.failed("n1", "ssh: connect to host n1: No route to host")
    assert "No route to host" in h.states()["n1"] and "1 check(s) failed" in h.states()["n1"]
    assert h.due() == [], "it waits longer after a failed check"
    time.sleep(0.11)
    assert h.due() == ["n1"]
    for _ in range(5):
        h.failed("n1", "no")
    assert h.held_out()["n1"].next_at - time.monotonic() <= 0.2 + 1e-3, "never longer than max_check_s"
    sick = h.passed("n1")
    assert sick is not None and sick.reason == "n1 did not answer" and not h.is_out("n1")
    assert h.hold_out("n2", "x") and h.clear("n2") is not None and h.clear("n2") is None


def _harvester(db, nodes: int, **workers):
    return build(HarvesterSettings.parse({"db": db, "tick_s": 0.1, "live": {
        "dispatch": "local", "local_nodes": nodes, "profiler": False, "config": {"tfwd": 60},
        "trust_user_commands": True, "workers": {"rejoin_after_s": 1.0, **workers}}}))


def _events(h, job_id=None) -> list[tuple[str, str, str]]:
    h.controller.flush()
    rows = h.controller.store.db.execute(
        "select kind, coalesce(node, ''), coalesce(detail, '') from events" +
        (" where job = ?" if job_id else "") + " order by id", (job_id,) if job_id else ())
    return [tuple(r) for r in rows]


def _spec(on: str, at_step: int) -> JobSpec:
    return JobSpec(name=f"raises on {on}", min_nodes=1, max_nodes=3, total_samples=64 * 10 ** 6,
                   curve="1:100, 3:300", scale_up_seconds=0, scale_down_seconds=0, global_batch=64,
                   command=[sys.executable, str(SCRIPT), "--at-step", str(at_step), "--on", on])


def test_an_error_on_every_rank_fails_the_job_within_seconds_saying_the_step(tmp_path):
    h = _harvester(tmp_path / "live.db", 3)
    h.open()
    try:
        job = h.submit(_spec("all", 60), "alice")
        wait(lambda: (h.dispatcher.status(job.id) or {}).get("world_size") == 3, 120, "the job on 3 nodes",
             lambda: h.dispatcher.status(job.id))
        t_first = None

        def failed() -> bool:
            nonlocal t_first
            st = h.dispatcher.status(job.id) or {}
            if t_first is None and (st.get("committed_step") or 0) >= 59:
                t_first = time.monotonic()
            return h.snapshot.job(job.id)["state"] == "failed"
        wait(failed, 90, "the job failed", lambda: _events(h, job.id)[-5:])
        took = time.monotonic() - (t_first or time.monotonic())
        f = h.controller.jobs[job.id].failure
        assert f["kind"] == "exception" and "FileNotFoundError" in f["message"], f
        assert "every node" in f["message"] and "during training at step" in f["message"], f
        assert took <= 10.0, f"failed {took:.1f} s after the first rank reached the failing step"
        assert not h.dispatcher.node_states(), "an error of the job's own holds no node out"
    finally:
        h.close()
    wait(lambda: not leftovers(job.id), 15, "every worker process gone")


def test_one_nodes_own_error_does_not_fail_the_job_and_a_killed_node_is_held_out_until_checked(tmp_path):
    """local-2's ranks raise at step 40: the job trains on, local-2 is offered again (not held
    out); then local-1's worker is SIGKILLed from outside: held out, not counted, back once a
    check of it passes; the job is never failed."""
    h = _harvester(tmp_path / "live.db", 3, max_crashes=2)
    h.open()
    try:
        job = h.submit(_spec("local-2", 40), "alice")
        d = h.dispatcher
        st = lambda: d.status(job.id) or {}
        wait(lambda: st().get("world_size") == 3 and (st().get("committed_step") or 0) >= 45, 120,
             "the job past step 40 on 3 nodes", st)
        leaves = lambda n: [e for e in _events(h, job.id) if e[0] == "node_leave" and e[1] == n]
        wait(lambda: leaves("local-2"), 30, "local-2's error took it out of the job")
        assert "FileNotFoundError" in leaves("local-2")[0][2]
        assert "local-2" not in d.node_states(), "the job's own error is no fault of the node"
        victim = d._runs[job.id].handles["local-1"]
        os.kill(victim.pid, signal.SIGKILL)
        wait(lambda: "local-1" in d.node_states(), 10, "the killed node held out", d.node_states)
        assert "SIGKILL" in d.node_states()["local-1"]
        back = lambda: [e for e in _events(h) if e[0] == "node_join" and e[1] == "local-1" and e[2].startswith("back:")]
        wait(back, 15, "local-1 back once its check passed")
        assert h.snapshot.job(job.id)["state"] == "running", _events(h, job.id)[-6:]
        lost = [e for e in _events(h, job.id) if e[0] == "node_leave"]
        assert len(lost) >= 2 and h.snapshot.job(job.id)["state"] == "running", "2 losses, max_crashes 2: never failed"
    finally:
        h.close()
    wait(lambda: not leftovers(job.id), 15, "every worker process gone")


def test_a_generation_started_after_a_liveness_check_is_not_judged_by_it(tmp_path):
    """The issue's "node2 did not answer a liveness check" while only node3 had died: a torchrun
    generation started between a liveness check's send and its answer is absent from that
    answer, and was read as dead. Real rank processes (local transport)."""
    from core.dispatchers.restarts import RestartJobs, _Gen, _RestartRun
    from core.model import Curve, Job
    from core.transports.base import NodeSpec
    from core.transports.local import LocalTransport
    t = LocalTransport()
    specs = {n: NodeSpec(n) for n in ("n1", "n2")}
    lost: list[tuple[str, str]] = []
    jobs = RestartJobs(t, specs, tmp_path, lambda job, node, env, log: t.start(node, ["sleep", "60"], env, "", log),
                       dict, lambda fn, *a: fn(*a), lambda ev: None, lambda j, n, f: lost.append((n, f.message)))
    job = Job(id="j", min_nodes=1, max_nodes=2, total_samples=1e9, curve=Curve((1,), (1.0,)), launcher="torchrun",
              command=("sleep", "60"))
    run = jobs.runs["j"] = _RestartRun(job, tmp_path / "ckpt", target=["n1", "n2"], progress_at=time.monotonic())
    old = {"n1": t.start(specs["n1"], ["sleep", "60"], {}, "", str(tmp_path / "old.log"))}
    run.gen = _Gen(1, ["n1", "n2"], {k: t.start(specs[k], ["sleep", "60"], {}, "", str(tmp_path / f"{k}.log"))
                                     for k in ("n1", "n2")}, started_at=time.monotonic())
    try:
        jobs.check({old["n1"]: None})          # the answer to a check sent before this generation began
        assert lost == [] and len(run.gen.handles) == 2, "a generation the check never saw is not dead"
        jobs.check({h: True for h in run.gen.handles.values()})
        assert lost == [] and len(run.gen.handles) == 2
    finally:
        t.stop_many([*old.values(), *run.gen.handles.values()], 0.5)
