"""An ended job's worker logs read from its files (core/worklogs.py): the newest file of each
worker key (the last start's last incarnation or generation), its last lines read from its end
only, rank 0's worker first, never through a link, never outside the job's folder."""
from __future__ import annotations

import os

import pytest

from core import worklogs
from core.worklogs import job_logs, newest_logs, tail


def _write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_the_newest_log_of_each_worker_key_wins(tmp_path):
    job = tmp_path / "u-1"
    _write(job / "node-a-s1-0.log", ["a first"])
    _write(job / "node-a-s1-10.log", ["a tenth"])            # 10 after 9: numbers, not text
    _write(job / "node-a-s1-9.log", ["a ninth"])
    _write(job / "node-a-s2-0.log", ["a second start"])      # a later start of the harvester wins
    _write(job / "b:1-s1-g3.log", ["b generation 3"])        # a torchrun rank of a two-slot node
    _write(job / "b:1-s1-g12.log", ["b generation 12"])
    _write(job / "coordinator.json", ["{}"])
    (job / "checkpoint").mkdir()
    found = newest_logs(tmp_path, "u-1")
    assert {k: p.name for k, p in found.items()} == {"node-a": "node-a-s2-0.log", "b:1": "b:1-s1-g12.log"}
    assert job_logs(tmp_path, "u-1", 5) == {"b:1": ["b generation 12"], "node-a": ["a second start"]}
    assert list(job_logs(tmp_path, "u-1", 5, order=["node-a", "b:1"])) == ["node-a", "b:1"]   # rank 0's first


def test_keys_without_an_order_come_in_natural_order(tmp_path):
    for n in (10, 2, 1):
        _write(tmp_path / "u-2" / f"node{n}-s1-0.log", [f"n{n}"])
    assert list(job_logs(tmp_path, "u-2", 1)) == ["node1", "node2", "node10"]
    assert list(job_logs(tmp_path, "u-2", 1, order=["node10"])) == ["node10", "node1", "node2"]


def test_only_the_end_of_a_long_file_is_read(tmp_path, monkeypatch):
    path = _write(tmp_path / "u-3" / "n-s1-0.log", [f"line {i}" for i in range(200_000)])
    assert tail(path, 3) == ["line 199997", "line 199998", "line 199999"]
    assert tail(path, 0) == []
    read = []
    real = os.fdopen

    def counting(fd, *a, **kw):
        f = real(fd, *a, **kw)
        orig = f.read
        f.read = lambda n=-1: (read.append(n), orig(n))[1]
        return f
    monkeypatch.setattr(worklogs.os, "fdopen", counting)
    assert tail(path, 40)[-1] == "line 199999"
    assert read and all(0 < n <= 8192 for n in read) and sum(read) < 64 * 1024, read
    monkeypatch.setattr(worklogs, "MAX_BYTES", 16 * 1024)       # a file of one endless line: bounded too
    path.write_bytes(b"x" * 1_000_000)
    assert tail(path, 5) == ["…" + "x" * (8 * 1024) + " …[cut 8192 bytes]"]   # begun earlier, cut to 8 KiB


def test_no_link_is_followed_and_no_path_leaves_the_log_folder(tmp_path):
    secret = _write(tmp_path / "secret.txt", ["the harvester's secret"])
    job = tmp_path / "logs" / "u-4"
    job.mkdir(parents=True)
    os.symlink(secret, job / "n-s1-0.log")
    assert tail(job / "n-s1-0.log", 5) == []
    assert job_logs(tmp_path / "logs", "u-4", 5) == {}
    _write(tmp_path / "logs" / "n-s1-0.log", ["not a job's"])
    for bad in ("..", ".", "", "../logs", "u-4/..", "a\\b"):
        assert newest_logs(tmp_path / "logs" / "u-4", bad) == {}, bad
    assert job_logs(tmp_path / "logs", "u-missing", 5) == {}


@pytest.mark.parametrize("name", ["n-s1.log", "n-0.log", "-s1-0.log", "n-s1-0.log.1", "n-sX-0.log"])
def test_files_that_are_no_worker_log_are_left_out(tmp_path, name):
    _write(tmp_path / "u-5" / name, ["?"])
    assert newest_logs(tmp_path, "u-5") == {}
