"""Torchrun hangs named early (issue 56, item 5): a generation whose ranks never all join rank 0's
store, or whose script waits for more ranks than WORLD_SIZE (a hard-coded world size), fails
within the rendezvous timeout (60 s by default) as `rendezvous`, naming the ranks that
never arrived, with rank 0's last line that is not a known warning; a group that formed and only
takes long to its first progress line trains on. An exception after the job's first progress
is said to be one during training, for both launchers.

The store reads (core/dispatchers/rendezvous.py) against a real c10d TCPStore; the jobs end to
end on local processes (real ranks, real gloo) through an in-process harvester."""
from __future__ import annotations

import socket
import sys
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from core import failures as F
from core.assemble import build
from core.dispatchers import rendezvous as R
from core.dispatchers.health import Health
from core.errors import SettingsError
from core.model import JobState
from core.schemas import JobSpec
from core.settings import HarvesterSettings
from tests.support.procs import leftovers
from tests.support.waiting import wait

HOSTNAME_WARNING = ("[W1129 03:27:47.254785151 socket.cpp:755] [c10d] The hostname of the client socket "
                    "cannot be retrieved. err=-3")


# ---- the store, read from outside -------------------------------------------------------------
@pytest.fixture
def store():
    """A c10d store as rank 0 serves it, and `arrive(rank, publish)`: a rank that dials in
    (counted in init/, as init_process_group does) and, with `publish`, posts its gloo address."""
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    clients = []

    def arrive(rank: int, publish: bool = True, world: int = 64):
        c = dist.TCPStore("127.0.0.1", master.port, world_size=world, is_master=False,
                          timeout=timedelta(seconds=10))
        if publish:
            c.set(f"default_pg/0//cpu//0/{rank}", b"\x02\x00addr")
        clients.append(c)
    yield SimpleNamespace(port=master.port, arrive=arrive)
    clients.clear()


def test_missing_ranks_are_named_with_their_nodes(store):
    nodes = ["n0", "n1", "n1", "n2"]
    store.arrive(0, publish=False)                    # rank 0 waits for its workers: no address yet
    store.arrive(1)
    view = R.read_store("127.0.0.1", store.port)
    assert view == R.StoreView(2, frozenset({1}), False), view
    f = R.verdict(view, nodes, f"127.0.0.1:{store.port}", 61)
    assert f.kind == F.RENDEZVOUS and f.node == "n1", f
    assert f.message.startswith(f"ranks 2 (n1), 3 (n2) never joined the rendezvous at 127.0.0.1:{store.port} "
                                f"within 61 s (2 of 4 ranks reached init_process_group)"), f.message
    assert "MASTER_ADDR" in f.hint and f.address == f"127.0.0.1:{store.port}"
    store.arrive(2)
    assert R.verdict(R.read_store("127.0.0.1", store.port), nodes, "a:1", 61).message.startswith(
        "rank 3 (n2) never joined")


def test_a_world_size_above_the_ranks_started_is_named(store):
    """Every started rank arrived, ranks 1.. published, rank 0 did not: it waits for ranks that
    were never started. With one rank there is nothing published at all: no group formed."""
    store.arrive(0, publish=False)
    view1 = R.read_store("127.0.0.1", store.port)
    one = R.verdict(view1, ["n0"], "h:1", 60)
    assert one.kind == F.RENDEZVOUS and "rank 1 and up never arrive" in one.message and "WORLD_SIZE=1" in one.message
    assert one.message.startswith("no process group formed within 60 s: rank 0 reached init_process_group at h:1")
    assert "hard-coded" in one.hint, one
    store.arrive(1)
    store.arrive(2)
    f = R.verdict(R.read_store("127.0.0.1", store.port), ["n0", "n1", "n2"], "h:1", 60)
    assert f.kind == F.RENDEZVOUS, f
    assert "rank 0 waits in the rendezvous at h:1 for more ranks than the 3 started (WORLD_SIZE=3): " \
           "ranks 3 and up never arrive" in f.message, f.message


