"""A job's processes and files stay the job's (issue 57, item 7): a job whose processes on a node
pass the site's cap, or whose checkpoint folder passes its size cap, fails with kind `limit` (its
own fault: the node is not held out), its processes are gone, and nothing of its files is
deleted; a job under the caps is not touched; the workers' folders are the harvester's (0700, logs
0600), also those an earlier version made. A harvester built in the test's process with local
workers, jobs of `sh` scripts, both as torchrun jobs and as runtime jobs."""
from __future__ import annotations

import stat
from pathlib import Path

import pytest

from app.__main__ import build_parser, flag, settings_from
from core.assemble import build
from core.errors import SettingsError
from core.schemas import JobSpec
from core.settings import HarvesterSettings
from core.transports.base import NodeSpec
from core.transports.local import LocalTransport
from core.transports.ssh import SshTransport
from tests.support.procs import processes_with_cmdline, tag  # noqa: F401  (tag: the fixture)
from tests.support.waiting import wait

#: forks `{n}` sleepers (each names the test's tag), then waits on them
FORKS = "i=0; while [ $i -lt {n} ]; do sleep 600.{tag} & i=$((i+1)); done; echo forked; wait"
#: writes `{mib}` MiB into its checkpoint folder, then trains on
FILLS = ('mkdir -p "$HARVEST_CHECKPOINT_DIR" && head -c $(({mib} * 1048576)) /dev/zero > '
         '"$HARVEST_CHECKPOINT_DIR/big" && echo filled; exec sleep 600.{tag}')
#: a small job that ends by itself: 3 children, 16 KiB of checkpoint, its samples
SMALL = ('mkdir -p "$HARVEST_CHECKPOINT_DIR" && head -c 16384 /dev/zero > "$HARVEST_CHECKPOINT_DIR/ok"; '
         'sleep 1.{tag} & sleep 1.{tag} & sleep 1.{tag} & wait; echo samples=640')



def harvester(db: Path, **workers):
    h = build(HarvesterSettings.parse({"db": db, "tick_s": 0.1, "live": {
        "dispatch": "local", "local_nodes": 1, "profiler": False, "config": {"tfwd": 60},
        "trust_user_commands": True, "workers": {"rejoin_after_s": 1.0, **workers}}}))
    h.open()
    return h


def sh_job(script: str, total: int = 64 * 10 ** 6, launcher: str = "torchrun") -> JobSpec:
    """`script` as a torchrun job, or as a runtime job (whose workers never dial its store)."""
    extra = {"launcher": "torchrun", "progress_pattern": r"samples=(\d+)"} if launcher == "torchrun" else \
        {"global_batch": 64}
    return JobSpec(name="limits", min_nodes=1, max_nodes=1, total_samples=total, curve="1:100",
                   scale_up_seconds=0, scale_down_seconds=0, stop_grace_seconds=2,
                   command=["/bin/sh", "-c", script], **extra)


def failed(h, job_id: str, within: float = 30) -> dict:
    state = lambda: h.job(job_id).state.value
    wait(lambda: state() in ("failed", "done"), within, "the job to end", state)
    job = h.job(job_id)
    assert state() == "failed", (state(), job.failure)
    return job.failure or {}


def gone(tag: str, within: float = 10) -> None:
    wait(lambda: not processes_with_cmdline(tag), within, "the job's processes to end",
         lambda: len(processes_with_cmdline(tag)))


@pytest.mark.parametrize("launcher", ["torchrun", "runtime"])
def test_a_job_that_forks_past_the_cap_fails_and_its_processes_are_gone(tmp_path, tag, launcher):
    h = harvester(tmp_path / "live.db", max_pids=20)
    try:
        job = h.submit(sh_job(FORKS.format(n=60, tag=tag), launcher=launcher), "alice")
        failure = failed(h, job.id, 60)
        assert failure["kind"] == "limit", failure
        assert "over the cap of 20 per node (--job-max-pids)" in failure["message"], failure
        gone(tag)
        assert not h.controller.dispatcher.node_states(), "a job's own limit does not hold its node out"
    finally:
        h.close()


def test_a_job_that_fills_its_checkpoint_folder_past_the_cap_fails_and_keeps_its_files(tmp_path, tag):
    h = harvester(tmp_path / "live.db", max_checkpoint_gib=1 / 1024)       # 1 MiB
    try:
        job = h.submit(sh_job(FILLS.format(mib=3, tag=tag)), "alice")
        failure = failed(h, job.id, 30)
        assert failure["kind"] == "limit", failure
        folder = Path(str(tmp_path / "live.db") + ".workers", job.id, "checkpoint")
        assert f"its checkpoint folder {folder} takes 3.0 MiB, over the cap of 1.0 MiB" in failure["message"]
        assert (folder / "big").stat().st_size == 3 * 1048576, "nothing of the job's files is deleted"
        gone(tag)
    finally:
        h.close()


