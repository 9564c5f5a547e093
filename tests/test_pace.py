"""examples/pace.py: the least time a step of an example job takes, from --step-seconds or,
while it holds a number, from --pace-file, read again whenever the file changes."""
from __future__ import annotations

import time

from examples.pace import Pace
from tests.support.pace import PaceFile


def test_without_a_file_the_pace_is_step_seconds(tmp_path):
    assert Pace(0.03).seconds() == 0.03
    assert Pace(0.03, str(tmp_path / "absent")).seconds() == 0.03


def test_the_file_replaces_step_seconds_and_each_change_is_read(tmp_path):
    f = PaceFile(tmp_path, 0.5)
    pace = Pace(0.03, str(f.path))
    assert pace.seconds() == 0.5
    f.set(0.25)
    assert pace.seconds() == 0.25
    f.release()
    assert pace.seconds() == 0.0
    f.path.unlink()
    assert pace.seconds() == 0.03, "a file gone: back to --step-seconds"


def test_an_unreadable_number_keeps_step_seconds_until_one_reads(tmp_path):
    path = tmp_path / "pace"
    path.write_text("")
    pace = Pace(0.03, str(path))
    assert pace.seconds() == 0.03
    path.write_text("fast")
    assert pace.seconds() == 0.03
    path.write_text("-2")
    assert pace.seconds() == 0.0, "a negative pace is no pace"
    path.write_text("0.2\n")
    assert pace.seconds() == 0.2


def test_hold_sleeps_out_the_rest_of_the_step_at_the_pace_of_the_moment(tmp_path):
    f = PaceFile(tmp_path, 1.0)
    pace = Pace(0.0, str(f.path))
    t0 = time.monotonic()
    pace.hold(t0 - 0.5)
    assert 0.4 <= time.monotonic() - t0 < 1.0, "half the step was already spent"
    f.release()
    t1 = time.monotonic()
    pace.hold(t1)
    assert time.monotonic() - t1 < 0.5, "released: no sleep"
