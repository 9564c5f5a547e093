"""Owners' accounts inside Slurm pilots (`--source slurm --run-as`), on the test Slurm 22.05
(tests/support/slurm.py; 4 nodes, GPUs bound by gres) with two Unix accounts of the test's own
(tests/support/accounts.py).

Two logins mapped to the two accounts each register the real elastic worker (examples/
digits_cnn.py, run by the system's python with the checkout's packages on PYTHONPATH: the venv's
interpreter lies under /root, which other accounts cannot enter). Each job's ranks run as its
owner, inside the pilot that holds the node (its descendant, in its cgroup, with its SLURM_JOB_ID
and the GPUs Slurm bound to it); one account cannot read the other's checkpoints, the store or
the harvester's environment (a probe through the same launcher, which can read its own account's
checkpoint: the probe itself works); a main job still gets a preempted node at once (< 2 s, as
tests/test_slurm.py) and the preempted pilot's ranks are gone. Without `--run-as`, a mapped
user's command job is refused as before."""
from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from core.pilots import pilot_job
from core.pilots.pilot_job import Pilot
from core.pilots.runas import launch_argv
from core.pilots.transport import PilotTransport
from core.pilots.wire import GIVE, START
from core.transports.base import NodeSpec, StartError
from core.transports.runas import RunAs
from tests.support.accounts import LAUNCHER, SUDO, unix_account
from tests.support.runas_checks import (PYTHON, ancestors, describe, env_of, exe, ranks, register, uids,
                                       users_file)
from tests.support.server import ROOT, start_app
from tests.support.slurm import (HOST_VERSION, MAIN_JOB_S, SlurmCluster, processes_with_env,
                                 start_cluster, steps_into_generation)
from tests.support.waiting import wait

OWNERS = ("alice", "carol")      # mapped to the two accounts; bob is mapped to none


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    c = start_cluster(tmp_path_factory.mktemp("slurm-run-as"), nodes=4, version=HOST_VERSION)
    try:
        yield c
    finally:
        left = c.stop()
        assert not left, f"left running in the Slurm namespace after stop: {left}"