def test_a_job_under_the_caps_is_not_touched_and_its_folders_are_the_harvesters(tmp_path, tag):
    db = tmp_path / "live.db"
    h = harvester(db, max_pids=20, max_checkpoint_gib=1 / 1024)
    try:
        job = h.submit(sh_job(SMALL.format(tag=tag), total=640), "alice")
        state = lambda: h.job(job.id).state.value
        wait(lambda: state() in ("failed", "done"), 60, "the job to end", state)
        assert state() == "done", h.job(job.id).failure
        workers = Path(str(db) + ".workers")
        assert stat.S_IMODE(workers.stat().st_mode) == 0o700
        assert stat.S_IMODE((workers / job.id).stat().st_mode) == 0o700
        logs = list((workers / job.id).glob("*.log"))
        assert logs and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in logs)
    finally:
        h.close()


def test_folders_an_earlier_version_made_open_are_made_private_at_start(tmp_path):
    db = tmp_path / "live.db"
    workers = Path(str(db) + ".workers")
    (workers / "j1").mkdir(parents=True)
    (workers / "j1" / "node0-s1-g0.log").write_text("old output\n")
    for p, mode in ((workers, 0o755), (workers / "j1", 0o755), (workers / "j1" / "node0-s1-g0.log", 0o644)):
        p.chmod(mode)
    h = harvester(db)
    try:
        assert stat.S_IMODE(workers.stat().st_mode) == 0o700
        assert stat.S_IMODE((workers / "j1").stat().st_mode) == 0o700
        assert stat.S_IMODE((workers / "j1" / "node0-s1-g0.log").stat().st_mode) == 0o600
    finally:
        h.close()


def test_limits_are_settings_and_zero_turns_them_off():
    s = HarvesterSettings.parse({"live": {"dispatch": "local", "local_nodes": 1}})
    assert (s.live.workers.max_pids, s.live.workers.max_checkpoint_gib) == (512, 50.0)
    s = HarvesterSettings.parse({"live": {"dispatch": "local", "local_nodes": 1,
                                          "workers": {"max_pids": 0, "max_checkpoint_gib": 0}}})
    assert (s.live.workers.max_pids, s.live.workers.max_checkpoint_gib) == (0, 0)
    with pytest.raises(SettingsError) as e:
        HarvesterSettings.parse({"live": {"dispatch": "local", "local_nodes": 1, "workers": {"max_pids": -1}}})
    assert e.value.field == "live.workers.max_pids"
    args = build_parser().parse_args(["--dispatch", "local", "--local-nodes", "1", "--job-max-pids", "64",
                                      "--job-max-checkpoint-gib", "2.5"])
    s = settings_from(args)
    assert (s.live.workers.max_pids, s.live.workers.max_checkpoint_gib) == (64, 2.5)
    assert flag("live.workers.max_pids") == "--job-max-pids"


@pytest.mark.parametrize("kind", ["local", "ssh"])
def test_each_transport_counts_a_workers_processes_and_sizes_a_folder(request, tmp_path, tag, kind):
    """The measures themselves: a worker with 7 sleepers (one of them in a session of its own) has 8
    processes, and a folder of 3 files of 64 KiB takes at least 192 KiB (du's count), on both
    transports (ssh through a real sshd on 127.0.0.1)."""
    if kind == "local":
        transport, node = LocalTransport(), NodeSpec("n0")
    else:
        server = request.getfixturevalue("sshd_server")
        transport, node = SshTransport(config=str(server.client_config)), NodeSpec(server.aliases[0], server.aliases[0])
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for i in range(3):
        (folder / f"f{i}").write_bytes(b"x" * 65536)
    try:
        script = f"setsid sleep 600.{tag} & " + "sleep 600.{tag} & " * 6 + "wait"
        h = transport.start(node, ["/bin/sh", "-c", script.replace("{tag}", tag)], {}, "", str(tmp_path / "w.log"))
        wait(lambda: len(processes_with_cmdline(tag)) >= 7, 10, "the sleepers", lambda: processes_with_cmdline(tag))
        assert transport.census([h]) == {h: 8}
        size, whole = transport.folder_size(node, str(folder))
        assert whole and 3 * 65536 <= size < 4 * 65536 + 16384, size
        assert transport.folder_size(node, str(tmp_path / "none")) == (None, True)
        transport.stop(h, 0.5)
        assert transport.census([h]) == {h: 0}
    finally:
        transport.close()
