"""Pilots for thousands of idle nodes go out within a minute (issue 59): a poll submits up to
`submit_batch` pilots, `submit_parallel` sbatch at once, and stops at the first that Slurm
refuses; the pilots sent for one lot of free nodes, over as many polls as it takes, are one
burst (core/pilots/joins.py). Slurm's commands are fakes on PATH that record when each sbatch ran."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from core.pilots.settings import PilotSettings
from tests.support.fakeslurm import fake_slurm, slurm_source
from tests.support.waiting import wait

NODES = 12
SBATCH = """#!{python}
import json, os, sys, time
t0 = time.monotonic()
time.sleep(0.4)
fail = {fail}
with open({spans!r}, "a") as f:
    f.write(json.dumps([t0, time.monotonic()]) + "\\n")
if fail:
    print("sbatch: error: Batch job submission failed: Socket timed out", file=sys.stderr)
    sys.exit(1)
print(str(1000 + int(t0 * 1e6) % 1000000) + ";cluster")
"""


def sbatch_spans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> Path:
    """Slurm with NODES idle nodes, and an sbatch that takes 0.4 s; returns where it records its spans."""
    lines = [f"node{i}|idle|scavenger|(null)|(null)|" for i in range(1, NODES + 1)]
    fake_slurm(tmp_path, monkeypatch, sinfo="\n".join(lines))
    spans = tmp_path / "spans.jsonl"
    sbatch = tmp_path / "bin" / "sbatch"
    sbatch.write_text(SBATCH.format(python=sys.executable, spans=str(spans), fail=fail))
    sbatch.chmod(0o755)
    return spans


def most_at_once(spans: Path) -> tuple[int, int]:
    """(sbatch calls, the most that ran at the same moment)."""
    sp = [json.loads(line) for line in spans.read_text().splitlines()] if spans.exists() else []
    return len(sp), max((sum(1 for a, b in sp if a <= t < b) for t, _ in sp), default=0)


@pytest.mark.parametrize("parallel", [1, 4])
def test_a_poll_submits_its_batch_parallel_at_once(tmp_path, monkeypatch, parallel):
    spans = sbatch_spans(tmp_path, monkeypatch)
    source = slurm_source(PilotSettings(submit_batch=8, submit_parallel=parallel))
    try:
        source.want(NODES, [])
        source.poll_slurm()
        assert most_at_once(spans) == (8, parallel)
        assert len(source.book.pilots) == 8 and source._more, "4 nodes left for the next poll"
        source.poll_slurm()
        assert most_at_once(spans)[0] == NODES and not source._more
        assert {p.burst for p in source.book.pilots.values()} == {1}, "a cold start over two polls is one burst"
        with source.book.lock:
            source.book.pilots.clear()              # as if they had all ended
        source.poll_slurm()
        assert {p.burst for p in source.book.pilots.values()} == {2}, "the next lot is a burst of its own"
    finally:
        source.close()


def test_the_first_refusal_ends_the_round(tmp_path, monkeypatch):
    spans = sbatch_spans(tmp_path, monkeypatch, fail=True)
    source = slurm_source(PilotSettings(submit_batch=NODES, submit_parallel=4))
    try:
        source.want(NODES, [])
        source.poll_slurm()
        calls, _ = most_at_once(spans)
        assert 1 <= calls <= 4, f"{calls} sbatch after the first refusal: only those already under way"
        assert source.book.pilots == {}
    finally:
        source.close()


def test_a_burst_sends_its_next_batch_without_waiting_for_the_next_poll(tmp_path, monkeypatch):
    """12 free nodes, 4 a batch, a poll every 60 s: the three batches go one after another."""
    spans = sbatch_spans(tmp_path, monkeypatch)
    source = slurm_source(PilotSettings(submit_batch=4, submit_parallel=4, poll_s=60.0))
    try:
        source.want(NODES, [])
        source.start()
        wait(lambda: most_at_once(spans)[0] == NODES, 30, "all 12 pilots sent, not one batch a minute")
        assert {p.burst for p in source.book.pilots.values()} == {1}
    finally:
        source.close()
