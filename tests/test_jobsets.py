"""Job-set files (core/jobsets.py): errors that name file and line, and the shipped job sets."""
from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import InputError
from core.jobsets import load_jobset
from tests.support.files import write_jobset


@pytest.mark.parametrize("row, words", [
    ("A,m,2021-02-10T00:00:00Z,4,2,100,18,12,1;2,1;2", "min_nodes (4) > max_nodes (2)"),
    ("A,m,2021-02-10T00:00:00Z,1,2,100,18,12,0;2,1;2", "node counts must be positive"),
    ("A,m,2021-02-10T00:00:00Z,1,2,100,18,12,1;2,1;2;3", "2 node counts but 3 throughputs"),
    ("A,m,2021-02-10T00:00:00Z,1,2,abc,18,12,1;2,1;2", "total_samples"),
    ("A,m,not-a-time,1,2,100,18,12,1;2,1;2", "submit_time"),
])
def test_jobset_errors_name_file_and_line(tmp_path, row, words):
    p = write_jobset(tmp_path / "jobs.csv", ["OK,m,2021-02-10T00:00:00Z,1,2,100,18,12,1;2,1;2", row])
    with pytest.raises(InputError) as e:
        load_jobset(p)
    assert e.value.line == 3 and words in str(e.value), str(e.value)


def test_jobset_unknown_column(tmp_path):
    p = tmp_path / "jobs.csv"
    p.write_text("job,submit_time,min_nodes,max_nodes,total_samples,nodes,samples_per_second,colour\n")
    with pytest.raises(InputError) as e:
        load_jobset(p)
    assert e.value.line == 1 and "unknown column(s) colour" in str(e.value)


def test_shipped_jobsets_load():
    for name in ("jobs-imagenet-1001.csv", "jobs-hps-shufflenet-1000.csv"):
        jobs = load_jobset(Path("data") / name)
        assert len(jobs) >= 1000 and all(j.true_curve is not None for j in jobs)
