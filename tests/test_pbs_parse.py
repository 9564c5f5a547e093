"""Reading PBS's JSON (core/pbs/parse.py) on what a real OpenPBS 23.06 printed
(tests/data/pbs/, recorded by tests/support/record_pbs.py: a main job on vn001, a pilot on vn002,
a pilot requeued by a main job on vn003, vn004 offline, a pilot suspended by a main job on
vn006, a pilot holding vn007's 2 GPUs, a job that failed with status 3, one deleted while
queued), and what the pilot book does with those records."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from core.model import LEFT_PREEMPTED, EventKind
from core.pbs.cli import check_job_ids, valid_job_id
from core.pbs.parse import Unreadable, parse_jobs, parse_nodes, parse_version
from core.pbs.provider import pilot_argv, qsub_options
from core.pilots.base import BadJobId, batch_job_id
from core.pilots.book import PilotBook
from core.pilots.hub import PilotLink
from core.pilots.script import script
from core.pilots.settings import PilotSettings

DATA = Path(__file__).parent / "data" / "pbs"


def nodes() -> dict:
    return {n.name: n for n in parse_nodes((DATA / "pbsnodes-av.json").read_text())}


def jobs(name: str = "qstat-fx.json") -> dict:
    return {j.id: j for j in parse_jobs((DATA / name).read_text())}


def test_vnodes_read_as_pbs_printed_them():
    n = nodes()
    assert list(n)[:3] == ["pbshead", "vn001", "vn002"], "PBS's own order"
    assert not n["pbshead"].free and n["pbshead"].ncpus == 0, "a multi-vnode host's natural vnode takes no job"
    assert n["vn005"].free and not n["vn005"].runs_a_job and n["vn005"].gpus == 0
    assert n["vn008"].free and n["vn008"].gpus == 2
    assert n["vn001"].runs_a_job and not n["vn001"].free and n["vn001"].jobs == ("0.pbshead",)
    assert not n["vn004"].free and not n["vn004"].unreachable and n["vn004"].label == "offline"
    assert all(x.address == "pbshead" for x in n.values())
    assert parse_version((DATA / "version.txt").read_text()) == "23.06.06"


def test_jobs_read_with_their_state_vnode_and_end():
    j = jobs()
    assert j["1.pbshead"].running and j["1.pbshead"].node == "vn002" and j["1.pbshead"].user == "root"
    requeued = j["2.pbshead"]              # preempted by requeue: queued again, on no vnode
    assert not requeued.running and not requeued.ended and requeued.run_count == 1 and requeued.node == ""
    suspended = j["5.pbshead"]
    assert suspended.suspended and not suspended.running and not suspended.ended
    assert j["7.pbshead"].node == "vn007"
    assert j["8.pbshead"].ended and j["8.pbshead"].failed and j["8.pbshead"].exit_status == 3
    assert j["9.pbshead"].ended and not j["9.pbshead"].failed and not j["9.pbshead"].not_its_fault
    live = jobs("qstat-f.json")
    assert "8.pbshead" not in live and "1.pbshead" in live, "without -x: live jobs only"


@pytest.mark.parametrize("text", ["", "{", "[]", '{"Jobs": []}', '{"Jobs": {"1.x": {"Job_Name": "a"}}}'])
def test_output_that_is_not_pbs_json_is_unreadable(text):
    if text == "":
        assert parse_jobs(text) == []
        return
    with pytest.raises(Unreadable):
        parse_jobs(text)
    with pytest.raises(Unreadable):
        parse_nodes(text.replace("Jobs", "nodes").replace("Job_Name", "Mom"))


def test_job_ids_are_checked_before_any_command():
    assert all(valid_job_id(j) and batch_job_id(j) for j in ("1.pbshead", "123[4].pbs-01.site.org"))
    for bad in ("-x", "1", "1.pbshead -W", "1.-pbshead", "", "1.pbshead\n"):
        assert not valid_job_id(bad)
        with pytest.raises(BadJobId):
            check_job_ids(["1.pbshead", bad])


def test_a_pilot_asks_for_its_vnode_whole_with_its_gpus():
    s = PilotSettings(log_dir="/logs", time_limit_min=90, account="proj1")
    opts = qsub_options(s, "vn008", nodes()["vn008"])
    assert opts[opts.index("-l") + 1] == "select=1:vnode=vn008:ncpus=1:ngpus=2"
    assert "walltime=01:30:00" in opts and opts[opts.index("-q") + 1] == "scavenger"
    assert opts[opts.index("-r") + 1] == "y", "rerunnable: PBS preempts by requeue only jobs it can requeue"
    assert opts[opts.index("-o") + 1] == "/logs/" and opts[opts.index("-A") + 1] == "proj1"
    argv = pilot_argv(s, script(s))
    assert argv[:2] == [s.python, "-c"] and "pilot_job import main" in argv[2] and not argv[2].startswith("#!")


def test_a_suspended_pilot_gives_its_node_back_and_is_over():
    """PBS suspends a pilot (preempt_order S) rather than requeue it: its node leaves the job at the
    next read (the pilot cannot say so: SIGSTOP), and the source deletes it."""
    n, j = nodes(), jobs()
    book = PilotBook(PilotSettings(), ["vn006"], "PBS")
    book.submitted("5.pbshead", "vn006")
    link = PilotLink("5.pbshead", "vn006", 1, None, time.time())
    assert book.hello(link) == "join"
    book.take_events()
    cancel, dropped, left = book.check({"5.pbshead": j["5.pbshead"]}, {"5.pbshead"}, n)
    assert dropped == ["5.pbshead"] and left and cancel == []
    (ev,) = book.take_events()
    assert ev.kind is EventKind.NODE_LEAVE and ev.node == "vn006" and ev.cause == LEFT_PREEMPTED
    assert book.free_nodes(n) == [], "vn006 runs the main job now"
