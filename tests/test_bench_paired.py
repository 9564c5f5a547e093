"""bench.paired: the same starts replayed under two revisions (git worktrees) or two variants, and
their paired differences (real replays of the shipped trace, 1-2 h windows)."""
from __future__ import annotations

import json
import subprocess

import pytest

from bench import paired, policy


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def worktrees() -> str:
    return subprocess.run(["git", "-C", str(paired.ROOT), "worktree", "list"], capture_output=True,
                          text=True, check=True).stdout


def test_one_revision_against_itself_differs_by_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """Both sides checked out from HEAD in their own worktrees: the replays are deterministic, so
    every paired difference is exactly 0, and the worktrees are gone afterwards."""
    before = worktrees()
    head = paired.commit_of("HEAD")
    assert paired.main(["--base", "HEAD", "--new", "HEAD", "--windows", "2021-02-10T20:00:00Z",
                        "--repeat", "2", "--step", "30", "--hours", "1", "--json"]) == 0
    out = capsys.readouterr().out
    last = last_json(out)
    assert last["base"] == last["new"] == f"auto @ {head[:12]}"
    assert last["starts"] == ["2021-02-10T20:00:00Z", "2021-02-10T20:30:00Z"]
    assert last["diff"] == {"mean": 0.0, "sd": 0.0, "se": 0.0, "better": 0, "n": 2}
    for r in last["ratios"].values():
        assert 50.0 < r["base"] == r["new"] <= 100.0 + 1e-9
    assert "2021-02-10T20:00:00Z       2" in out
    assert worktrees() == before


def test_two_variants_pair_as_bench_policy_measures_them(capsys: pytest.CaptureFixture[str]) -> None:
    """milp@10 against milp@60 in this tree: each side's ratio is the one bench.policy reports for
    the same window, and the difference is theirs."""
    window = ["--hours", "2"]
    assert policy.main(["--json", *window, "--only", "milp@10,milp@60"]) == 0
    ratios = last_json(capsys.readouterr().out)["ratios"]
    assert paired.main(["--base-variant", "milp@10", "--variant", "milp@60", "--windows",
                        policy.START, "--repeat", "1", *window, "--json"]) == 0
    last = last_json(capsys.readouterr().out)
    assert last["base"] == "milp@10 @ working tree" and last["new"] == "milp@60 @ working tree"
    got = last["ratios"][policy.START]
    assert got["base"] == pytest.approx(100 * ratios["milp@10"], abs=1e-3)
    assert got["new"] == pytest.approx(100 * ratios["milp@60"], abs=1e-3)
    assert got["new"] != got["base"]
    assert last["diff"]["mean"] == pytest.approx(got["new"] - got["base"], abs=1e-4)
    assert last["diff"]["better"] == (got["new"] > got["base"])


@pytest.mark.parametrize("argv, says", [
    ([], "one of the arguments --base --base-variant is required"),
    (["--base", "HEAD", "--base-variant", "auto"], "not allowed with"),
    (["--base", "no-such-revision-anywhere"], "'no-such-revision-anywhere' is not a commit"),
    (["--base-variant", "milp@45"], "unknown variant 'milp@45'"),
    (["--base-variant", "auto", "--variant", "fastest"], "unknown variant 'fastest'"),
    (["--base-variant", "auto", "--repeat", "0"], "must be positive"),
    (["--base-variant", "auto", "--windows", "soon"], "--windows"),
    (["--base-variant", "auto", "--windows", " , "], "names no window"),
    (["--base-variant", "auto", "--windows", "2021-02-10T20:00:00Z,2021-02-10T20:10:00Z"], "overlap"),
    (["--base-variant", "auto", "--jobs", "no/such.csv"], "no such file"),
])
def test_bad_arguments_are_refused_before_any_replay(argv: list[str], says: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    before = worktrees()
    with pytest.raises(SystemExit) as e:
        paired.main(argv)
    assert e.value.code == 2
    assert says in capsys.readouterr().err
    assert worktrees() == before