@pytest.fixture(scope="module")
def accounts() -> Iterator[dict[str, str]]:
    if not os.access(PYTHON, os.X_OK):
        pytest.skip(f"{PYTHON} is missing")
    with unix_account("harvtra") as a, unix_account("harvtrb") as b:
        yield dict(zip(OWNERS, (a, b)))


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder every account may enter (pytest's own are 0700)."""
    d = Path(tempfile.mkdtemp(prefix="harvtest-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def probe(account: str, *argv: str) -> subprocess.CompletedProcess:
    """`argv` run as `account` through the site's launcher, as the pilot runs a worker."""
    launcher = LAUNCHER.replace("{user}", account).replace("--preserve-env={env} ", "").split()
    return subprocess.run([*launcher, *argv], capture_output=True, text=True, timeout=30)


# ---- the rules, without Slurm ------------------------------------------------------------------
def test_the_pilot_applies_the_launcher_with_its_slurm_binding_named():
    sent = []
    transport = PilotTransport(hub=None)
    transport._checked = lambda node, op, **fields: sent.append((op, fields)) or {"pid": 9, "job": "7", "token": "t"}
    launcher = RunAs.parse(LAUNCHER)
    node = NodeSpec("node1")
    transport.start_as(node, launcher, "alice1", ["python", "x.py"], {"HARVEST_JOB": "j1"}, "", "/tmp/w.log")
    (op, fields), = sent
    assert fields["argv"] == ["python", "x.py"], "the pilot, not the harvester, puts the launcher first"
    assert fields["run_as"] == {"user": "alice1", "launcher": list(launcher.words)}
    with pytest.raises(ValueError, match="not a Unix account"):
        transport.start_as(node, launcher, "-oProxyCommand=x", ["true"], {}, "", "/tmp/w.log")
    transport.start(node, ["true"], {}, "", "/tmp/w.log")
    assert "run_as" not in sent[-1][1], "a job of the harvester's own account goes as before"
    pilot_env = {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "0,1", "ZE_AFFINITY_MASK": "0,1", "LANG": "C.UTF-8",
                 "HOME": "/root", "PATH": "/usr/bin", "USER": "root", "HARVEST_PILOT_TOKEN": "secret"}
    assert launch_argv(fields["run_as"], fields["argv"], {"HARVEST_JOB": "j1"}, pilot_env) == [
        "sudo", "-n", "-u", "alice1",
        "--preserve-env=CUDA_VISIBLE_DEVICES,HARVEST_JOB,LANG,SLURM_JOB_ID,ZE_AFFINITY_MASK", "--", "python", "x.py"]
    with pytest.raises(ValueError, match="list of words"):
        launch_argv({"user": "alice1", "launcher": "sudo -u {user}"}, ["true"], {}, {})
    with pytest.raises(ValueError, match="{user}"):
        launch_argv({"user": "alice1", "launcher": ["sudo", "--"]}, ["true"], {}, {})


def test_a_pilot_that_is_not_root_refuses_to_run_a_job_as_another_account(monkeypatch, tmp_path):
    pilot = Pilot(wire=None, node="node1", job="7", grace_s=0.0)
    monkeypatch.setattr(pilot_job.os, "geteuid", lambda: 1001)
    start = {"argv": ["/bin/true"], "env": {}, "log": str(tmp_path / "w.log"),
             "run_as": {"user": "alice1", "launcher": LAUNCHER.split()}}
    for op, msg in ((START, start), (GIVE, {"path": str(tmp_path / "c"), "user": "alice1"})):
        with pytest.raises(StartError, match="runs as uid 1001, not root"):
            pilot._handle(op, msg)
    assert not (tmp_path / "w.log").exists() and not (tmp_path / "c").exists()


# ---- on the test Slurm --------------------------------------------------------------------------
def test_without_run_as_a_mapped_users_command_is_refused(cluster, accounts, shared_dir):
    cluster.wait_quiet()
    users = users_file(shared_dir / "users.json", {"alice": accounts["alice"]})
    app = start_app(shared_dir, "--fresh", "--source", "slurm", *cluster.app_args(), "--no-profiler",
                    users=users, trust_users=False, timeout=120)
    try:
        status, body = register(app, "alice")
        assert status == 422 and body["errors"]["command"].startswith("this site runs commands only for staff"), body
        assert app.get("/api/jobs")[1]["total"] == 0
    finally:
        app.stop()


def test_pilots_run_each_job_as_its_owner(cluster, accounts, shared_dir):
    cluster.wait_quiet()
    users = users_file(shared_dir / "users.json", accounts)
    uid = {login: pwd.getpwnam(a).pw_uid for login, a in accounts.items()}
    app = start_app(shared_dir, "--fresh", "--source", "slurm", *cluster.app_args(), "--slurm-pilot-logs",
                    str(shared_dir), "--tfwd", "600", "--workdir", str(ROOT), "--no-profiler", "--slurm-slots", "1",
                    "--run-as", LAUNCHER, "--metrics-interval", "0", users=users, timeout=120)
    try:
        jobs = _run_as_owners(app, cluster, accounts, uid)
    except BaseException:
        print(app.output()[-4000:])
        raise
    finally:
        app.stop()
    wait(lambda: not any(processes_with_env(f"HARVEST_JOB={j}") for j in jobs), 20, "every worker gone")


def _run_as_owners(app, cluster: SlurmCluster, accounts: dict[str, str], uid: dict[str, int]) -> list[str]:
    status, body = register(app, "bob")
    assert status == 422 and "not mapped to a Unix account" in body["errors"]["command"], body
    jobs = {}
    for login in OWNERS:
        status, job = register(app, login)
        assert status == 201, job
        jobs[login] = job["id"]
    get = lambda j: app.get(f"/api/jobs/{j}")[1]
    assert [get(jobs[o])["run_as"] for o in OWNERS] == [accounts[o] for o in OWNERS]
    workers = lambda j: get(j).get("workers") or {}
    for o in OWNERS:
        wait(lambda: workers(jobs[o]).get("world_size") == 2 and not workers(jobs[o]).get("regrouping"), 150,
             f"{o}'s job training on 2 nodes", lambda: (get(jobs[o]), app.get("/api/cluster")[1]["source"]))
        wait(lambda: steps_into_generation(workers(jobs[o]), 10), 60, "10 steps into the generation",
             lambda: workers(jobs[o]))
    pilots = {j["nodes"]: j["job_id"] for j in cluster.jobs().values()
              if j["name"] == "harvest-pilot" and j["job_state"] == "RUNNING"}
    nodes = {o: [] for o in OWNERS}
    pilots_of = {}                  # rank -> the pilot process above it

    # each rank: the owner's uid (all four), a descendant of its node's pilot, in its cgroup,
    # with its Slurm job and its bound GPUs
    for o in OWNERS:
        found = ranks(jobs[o])
        assert len(found) == 2, (o, found)
        for pid, raw in found.items():
            env = env_of(raw)
            node = env["HARVEST_NODE"]
            nodes[o].append(node)
            assert uids(pid) == (uid[o],) * 4, (o, pid, uids(pid))
            pilot_pids = processes_with_env(f"SLURM_JOB_ID={pilots[node]}")
            chain = ancestors(pid)
            pilot = next(p for p in chain if p in pilot_pids and exe(p) != SUDO)
            between = {exe(p) for p in chain[:chain.index(pilot)]}
            assert uids(pilot) == (0,) * 4 and between == {SUDO}, "the rank under sudo under the pilot, as root"
            pilots_of[pid] = pilot
            pilot_env = env_of(pilot_pids[pilot])
            assert env["SLURM_JOB_ID"] == pilots[node] == pilot_env["SLURM_JOB_ID"]
            assert "CUDA_VISIBLE_DEVICES" in pilot_env, "the test Slurm binds GPUs to each pilot"
            for name in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURM_JOB_NODELIST"):
                assert env.get(name) == pilot_env.get(name), (name, env.get(name), pilot_env.get(name))
            assert Path(f"/proc/{pid}/cgroup").read_text() == Path(f"/proc/{pilot}/cgroup").read_text()
            assert env["HOME"] != pilot_env.get("HOME") and "HARVEST_PILOT_TOKEN" not in env, \
                "the owner's HOME, not the pilot's, and none of its secrets"
    assert not set(nodes["alice"]) & set(nodes["carol"])

    # what each account may read: its own checkpoints, not the other's, nor the harvester's
    ckpt = {o: Path(f"{app.db}.workers", jobs[o], "checkpoint") for o in OWNERS}
    files = {o: wait(lambda: sorted(p for p in ckpt[o].rglob("*") if p.is_file()), 30, f"{o}'s checkpoint")[0]
             for o in OWNERS}
    for o, other in (("alice", "carol"), ("carol", "alice")):
        d = ckpt[o]
        assert d.stat().st_uid == uid[o] and stat.S_IMODE(d.stat().st_mode) == 0o700
        assert files[o].stat().st_uid == uid[o]
        mine = probe(accounts[o], "/bin/cat", str(files[o]))
        assert mine.returncode == 0, ("the probe reads its own account's checkpoint", mine.stderr)
        for path in (files[other], ckpt[other], app.db, f"{app.db}.secret", f"/proc/{app.proc.pid}/environ"):
            r = probe(accounts[o], "/bin/cat", str(path))
            assert r.returncode != 0 and "Permission denied" in r.stderr, (o, path, r.returncode, r.stderr)
        r = probe(accounts[o], "/bin/ls", str(ckpt[other]))
        assert r.returncode != 0 and "Permission denied" in r.stderr, (o, r.stderr)

    # a main job takes one of alice's nodes: it starts at once and her rank there is gone
    node = nodes["alice"][0]
    t0 = time.monotonic()
    main = cluster.sbatch("-p", "main", "-N", "1", "-w", node, "--wrap", f"sleep {MAIN_JOB_S}", "-o", "/dev/null")
    wait(lambda: cluster.job_state(main) == "RUNNING", 10, "the main job to start", period=0.02)
    main_start = time.monotonic() - t0
    wait(lambda: not ranks(jobs["alice"], node), 10, "alice's rank on the preempted node gone", period=0.02)
    gone = time.monotonic() - t0
    print(f"run-as: main job started {main_start:.2f} s after its submission, the rank gone after {gone:.2f} s")
    assert main_start < 2.0, f"the main job started {main_start:.2f} s after its submission"
    wait(lambda: not processes_with_env(f"SLURM_JOB_ID={pilots[node]}"), 10, "nothing left of the preempted pilot",
         lambda: describe(processes_with_env(f"SLURM_JOB_ID={pilots[node]}")))
    m = wait(lambda: (lambda m: m if m.get(("harvest_slurm_vacate_seconds_count", ())) == 1 else None)(app.metrics()),
             5, "the vacate in /metrics", lambda: app.metrics())
    vacate = m[("harvest_slurm_vacate_seconds_sum", ())]
    print(f"run-as: the pilot vacated in {vacate:.2f} s")
    assert 0 < vacate < 5.0, "the vacate within the pilot's grace"
    wait(lambda: workers(jobs["alice"]).get("world_size") == 1 and not workers(jobs["alice"]).get("regrouping"),
         60, "alice's job shrunk to 1 node", lambda: workers(jobs["alice"]))
    step = workers(jobs["alice"])["committed_step"]
    wait(lambda: workers(jobs["alice"])["committed_step"] > step + 5, 30, "alice's job training on",
         lambda: workers(jobs["alice"]))
    assert len(ranks(jobs["carol"])) == 2, "carol's job keeps its nodes"

    # a pilot killed outright (SIGKILL, no word): its rank behind sudo does not outlive it. Not
    # the kernel's parent-death signal (a setuid exec clears it in sudo) but Slurm's end of the
    # job: sudo, reparented to slurmstepd, gets its SIGTERM and hands it to the rank
    rank, raw = next(iter(ranks(jobs["carol"]).items()))
    assert pilots_of[rank] in processes_with_env(f"SLURM_JOB_ID={env_of(raw)['SLURM_JOB_ID']}")
    t0 = time.monotonic()
    os.kill(pilots_of[rank], 9)
    wait(lambda: exe(rank) == "" or Path(f"/proc/{rank}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z",
         10, "carol's rank gone with its killed pilot", period=0.02)
    print(f"run-as: a rank ended {time.monotonic() - t0:.2f} s after its pilot was SIGKILLed")
    cluster.run("scancel", main)
    for o in OWNERS:
        assert app.request("DELETE", f"/api/jobs/{jobs[o]}", token=app.token(o))[0] == 200
    wait(lambda: not any(ranks(jobs[o]) for o in OWNERS), 20, "the cancelled jobs' ranks gone")
    return list(jobs.values())