def test_a_formed_group_and_an_unknown_store_say_nothing(store):
    store.arrive(0)
    store.arrive(1)
    view = R.read_store("127.0.0.1", store.port)
    assert R.formed(view, 2) and R.verdict(view, ["a", "b"], "h:1", 60) is None
    nccl = dist.TCPStore("127.0.0.1", store.port, is_master=False, wait_for_workers=False)
    nccl.set("default_pg/0//cuda//0", b"id")           # an NCCL id: a collective began
    assert R.formed(R.read_store("127.0.0.1", store.port), 3)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    assert R.read_store("127.0.0.1", port, timeout_s=0.5) is None          # nothing listens
    with socket.create_server(("127.0.0.1", 0)) as other:                    # something else listens
        def answer():
            conn, _ = other.accept()
            with conn:
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        t = threading.Thread(target=answer, daemon=True)
        t.start()
        assert R.read_store("127.0.0.1", other.getsockname()[1], timeout_s=1.0) is None
    assert R.verdict(None, ["a"], "h:1", 60) is None


# ---- hints and last lines (pure) ---------------------------------------------------------------
def test_rank_0s_last_line_skips_known_warnings():
    lines = ["loading the data set", HOSTNAME_WARNING,
             "[W socket.cpp:697] [c10d] The client socket cannot be initialized to connect to [localhost]:29500",
             "/usr/lib/python3/torch/utils/data.py:55: UserWarning: This DataLoader will create 4 workers",
             "  warnings.warn(_create_warning_msg(",
             "node1:1234:1234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
             "[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1",
             "frame #3: <unknown function> + 0x163b752 (0x7f in libtorch_cpu.so)", ""]
    assert F.last_line(lines) == "loading the data set"
    assert F.last_line([HOSTNAME_WARNING]) == HOSTNAME_WARNING          # nothing else: the warning
    assert F.last_line([]) == ""
    assert F.from_exit(["step=3 samples=192", HOSTNAME_WARNING], 3, "n").message == \
        "exit status 3; last line: step=3 samples=192"


def test_an_exception_after_progress_is_said_to_be_during_training():
    tail = ["samples=640", "Traceback (most recent call last):", "FileNotFoundError: [Errno 2] No such file: 'x'"]
    start = F.from_exit(tail, 1, "n")
    assert "on start" in start.hint
    assert "during training, after 640 samples" in F.raised_during(F.from_exit(tail, 1, "n"), "after 640 samples").hint
    signal = F.raised_during(F.from_exit([], -9, "n"), "at step 3")
    assert "during training" not in signal.hint                       # only the script's exception
    h = Health()
    assert h.fails_at_once(F.from_exit(tail, 1, "n"))                 # before the first step: at once
    h.stepped, h.step_seen = True, (120, 0.0)
    f = F.from_exit(tail, 1, "n")
    assert not h.fails_at_once(f) and "during training, at step 120" in f.hint, f


def test_the_rendezvous_timeout_is_a_setting():
    from app.__main__ import build_parser, flag, settings_from
    live = lambda *extra: settings_from(build_parser().parse_args(["--dispatch", "local", "--local-nodes", "2", *extra]))
    assert live().live.workers.rendezvous_timeout_s == 60.0
    assert live("--rendezvous-timeout", "30").live.workers.rendezvous_timeout_s == 30.0
    with pytest.raises(SettingsError) as e:
        live("--rendezvous-timeout", "0")
    assert flag(e.value.field) == "--rendezvous-timeout" and "from 1 to 3600" in str(e.value)


# ---- end to end: real ranks on local processes -------------------------------------------------
def _settings(db, nodes: int, **workers) -> HarvesterSettings:
    return HarvesterSettings.parse({"db": db, "tick_s": 0.1, "live": {
        "dispatch": "local", "local_nodes": nodes, "profiler": False, "config": {"tfwd": 60},
        "trust_user_commands": True, "workers": {"rejoin_after_s": 1.0, **workers}}})


