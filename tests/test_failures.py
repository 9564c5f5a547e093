"""Naming a worker's failure from what the transport saw and its log's last lines
(core/failures.py), on the words real tools print: Python tracebacks, gloo, the shell."""
from __future__ import annotations

import signal

from core import failures as F
from core.model import Job, JobState, Curve
from core.explain import why

GLOO_LOOPBACK = [
    "Traceback (most recent call last):",
    '  File "/srv/train.py", line 12, in <module>',
    "    dist.init_process_group('gloo')",
    "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] "
    "no error: local=[127.0.0.1]:41234 remote=[127.0.0.1]:27546",
]


def test_start_errors_name_command_folder_and_mode():
    assert F.from_start_error("command not found: '.venv/bin/python'", "h1").kind == F.COMMAND_NOT_FOUND
    f = F.from_start_error("no working directory '/srv/job'", "h1")
    assert f.kind == F.WORKDIR_MISSING and f.node == "h1" and "--workdir" in f.hint
    assert F.from_start_error("not executable: './train.sh' (Permission denied)", "h1").kind == F.NOT_EXECUTABLE


def test_a_traceback_is_named_by_its_last_line():
    tail = ["step 1", "Traceback (most recent call last):", '  File "t.py", line 3, in <module>',
            "ModuleNotFoundError: No module named 'timm'"]
    f = F.from_exit(tail, 1, "h2")
    assert (f.kind, f.message) == (F.EXCEPTION, "ModuleNotFoundError: No module named 'timm'")
    assert f.tail[-1] == tail[-1] and f.kind in F.SETUP


def test_a_rendezvous_to_loopback_names_the_address_and_what_to_set():
    f = F.from_exit(GLOO_LOOPBACK, 1, "h1")
    assert f.kind == F.RENDEZVOUS
    assert "127.0.0.1" in f.hint and "GLOO_SOCKET_IFNAME" in f.hint and "/etc/hosts" in f.hint
    assert f.address == "127.0.0.1:27546" and F.loopback_rendezvous(f)      # no retry can mend it
    g = F.from_error_text("RuntimeError: Connection refused: 10.1.2.3:29500")
    assert g.kind == F.RENDEZVOUS and "10.1.2.3:29500" in g.hint and not F.loopback_rendezvous(g)


def test_peers_memory_signals_and_statuses():
    assert F.from_exit(["Traceback (most recent call last):",
                        "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:1"],
                       1, "h").kind == F.PEER_LOST
    assert F.from_exit(["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"], 1, "h").kind \
        == F.OUT_OF_MEMORY
    killed = F.from_exit(["step 9"], -signal.SIGKILL, "h")
    assert killed.kind == F.SIGNAL and "SIGKILL" in killed.message and "out-of-memory" in killed.hint
    assert F.from_exit([], 137, "h").kind == F.SIGNAL
    assert F.from_exit(["sh: 1: trainer: not found"], 127, "h").kind == F.COMMAND_NOT_FOUND
    status = F.from_exit(["bad flag"], 3, "h")
    assert status.kind == F.EXIT_STATUS and "exit status 3" in status.message and "bad flag" in status.message
    assert F.from_exit(["bye"], 0, "h").kind == F.EXITED_EARLY
    assert F.from_exit([], None, "h").kind == F.OTHER


def test_a_failure_round_trips_and_reads_in_the_why_line():
    f = F.from_start_error("command not found: 'python3.99'", "h1")
    assert F.Failure.from_dict(f.to_dict()) == f and F.Failure.from_dict({"no": 1}) is None
    job = Job("j", 1, 2, 100.0, Curve((1,), (1.0,)), state=JobState.FAILED, end_time=0.0, failure=f.to_dict())
    line = why(job, 0, 0, 0, 0, 1, 10.0)
    assert line.startswith("failed at") and "command not found on h1: command not found: 'python3.99'" in line
