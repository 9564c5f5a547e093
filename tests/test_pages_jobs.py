"""The jobs table (app/pages/jobs.py): its curve column sorts by confidence and filters."""
from __future__ import annotations

import dash
import pytest

from core.snapshot import Snapshot
from tests.support.files import ROOT

dash.Dash(__name__, use_pages=True, pages_folder=str(ROOT / "app" / "pages"))
from app.pages.jobs import CONFIDENCE, table_rows  # noqa: E402  (a page registers itself on import)


def table_job(jid: str, word: str) -> dict:
    return {"id": jid, "name": jid, "owner": "", "state": "running", "nodes": 1, "samples_per_second": 1.0,
            "progress": 0.5, "eta": None, "submit_time": 0.0, "confidence": word}


def listing(jobs: list[dict]) -> Snapshot:
    """A snapshot listing `jobs` (the table reads the store only for jobs it does not list)."""
    return Snapshot(0.0, 0, "running", (), (), (), jobs=tuple(jobs))


def test_the_curve_column_sorts_by_confidence_and_filters():
    jobs = [table_job(f"J{k}", w) for k, w in enumerate(("high", "prior", "medium", "given", "low", "high"))]
    rows, total = table_rows(listing(jobs), None, None, "", [{"column_id": "curve", "direction": "asc"}], 0)
    assert total == 6 and [r["curve"] for r in rows] == ["prior", "given", "low", "medium", "high", "high"]
    rows, _ = table_rows(listing(jobs), None, None, "", [{"column_id": "curve", "direction": "desc"}], 0)
    assert [r["curve"] for r in rows][:2] == ["high", "high"]
    rows, total = table_rows(listing(jobs), None, None, "", None, 0, curves=["high", "low"])
    assert total == 3 and {r["curve"] for r in rows} == {"high", "low"}
    assert set(CONFIDENCE) == {"prior", "given", "low", "medium", "high"}


@pytest.mark.parametrize("word", ["", None])
def test_a_job_without_a_word_still_sorts(word):
    jobs = [table_job("J1", "high"), {**table_job("J2", "low"), "confidence": word}]
    rows, total = table_rows(listing(jobs), None, None, "", [{"column_id": "curve", "direction": "asc"}], 0)
    assert total == 2 and rows[0]["curve"] in ("high", "")