def _events(h, job_id: str) -> list[tuple[str, str]]:
    h.controller.flush()
    return [tuple(r) for r in h.controller.store.db.execute(
        "select kind, coalesce(detail, '') from events where job = ? order by id", (job_id,))]


def _script(tmp_path, name: str, body: str) -> str:
    """A torchrun script that imports nothing of ours: it prints what a real one prints first
    (a line, then the c10d hostname warning every rank prints, on stderr), then `body`."""
    path = tmp_path / name
    path.write_text(
        "import os, sys, time, torch, torch.distributed as dist\n"
        "rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])\n"
        "if rank == 0:\n    print('loading the data set', flush=True)\n"
        f"print({HOSTNAME_WARNING!r}, file=sys.stderr, flush=True)\n" + body)
    return str(path)


RENDEZVOUS_WITHIN_S = 90


def test_torchrun_hangs_are_named_within_the_rendezvous_timeout(tmp_path):
    """Default rendezvous timeout (60 s), four jobs at once on 7 local nodes: a hard-coded world
    size of WORLD_SIZE + 1 on 1 node and on 2 nodes, a rank that never calls init_process_group
    (named with its node) all fail as `rendezvous` (the job's own fault: failed, not requeued) within 90 s, with rank
    0's last line and no process left; a group that formed and prints its first progress line
    only after 75 s trains on to its end."""
    h = build(_settings(tmp_path / "live.db", 7))
    h.open()
    hard = _script(tmp_path, "hard.py", "dist.init_process_group('gloo', rank=rank, world_size=world + 1)\n"
                                        "print('never here', flush=True)\n")
    late = _script(tmp_path, "late.py", "if rank == 1:\n    time.sleep(600)\n"
                                        "dist.init_process_group('gloo')\nprint('never here', flush=True)\n")
    slow = _script(tmp_path, "slow.py", (
        "dist.init_process_group('gloo')\nt = torch.ones(1)\ndist.all_reduce(t)\n"
        "time.sleep(75)                                  # a long set-up after the group formed\n"
        "for i in range(1, 6):\n"
        "    dist.all_reduce(t)\n"
        "    if rank == 0:\n        print(f'samples={64 * i}', flush=True)\n"
        "    time.sleep(0.2)\n"
        "dist.barrier()\ndist.destroy_process_group()\n"))
    try:
        spec = lambda name, n, script, total=64 * 1000: JobSpec(
            name=name, launcher="torchrun", min_nodes=n, max_nodes=n, total_samples=total, curve=f"{n}:{100 * n}",
            stop_grace_seconds=2, command=[sys.executable, script])
        t0 = time.monotonic()
        jobs = {"hard1": h.submit(spec("hard1", 1, hard), "alice").id,
                "hard2": h.submit(spec("hard2", 2, hard), "alice").id,
                "late": h.submit(spec("late", 2, late), "alice").id,
                "slow": h.submit(spec("slow", 2, slow, total=64 * 5), "alice").id}
        job = lambda name: h.snapshot.job(jobs[name])
        failed = lambda name: (lambda j: j.state == JobState.FAILED and j.failure)(h.job(jobs[name]))
        got = {}
        for name in ("hard1", "hard2", "late"):
            got[name] = wait(lambda: failed(name), RENDEZVOUS_WITHIN_S - (time.monotonic() - t0),
                             f"{name} failed", lambda: (job(name), _events(h, jobs[name])))
        took = time.monotonic() - t0
        print(f"named after {took:.1f} s: " + " | ".join(f"{n}: {f['kind']}: {f['message']}" for n, f in got.items()))
        assert took < RENDEZVOUS_WITHIN_S
        hard1, hard2, late_f = got["hard1"], got["hard2"], got["late"]
        assert hard1["kind"] == F.RENDEZVOUS and "rank 1 and up never arrive" in hard1["message"], hard1
        assert hard2["kind"] == F.RENDEZVOUS and "for more ranks than the 2 started (WORLD_SIZE=2)" in hard2["message"] \
            and "ranks 2 and up never arrive" in hard2["message"], hard2
        assert late_f["kind"] == F.RENDEZVOUS and late_f["message"].startswith("rank 1 (local-"), late_f
        assert late_f["node"] == late_f["message"].split("(", 1)[1].split(")")[0], late_f
        assert "never joined the rendezvous at 127.0.0.1:" in late_f["message"] and \
            "(1 of 2 ranks reached init_process_group)" in late_f["message"], late_f
        for f in got.values():
            assert f["message"].endswith("rank 0's last line: loading the data set"), f
            assert "hard-coded" in f["hint"] or "MASTER_ADDR" in f["hint"], f
            assert any(HOSTNAME_WARNING in line for line in f["tail"]), f["tail"]
        for name in ("hard1", "hard2", "late"):
            assert sum(k == "job_failed" for k, _ in _events(h, jobs[name])) == 1
            wait(lambda: not leftovers(jobs[name]), 30, f"no process of {name} left", lambda: leftovers(jobs[name]))
        assert job("slow")["state"] == "running", (job("slow"), _events(h, jobs["slow"]))
        wait(lambda: job("slow")["state"] == "done", 120, "the slow job done", lambda: (job("slow"), _events(h, jobs["slow"])))
        assert job("slow")["samples_done"] == 64 * 5
    finally:
        h.close()


