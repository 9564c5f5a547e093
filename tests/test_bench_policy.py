"""bench.policy: the rescale-free bound and the policies over one short window, and --repeat's
spread over shifted starts (real replays of the shipped trace, 2 h windows)."""
from __future__ import annotations

import json

import pytest

from bench import policy


def test_shifted_starts() -> None:
    assert policy.shifted("2021-02-10T20:00:00Z", 3, 25) == [
        "2021-02-10T20:00:00Z", "2021-02-10T20:25:00Z", "2021-02-10T20:50:00Z"]
    assert policy.shifted("2021-02-10T23:50:00+00:00", 2, 20)[1] == "2021-02-11T00:10:00Z"
    with pytest.raises(ValueError):
        policy.shifted("yesterday", 2, 10)


def test_spread_over_starts(capsys: pytest.CaptureFixture[str]) -> None:
    assert policy.main(["--json", "--hours", "2", "--only", "auto,milp@60", "--repeat", "2",
                        "--step", "30"]) == 0
    out = capsys.readouterr().out
    assert "Over 2 starts, 30 min apart" in out
    last = json.loads(out.strip().splitlines()[-1])
    spread = last["spread"]
    assert spread["starts"] == ["2021-02-10T20:00:00Z", "2021-02-10T20:30:00Z"]
    for name in ("auto", "milp@60"):
        first, second = spread["ratios"][name]
        assert first == last["ratios"][name]               # the table's window is the first start
        assert 0.5 < second <= 1.0 + 1e-9                  # no policy beats its start's bound
        assert spread["mean"][name] == pytest.approx((first + second) / 2, abs=1e-5)
    # each start is its own window, with its own bound
    assert spread["bound_samples"][0] == last["bound_samples"]
    assert spread["bound_samples"][1] != spread["bound_samples"][0]


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--repeat", "0"], ["--step", "-5"], ["--start", "soon", "--repeat", "2"],
                 ["--only", "milp@45"]):
        with pytest.raises(SystemExit) as e:
            policy.main(argv)
        assert e.value.code == 2
    assert "--start 'soon'" in capsys.readouterr().err
