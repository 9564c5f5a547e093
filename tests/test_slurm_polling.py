"""How often the Slurm source asks slurmctld (issue 48): sinfo at every poll (it finds the nodes
to harvest), squeue at every poll only while a pilot of ours is pending or starting, else every
SQUEUE_BACKSTOP_S (a pilot's own end reaches the hub at once; squeue is the backstop for one that
ended without a word). On 128 slurmd under the Summit trace this took the harvester's reads
from 4 RPCs a second to 2.4 (bench.facility). Slurm's commands are fakes that record their argv."""
from __future__ import annotations

import json
import time
from pathlib import Path

from core.pilots.script import Pilot
from core.pilots.settings import PilotSettings
from core.pilots.source import SQUEUE_BACKSTOP_S
from tests.support.fakeslurm import fake_slurm, slurm_source


def reads(record: Path, command: str) -> int:
    return sum(1 for line in record.read_text().splitlines() if json.loads(line)[0] == command)


def test_squeue_is_read_while_a_pilot_waits_and_otherwise_every_few_seconds(tmp_path, monkeypatch):
    record = fake_slurm(tmp_path, monkeypatch)
    source = slurm_source(PilotSettings())
    try:
        sinfo0, squeue0 = reads(record, "sinfo"), reads(record, "squeue")
        for _ in range(3):
            source.poll_slurm()
        assert reads(record, "sinfo") - sinfo0 == 3, "sinfo at every poll"
        assert reads(record, "squeue") - squeue0 == 1, "squeue once: no pilot waits"
        source._squeue_at -= SQUEUE_BACKSTOP_S
        source.poll_slurm()
        assert reads(record, "squeue") - squeue0 == 2, "and again once the backstop interval is over"
        for k in (3, 4):
            with source.book.lock:           # a pilot sent, not yet connected
                source.book.pilots["77"] = Pilot("77", "node1", time.monotonic() - 1)
            source.poll_slurm()
            assert reads(record, "squeue") - squeue0 == k, "squeue at every poll while a pilot waits"
    finally:
        source.close()