def test_an_exception_during_training_is_said_to_be_one_for_both_launchers(tmp_path):
    """A torchrun script and a runtime script that raise FileNotFoundError after some progress:
    the failure is the exception, with a hint that says during training (after N samples, at
    step N), not 'on start'."""
    h = build(_settings(tmp_path / "live.db", 2))
    h.open()
    torchrun = _script(tmp_path, "raises.py", (
        "for i in range(1, 10_000):\n"
        "    if rank == 0:\n        print(f'samples={64 * i}', flush=True)\n"
        "    time.sleep(0.05)\n"
        "    if i == 40:\n        open('/no/such/folder/for/the/test/data.bin')\n"))
    runtime = tmp_path / "runtime_raises.py"
    runtime.write_text(
        "import time, torch\nfrom core.runtime import elastic\n"
        "job = elastic.init(64, 64 * 100_000)\n"
        "model = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "job.attach(model, opt, dataset_size=1024)\n"
        "for step in job.steps():\n"
        "    x = torch.randn(len(job.shard(step)), 4)\n"
        "    opt.zero_grad()\n    loss = job.model(x).pow(2).sum()\n"
        "    (loss * job.loss_weight(step)).backward()\n    opt.step()\n"
        "    job.done_step(loss=float(loss))\n    time.sleep(0.05)\n"
        "    if step == 60:\n        open('/no/such/folder/for/the/test/data.bin')\n")
    try:
        a = h.submit(JobSpec(name="torchrun raises", launcher="torchrun", min_nodes=1, max_nodes=1,
                             total_samples=64 * 100_000, curve="1:100", stop_grace_seconds=2,
                             command=[sys.executable, torchrun]), "alice").id
        b = h.submit(JobSpec(name="runtime raises", min_nodes=1, max_nodes=1, total_samples=64 * 100_000,
                             global_batch=64, curve="1:100", command=[sys.executable, str(runtime)]), "alice").id
        for jid, where in ((a, "during training, after "), (b, "during training, at step ")):
            said = lambda: [d for k, d in _events(h, jid) if k in ("node_leave", "job_failed") and "FileNotFoundError" in d]
            lines = wait(said, 90, f"{jid}'s exception named", lambda: (h.snapshot.job(jid), _events(h, jid)))
            assert where in lines[0] and "on start" not in lines[0], lines
            print(lines[0])
    finally:
        h.close()
