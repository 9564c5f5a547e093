"""Nothing a job prints can stall the harvester (issue 57, items 1-3): a user's progress pattern
is matched in linear time and checked at registration, a log's end is read in time bounded by a
cap whatever its lines, and numbers read from job output are finite and non-negative.

The catastrophic match runs in a child process: on a backtracking engine it never returns, and
in this process it would hold the GIL for the rest of the run."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core import failures, worklogs
from core.dispatchers.restarts import RestartJobs
from core.model import LAUNCHER_TORCHRUN, Curve, EventKind, Job
from core.transports.base import Handle, NodeSpec
from core.transports.local import LocalTransport, tail_file
from core.transports.ssh import SshTransport
from tests.support.server import ROOT, start_app
from tests.support.sshd import SshdServer, sshd_server  # noqa: F401 - the fixture
from tests.support.regroup import Job as RegroupJob

CAP = 1 << 20                 # bytes read from a log's end at most (core.logtail.MAX_READ_BYTES)
LINE = 8 << 10                # a line's bytes at most before it is cut (core.logtail.MAX_LINE_BYTES)
CUT = re.compile(r" …\[cut (\d+) bytes\]$")
HUGE = 30 * 1024 * 1024       # the 30 MB line without a newline of the issue


def _huge_line(path: Path) -> Path:
    """A 30 MB log of one line with no newline, written without holding 30 MB."""
    with open(path, "wb") as f:
        for _ in range(HUGE // (1 << 20)):
            f.write(b"x" * (1 << 20))
    return path


# ---- 1. user patterns: RE2, checked at registration --------------------------------------------

@pytest.fixture(scope="module")
def app(tmp_path_factory):
    proc = start_app(tmp_path_factory.mktemp("hostile"), "--fresh", "--racks", "d30,e04",
                     "--start", "2021-02-12T19:30:00Z")
    yield proc
    proc.stop()


def _register(app, pattern: str) -> tuple[int, dict]:
    body = {"name": "pattern probe", "min_nodes": 1, "max_nodes": 2, "total_samples": 1e6,
            "curve": "1:100, 2:190", "launcher": "torchrun", "progress_pattern": pattern}
    status, answer = app.request("POST", "/api/jobs", raw=json.dumps(body).encode(), token=app.token("alice"))
    if status == 201:
        app.request("DELETE", f"/api/jobs/{answer['id']}", token=app.token("staff1"))
    return status, answer


@pytest.mark.parametrize("pattern", [
    r"samples=(\d+) \1",                   # a backreference
    r"samples=(\d+)(?= )",                 # lookahead
    r"(?<=samples=)(\d+)",                 # lookbehind
    r"(?P<n>\d+) (?P=n)",                  # a named backreference
    r"((x{100}){100}){100}(\d+)",          # a repetition RE2 refuses to expand
    r"(\d+)[a-z]{999}[0-9]{999}[A-Z]{999}",  # compiles, but too large a program
], ids=["backreference", "lookahead", "lookbehind", "named-backreference", "nested-repeat", "too-large"])
def test_a_pattern_re2_cannot_match_in_linear_time_is_refused_with_the_reason(app, pattern):
    status, body = _register(app, pattern)
    assert status == 422, body
    assert set(body["errors"]) == {"progress_pattern"}, body
    assert "RE2" in body["errors"]["progress_pattern"], body


def test_a_catastrophic_pattern_is_accepted_and_matched_in_linear_time(app):
    """`(a+)+$` is fine under RE2: registered, and a 100 KB hostile line costs no backtracking
    (Python's `re` would take longer than the age of the universe: the child is cut off)."""
    assert _register(app, r"(\d+)(a+)+$")[0] == 201
    code = ("from core.dispatchers.restarts import RestartJobs as R; "
            "print(R._last_match(r'(\\d+)(a+)+$', ['7aaaa', '1' + 'a' * 100_000 + '!']))")
    try:
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("matching one hostile line did not end within 30 s: a backtracking engine")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["7.0"]


# ---- 3. numbers read from job output --------------------------------------------------------

@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity", "-5", "1e400", "-1e-9"])
def test_a_count_that_is_no_finite_non_negative_number_is_no_progress(value):
    assert RestartJobs._last_match(r"samples=(\S+)", [f"samples={value}"]) is None
    assert RestartJobs._last_match(r"samples=(\S+)", ["samples=12", f"samples={value}"]) == 12.0


def test_steps_times_samples_per_step_that_overflow_are_no_progress():
    assert RestartJobs._last_match(r"step=(\S+)", ["step=1e308"], 64.0) is None
    assert RestartJobs._last_match(r"step=(\S+)", ["step=3"], 64.0) == 192.0


def test_a_group_1_that_took_no_part_in_the_match_is_no_progress():
    assert RestartJobs._last_match(r"samples=(\d+)?x", ["samples=x"]) is None


def test_rank_0s_rate_loss_and_metrics_are_kept_only_when_finite():
    """A runtime job's rank 0 publishes its rate, loss and metrics (JSON that may say NaN): the
    status (the API's, the profiler's rate) holds none that is not finite."""
    job = RegroupJob()
    gen = job.running(["A"])
    job.m.progress_read({"gen": gen, "step": 1, "samples_per_second": float("nan"), "loss": float("inf"),
                         "step_time_s": -1.0, "metrics": {"acc": float("nan"), "lr": 0.1}})
    st = job.m.status()
    assert st["samples_per_second"] is None and st["loss"] is None and st["step_time_s"] is None
    assert st["metrics"] == {"lr": 0.1}
    job.m.progress_read({"gen": gen, "step": 2, "samples_per_second": 50.0, "loss": 0.5, "metrics": {}})
    assert job.m.status()["samples_per_second"] == 50.0 and job.m.status()["loss"] == 0.5


# ---- 2. bounded log reading -----------------------------------------------------------------

def _assert_cut(line: str) -> int:
    """The line is a cut one: at most LINE bytes kept; the bytes dropped."""
    m = CUT.search(line)
    assert m, line[-80:]
    assert len(line[:m.start()].encode()) <= LINE + len("…".encode())
    return int(m.group(1))


def test_a_30_mb_line_without_a_newline_costs_one_capped_read(tmp_path):
    path = _huge_line(tmp_path / "n0-s1-g0.log")
    for lines in (tail_file(str(path), 40), worklogs.tail(path, 40)):
        assert len(lines) == 1
        assert lines[0].startswith("…x")            # it begins before what was read
        assert LINE + _assert_cut(lines[0]) <= CAP  # what was read: at most the cap


def test_the_last_lines_of_a_long_log_are_right_and_long_ones_are_cut(tmp_path):
    path = tmp_path / "n0-s1-g0.log"
    with open(path, "w") as f:
        for i in range(500_000):
            f.write(f"samples={i}\n")
        f.write("y" * 50_000 + "\r\n")
        f.write("last\r\n")
    for lines in (tail_file(str(path), 3), worklogs.tail(path, 3)):
        assert lines[0] == "samples=499999" and lines[2] == "last"
        assert lines[1].startswith("y" * LINE) and _assert_cut(lines[1]) == 50_000 - LINE
    assert tail_file(str(path), 40)[:2] == ["samples=499962", "samples=499963"]


def test_progress_updates_on_carriage_returns_read_only_the_end(tmp_path):
    """A progress bar that rewrites its line with \\r writes no newline for hours: its last
    updates are lines of their own, and only the log's end is read."""
    path = tmp_path / "bar.log"
    path.write_bytes(b"".join(b"\rsamples=%d" % i for i in range(300_000)))
    assert tail_file(str(path), 2) == ["samples=299998", "samples=299999"]


def test_failure_naming_on_hostile_lines_is_linear(tmp_path):
    """An exception-like line the failure patterns could backtrack on (`ErrorError...!`):
    named in a child process, cut off if it backtracks."""
    code = ("from core import failures; "
            "t = ['Traceback (most recent call last)'] + ['Error' * 1638 + '!'] * 40; "
            "f = failures.from_exit(t, 1, 'n'); print(f.kind); "
            "print(failures.from_error_text('ProcessGroupNCCL' * 100_000 + ' | ' + 'Gloo' * 100_000).kind)")
    try:
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("naming the failure of 40 hostile lines did not end within 30 s")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [failures.EXCEPTION, failures.OTHER]


def test_ssh_tail_of_a_30_mb_line_is_capped(sshd_server: SshdServer, tmp_path):  # noqa: F811
    path = _huge_line(tmp_path / "n0-s1-g0.log")
    with SshTransport(config=str(sshd_server.client_config)) as t:
        node = NodeSpec("node0", "node0")
        lines = t.tail(Handle(node, 1, "", str(path), time.time(), ""), 40)
        assert len(lines) == 1 and lines[0].startswith("…x")
        assert LINE + _assert_cut(lines[0]) <= CAP
        short = tmp_path / "short.log"
        short.write_text("".join(f"samples={i}\n" for i in range(100)))
        assert t.tail(Handle(node, 1, "", str(short), time.time(), ""), 2) == ["samples=98", "samples=99"]


# ---- a restart-based job, end to end -------------------------------------------------------

def _restart_jobs(tmp_path: Path) -> tuple[RestartJobs, list]:
    """RestartJobs on real local processes, its pool work done on the caller's thread."""
    transport = LocalTransport()
    events: list = []
    spec = NodeSpec("n0")

    def launch(job, node, env, log_path):
        return transport.start(node, list(job.command), env, "", log_path)
    jobs = RestartJobs(transport, {"n0": spec}, tmp_path, launch, dict, lambda f, *a: f(*a), events.append,
                       lambda *a: None)
    return jobs, events


def _job(script: str, pattern: str = r"samples=(\S+)") -> Job:
    return Job(id="u-1", min_nodes=1, max_nodes=1, total_samples=1e6, curve=Curve((1,), (1.0,)),
               command=(sys.executable, "-c", script), launcher=LAUNCHER_TORCHRUN, progress_pattern=pattern)


def _checked(jobs: RestartJobs, job: Job) -> None:
    """The job started and its output written (it sleeps after), then one poll's check."""
    jobs.resize(job, ["n0"], 0.0)
    log = next(iter(jobs.runs[job.id].gen.handles.values())).log_path
    deadline = time.monotonic() + 20
    while "done" not in (Path(log).read_text(errors="replace")[-10:] if Path(log).exists() else ""):
        assert time.monotonic() < deadline, "the job never wrote its output"
        time.sleep(0.05)
    jobs.check({})


def test_a_job_printing_nan_keeps_its_last_valid_progress(tmp_path):
    jobs, _ = _restart_jobs(tmp_path)
    job = _job("import time; print('samples=10'); print('samples=nan'); print('done', flush=True); time.sleep(60)")
    try:
        _checked(jobs, job)
        assert jobs.progress(job) == 10.0 and math.isfinite(jobs.status(job.id)["samples_done"])
    finally:
        jobs.stop(job)


def test_a_stored_pattern_re2_refuses_fails_the_job_with_the_reason(tmp_path):
    """A pattern registered before RE2 (a lookbehind) is never matched by a backtracking
    engine: the job fails at once saying why, rather than after its start timeout."""
    jobs, events = _restart_jobs(tmp_path)
    job = _job("import time; print('samples=10'); print('done', flush=True); time.sleep(60)", r"(?<=samples=)(\d+)")
    try:
        _checked(jobs, job)
        failed = [e for e in events if e.kind == EventKind.JOB_FAILED]
        assert len(failed) == 1 and "RE2" in failed[0].detail, events
        assert jobs.progress(job) == 0.0
    finally:
        jobs.stop(job)
