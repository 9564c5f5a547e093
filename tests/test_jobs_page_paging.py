"""The Jobs page pages through every job (issue 57, item 5): the controller keeps the live jobs and
the newest ended ones in memory, so the table lists the older ended jobs from the store, filtered,
sorted and paged there with the ones the snapshot lists. A real harvester (simulated workers) on
a real SQLite file, the page's own callback."""
from __future__ import annotations

import random
from functools import cmp_to_key

import dash
import pytest

from tests.support.files import ROOT

dash.Dash(__name__, use_pages=True, pages_folder=str(ROOT / "app" / "pages"))
from app import context  # noqa: E402
from app.job_list import KEYS, JobQuery, _before, _Item, list_jobs  # noqa: E402
from app.pages import jobs as page  # noqa: E402  (a page registers itself on import)
from app.queries import History  # noqa: E402
from core.job_book import ENDED_KEPT  # noqa: E402
from core.schemas import JobSpec  # noqa: E402

ENDED = 300
NAMES = ["resnet", "bert", "gpt", "vit", "unet"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two live jobs and 300 cancelled ones (names and owners shuffled), all flushed."""
    from core.assemble import build
    from core.settings import HarvesterSettings
    db = tmp_path_factory.mktemp("jobs") / "live.db"
    h = build(HarvesterSettings.parse({"db": db, "tick_s": 0.05, "user_jobs_per_minute": 0, "user_jobs_per_day": 0,
                                       "live": {"dispatch": "simulated", "local_nodes": 2}}))
    h.open()
    rnd = random.Random(57)
    ended = []
    try:
        for k in range(ENDED):
            spec = JobSpec(name=f"{rnd.choice(NAMES)}-{k:03d}", min_nodes=1, max_nodes=2, total_samples=1e12,
                           curve="1:10, 2:19")
            ended.append(h.submit(spec, rnd.choice(["alice", "bob", "carol"]), staff=True).id)
            h.cancel(ended[-1])
        live = [h.submit(JobSpec(name=f"live-{k}", min_nodes=1, max_nodes=2, total_samples=1e12,
                                 curve="1:10, 2:19"), "dave", staff=True).id for k in range(2)]
        h.controller.flush()
        yield h, History(db), ended, live
    finally:
        h.close()


def callback(monkeypatch, run, states=None, text=None, sort_by=None, page_no=0, curves=None):
    h, history, *_ = run
    monkeypatch.setattr(context, "harvester", h)
    monkeypatch.setattr(context, "history", history)
    rows, pages, count = page.update_table(0, states, text, sort_by or page.DEFAULT_SORT, page_no, curves)
    return [r["link"].split("]")[0][1:] for r in rows], pages, count


def test_the_table_pages_through_every_job_the_oldest_on_the_last_page(monkeypatch, run):
    h, _, ended, live = run
    assert ENDED > ENDED_KEPT and len(h.snapshot.jobs) == ENDED_KEPT + 2, "the oldest ended left memory"
    first, pages, count = callback(monkeypatch, run)
    assert count == f"{ENDED + 2:,} jobs" and pages == -(-(ENDED + 2) // page.PAGE_SIZE)
    assert set(first[:2]) == set(live), "live jobs first"
    last, *_ = callback(monkeypatch, run, page_no=pages - 1)
    assert last[-1] == ended[0], "the oldest ended job closes the last page"
    seen = [i for p in range(pages) for i in callback(monkeypatch, run, page_no=p)[0]]
    assert seen == live[::-1] + ended[::-1] or seen == live + ended[::-1], "every job once, ended ones latest first"


def test_the_filters_reach_the_jobs_only_the_store_holds(monkeypatch, run):
    h, history, ended, live = run
    rows, pages, count = callback(monkeypatch, run, states=["cancelled"])
    assert count == f"{ENDED:,} jobs" and pages == -(-ENDED // page.PAGE_SIZE)
    rows, _, count = callback(monkeypatch, run, text="-007")
    assert rows == [ended[7]] and count == "1 job"
    owner = history.job_row(ended[3])["owner"]
    mine = [i for i in ended if history.job_row(i)["owner"] == owner]
    rows, pages, count = callback(monkeypatch, run, states=["cancelled", "done"], text=owner.upper())
    assert count == f"{len(mine):,} jobs" and pages == -(-len(mine) // page.PAGE_SIZE)
    tail, *_ = callback(monkeypatch, run, states=["cancelled"], text=owner, page_no=pages - 1)
    assert tail[-1] == mine[0]
    assert callback(monkeypatch, run, states=["queued", "running"])[2] == "2 jobs"
    assert callback(monkeypatch, run, curves=["given"])[2] == f"{ENDED + 2:,} jobs"
    assert callback(monkeypatch, run, curves=["high"])[2] == "0 jobs"


@pytest.mark.parametrize("order", sorted(KEYS))
@pytest.mark.parametrize("descending", [False, True])
def test_every_order_pages_as_one_sorted_list(run, order, descending):
    """The store's ORDER BY and the snapshot's sort keys agree: paging the merge, at any page
    size, gives the list that sorting every job at once gives."""
    h, history, ended, live = run
    snap = h.snapshot
    q = JobQuery(order=order, descending=descending)
    everything, total = list_jobs(snap, history, q, 0, 10_000)
    assert total == ENDED + 2 and sorted(j["id"] for j in everything) == sorted(ended + live)
    listed = {j["id"] for j in snap.jobs}
    rowid = history.rowids(ended + live)
    entries = [{**j, "rowid": rowid.get(j["id"], float("inf"))} for j in snap.jobs] + [
        {**snap.stored(history.job_row(i)), "rowid": rowid[i]} for i in ended if i not in listed]
    items = [_Item(j, KEYS[order](j), (0, n) if j["id"] in listed else (1, j["rowid"])) for n, j in enumerate(entries)]
    want = [it.entry["id"] for it in sorted(items, key=cmp_to_key(lambda a, b: -1 if _before(a, b, descending) else 1))]
    assert [j["id"] for j in everything] == want
    for size in (7, 20, 64):
        paged = [j["id"] for off in range(0, total, size) for j in list_jobs(snap, history, q, off, size)[0]]
        assert paged == want, f"page size {size}"
