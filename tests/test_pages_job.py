"""The job page's progress chart (app/pages/job.py) from what a real controller stored in a real
SQLite file: a job that loses every node keeps its progress flat until it runs again."""
from __future__ import annotations

import dash
import pytest

from app.queries import History
from core.model import Event, EventKind
from core.store import Store
from tests.support.files import ROOT
from tests.support.sim import T0, controller, job

dash.Dash(__name__, use_pages=True, pages_folder=str(ROOT / "app" / "pages"))
from app.pages.job import progress_figure  # noqa: E402  (a page registers itself on import)


def test_progress_stays_flat_while_the_job_holds_no_nodes(tmp_path):
    nodes = [f"a01n{i:02d}" for i in range(1, 5)]
    store = Store(tmp_path / "run.db")
    ctl, clock = controller(nodes, store=store)
    ctl.submit(job("J", total=1e7))
    ctl.step()
    assert len(ctl.held["J"]) == 4
    clock.advance_to(T0 + 100)       # every node taken back: the job holds none for 500 s
    ctl.step([Event(T0 + 100, EventKind.NODE_LEAVE, node=n) for n in nodes])
    assert not ctl.held.get("J")
    clock.advance_to(T0 + 600)
    ctl.step([Event(T0 + 600, EventKind.NODE_JOIN, node=n) for n in nodes])
    assert len(ctl.held["J"]) == 4
    clock.advance_to(T0 + 700)
    ctl.step()
    ctl.flush()
    store.close()

    thr = History(tmp_path / "run.db").job_throughput("J")
    done = ctl.dispatcher.progress(ctl.jobs["J"], T0 + 700)
    fig = progress_figure(thr, T0 + 700, {"progress": done / 1e7}, 1e7)
    line = dict(zip(fig["data"][0]["x"], fig["data"][0]["y"]))
    lost, back = line.get((T0 + 100) * 1000), line.get((T0 + 600) * 1000)
    assert lost is not None, f"no progress point where the job lost its nodes: {sorted(line)}"
    # ran 100 s at 4 nodes (350/s), less the reclaim's 12 s pause, then nothing until it got nodes back
    assert lost == pytest.approx(100 * (100 - 12) * 350 / 1e7) and back == pytest.approx(lost)
    assert not [t for t in thr if t["nodes"] == 0 and t["samples_per_second"]], "a job on no nodes trains at 0/s"


def test_the_resubmit_button_shows_for_a_failed_or_cancelled_job_and_continues_it(tmp_path, monkeypatch):
    """The job page's Resubmit (app/pages/job.py) on a live harvester with simulated workers: shown
    to the job's owner and staff once it is cancelled, it makes a new job from where the old one
    stopped and links to it; someone else is refused and nothing is made."""
    import time

    from app import context
    from app.auth import User
    from app.pages import job as page
    from core.assemble import build
    from core.schemas import JobSpec
    from core.settings import HarvesterSettings

    h = build(HarvesterSettings.parse({"db": tmp_path / "live.db", "tick_s": 0.05,
                                       "live": {"dispatch": "simulated", "local_nodes": 2}}))
    h.open()
    try:
        alice, bob = User("alice", "user", ""), User("bob", "user", "")
        user = {"now": alice}
        monkeypatch.setattr(context, "harvester", h)
        monkeypatch.setattr(context, "history", History(tmp_path / "live.db"))
        monkeypatch.setattr(context, "current_user", lambda: user["now"])
        old = h.submit(JobSpec(name="page job", min_nodes=1, max_nodes=2, total_samples=1e9, curve="1:1000, 2:1900"),
                       "alice")
        shown = lambda: page.update_job(0, old.id)[-1]
        assert shown() == {"display": "none"}, "a running job is not resubmitted"
        time.sleep(0.5)
        h.cancel(old.id)
        h.controller.flush()
        assert shown() == {}
        user["now"] = bob
        assert shown() == {"display": "none"}
        refused = page.resubmit(1, old.id)
        assert "Only its owner or staff" in str(refused) and len(h.snapshot.jobs) == 1
        user["now"] = alice
        said = page.resubmit(1, old.id)
        new = [j for j in h.snapshot.jobs if j["id"] != old.id]
        assert len(new) == 1 and new[0]["owner"] == "alice", h.snapshot.jobs
        assert h.job(new[0]["id"]).resubmitted_from == old.id and new[0]["samples_done"] == h.job(old.id).samples_done > 0
        assert f"/jobs/{new[0]['id']}" in str(said) and "Resubmitted as" in str(said), said
    finally:
        h.close()
