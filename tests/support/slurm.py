"""A real Slurm on loopback for tests and benchmarks: munged, slurmctld and N slurmd (`-N nodeX`,
one port each) under the caller's own folder, with the slurm.conf measured to work with
Debian's Slurm 22.05 (a `main` partition and a preemptible `scavenger` partition, GraceTime=0).
Every node has `GPUS` GPUs (`Gres=gpu:2`) backed by stand-in device files (`write_gres`), so
Slurm allocates and binds them as on a GPU supercomputer.

Everything runs inside its own PID namespace (`unshare --pid --fork --mount-proc`) whose PID 1
is `tests/support/slurm_init.py`: it reaps the daemons' zombies, and when it exits the kernel kills
whatever is left in the namespace, so no slurmstepd or job process can outlive a test, even one
killed by a signal. `stop()` first cancels every job, waits for the steps to end and stops the
daemons in order, and returns what was still alive (a clean run: nothing).

`ensure_slurm()` installs `slurm-wlm munge` with apt when slurmctld is missing, and fails
loudly when it cannot: a test that needs Slurm never skips silently.

In a test module:  `from tests.support.slurm import slurm_cluster`  makes the module-scoped fixture
available there; `slurm_netns_cluster` is a 3-node one whose pilots run on the test hosts of
tests/support/netns.py (slurmd stays on loopback).
"""
from __future__ import annotations

import json
import os
import select
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import pytest

from tests.support.files import ROOT
from tests.support.netns import NetnsCluster
from tests.support.ports import free_ports

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("slurmctld", "slurmd", "munged")
START_TIMEOUT_S = 120.0   # the init's own waits, one restart of the slurmds included
#: GPUs per node (GRES gpu), as on the nodes of a GPU supercomputer
GPUS = 2
#: how long the tests' main jobs run: longer than the 10 s a surviving rank may wait on a dead peer
#: (the workers' process-group timeout) plus its regroup, so the job is seen at its shrunk size
#: before the main job ends and the nodes are harvested again
MAIN_JOB_S = 15


def steps_into_generation(workers: dict, steps: int) -> bool:
    """Whether the job's current generation (its `workers` status) has committed more than
    `steps` steps: past its set-up, where the tests preempt."""
    return workers["committed_step"] > (workers["last_rescale"]["start_step"] or 0) + steps

CONF = """\
ClusterName=harvest-test
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.socket.2
StateSaveLocation={d}/state/ctld
SlurmdSpoolDir={d}/state/d/%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
GresTypes=gpu
{node_lines}
PartitionName=main Nodes=ALL Default=YES PriorityTier=10 PreemptMode=OFF State=UP
PartitionName=scavenger Nodes=ALL PriorityTier=1 PreemptMode=CANCEL GraceTime=0 State=UP
"""


def ensure_slurm() -> None:
    """apt-get install slurm-wlm munge if a daemon is missing (the packages start nothing)."""
    if all(shutil.which(d) or os.path.exists(f"/usr/sbin/{d}") for d in DAEMONS):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.fail(f"Slurm is not installed and cannot be installed here (needs root and apt-get): "
                    f"apt-get install {' '.join(PACKAGES)}", pytrace=False)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}", pytrace=False)


def write_conf(d: Path, nodes: list[str], gpus: int = GPUS) -> Path:
    """The folder layout, munge key, slurm.conf and gres.conf of a cluster in `d` whose nodes
    have `gpus` GPUs each (`Gres=gpu:N`; 0: none)."""
    for sub in ("munge", "state/ctld", "state/d", "run", "log"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "munge").chmod(0o755)
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    ports = free_ports(len(nodes) + 1)
    gres = f" Gres=gpu:{gpus}" if gpus else ""
    lines = "\n".join(f"NodeName={n} NodeHostname=localhost Port={p} CPUs=1 RealMemory=1000{gres} State=UNKNOWN"
                      for n, p in zip(nodes, ports[1:]))
    write_gres(d, nodes, gpus)
    conf = d / "slurm.conf"
    conf.write_text(CONF.format(d=d, ctld_port=ports[0], node_lines=lines))
    return conf


def write_gres(d: Path, nodes: list[str], gpus: int) -> None:
    """gres.conf with `gpus` GPUs on every node, each a device file `d/dev/gpuI`.

    Slurm 22.05 needs the files (measured): its gpu plugin drops a GPU declared by count alone
    (`Count=2`, also with `Flags=CountOnly`), the node then registers 0 GPUs and is drained
    INVAL, and a File= that is not a character or block device binds nothing. So each "GPU" is
    a character device with /dev/null's numbers (1:3): Slurm binds them to jobs like real ones
    (CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, ZE_AFFINITY_MASK, SLURM_JOB_GPUS in the job's
    environment), and a process that opened one would hold /dev/null. task/none: no cgroup
    restricts devices here. All slurmd share the host, so all nodes name the same files."""
    (d / "gres.conf").write_text("")
    if not gpus:
        return
    dev = d / "dev"
    dev.mkdir(exist_ok=True)
    for i in range(gpus):
        f = dev / f"gpu{i}"
        if not f.exists():
            os.mknod(f, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    files = f"{dev}/gpu[0-{gpus - 1}]" if gpus > 1 else f"{dev}/gpu0"
    (d / "gres.conf").write_text("AutoDetect=off\n" + "".join(f"NodeName={n} Name=gpu File={files}\n" for n in nodes))


@dataclass
class SlurmCluster:
    dir: Path
    nodes: list[str]
    conf: Path
    proc: subprocess.Popen
    env: dict = field(default_factory=dict)
    _stopped: bool = field(default=False, repr=False)

    # ---- the daemons -------------------------------------------------------------------------
    def _ask(self, command: str, timeout: float = START_TIMEOUT_S) -> str:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the cluster's init exited with {self.proc.returncode}")
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._answer(timeout)

    def _answer(self, timeout: float) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"the cluster's init did not answer within {timeout:g} s")
        line = self.proc.stdout.readline().strip()
        if not line:
            raise RuntimeError(f"the cluster's init exited:\n{self.logs()}")
        if line.startswith("error"):
            raise RuntimeError(f"{line}\n{self.logs()}")
        return line

    def stop_controller(self) -> None:
        """Take slurmctld down (slurmd, jobs and munge keep running)."""
        self._ask("stop-ctld")

    def start_controller(self) -> None:
        """Start slurmctld again on its saved state; returns once it answers."""
        self._ask("start-ctld")

    def stop(self, timeout: float = 90.0) -> list[str]:
        """Cancel every job, stop the daemons, end the namespace. Returns the processes that
        were still alive in it after that (`pid comm`), which the kernel then killed."""
        if self._stopped:
            return []
        self._stopped = True
        left: list[str] = ["init did not answer"]
        try:
            line = self._ask("quit", timeout)
            if line.startswith("bye "):
                left = json.loads(line[4:])
        except (RuntimeError, TimeoutError, OSError, ValueError):
            pass
        finally:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        return left

    def logs(self, lines: int = 30) -> str:
        out = []
        for p in sorted((self.dir / "log").glob("*")):
            text = p.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {p.name}\n" + "\n".join(text))
        return "\n".join(out)

    # ---- clients -----------------------------------------------------------------------------
    def run(self, *argv: str, timeout: float = 15.0, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
        return r

    def sbatch(self, *args: str, script: Optional[str] = None) -> str:
        """Submit; returns the job id. Without `script`, pass `--wrap CMD` in args."""
        r = subprocess.run(["sbatch", "--parsable", *args], env=self.env, capture_output=True,
                           text=True, timeout=15, input=script)
        if r.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout.strip().split(";")[0]

    def jobs(self) -> dict[str, dict]:
        """Every job slurmctld knows, by id (squeue --json; 22.05 ignores its filters there)."""
        data = json.loads(self.run("squeue", "--json").stdout)
        return {str(j["job_id"]): j for j in data["jobs"]}

    def job_state(self, job_id: str) -> Optional[str]:
        j = self.jobs().get(str(job_id))
        return j["job_state"] if j else None

    def node_states(self) -> dict[str, str]:
        data = json.loads(self.run("sinfo", "--json").stdout)
        return {n["name"]: "+".join([n["state"], *[f.lower() for f in n["state_flags"]]])
                for n in data["nodes"]}

    def wait_quiet(self, timeout: float = 30.0) -> None:
        """Until no job runs, completes or waits, and every node is idle."""
        deadline = time.monotonic() + timeout
        while True:
            live = [j for j in self.jobs().values() if j["job_state"] in ("RUNNING", "PENDING", "COMPLETING")]
            states = self.node_states()
            if not live and all(s == "idle" for s in states.values()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster did not go quiet: jobs {live}, nodes {states}")
            time.sleep(0.1)


def start_cluster(workdir: Path, nodes: int = 8, timeout: float = START_TIMEOUT_S, gpus: int = GPUS) -> SlurmCluster:
    ensure_slurm()
    if os.geteuid() != 0:
        pytest.fail("the test Slurm runs its daemons as root (SlurmUser=root)", pytrace=False)
    workdir = workdir.resolve()
    names = [f"node{i}" for i in range(1, nodes + 1)]
    conf = write_conf(workdir, names, gpus)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    # setpriv: unshare dies with us; --kill-child: the namespace's init dies with unshare.
    argv = ["setpriv", "--pdeathsig", "KILL", "--", "unshare", "--pid", "--fork", "--mount-proc",
            "--kill-child", sys.executable, "-m", "tests.support.slurm_init", str(workdir), ",".join(names)]
    err = open(workdir / "log" / "init.err", "w")
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=err, text=True, bufsize=1)
    err.close()
    cluster = SlurmCluster(workdir, names, conf, proc, env)
    try:
        cluster._answer(timeout)
    except (RuntimeError, TimeoutError):
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        left = cluster.stop()
        assert not left, f"left running in the Slurm namespace after stop: {left}"


@dataclass
class SlurmOnHosts:
    """A Slurm cluster whose node i is the test host node i: `python` (for --slurm-python) runs
    each batch script inside the network namespace of the node Slurm started it on."""
    slurm: SlurmCluster
    hosts: NetnsCluster
    python: Path


@pytest.fixture(scope="module")
def slurm_netns_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmOnHosts]:
    """Slurm's node1..node3 (slurmd on loopback) over the test hosts node1..node3 (no sshd). The
    namespaces are made first: Slurm's init has a mount namespace of its own, which sees only
    the /run/netns/* bindings made before it. Tear-down checks that Slurm left nothing and that
    no process had to be killed in a namespace."""
    d = tmp_path_factory.mktemp("slurm-netns")
    with NetnsCluster(3, d / "hosts", sshd=False) as hosts:
        cluster = start_cluster(d / "slurm", nodes=len(hosts.names))
        try:
            assert cluster.nodes == hosts.names, (cluster.nodes, hosts.names)
            yield SlurmOnHosts(cluster, hosts, hosts.write_entry(d / "python-on-node", sys.executable,
                                                                  "SLURMD_NODENAME"))
        finally:
            left = cluster.stop()
        assert not left, f"left running in the Slurm namespace after stop: {left}"
        killed = hosts.close()
        assert not killed, f"processes still ran in the test hosts after Slurm stopped: {killed}"


def processes_with_env(marker: str) -> dict[int, bytes]:
    """Live processes (outer PIDs, every namespace) whose environment holds `marker`
    (`NAME=value`), with their whole environment."""
    out = {}
    needle = marker.encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry.name}/environ").read_bytes()
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and needle in env.split(b"\0"):
            out[int(entry.name)] = env
    return out


def parent(pid: int) -> Optional[int]:
    """The parent's PID (as this namespace numbers it), None once `pid` is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


DIGITS_BATCH = 64


def submit_digits(app, name: str, max_nodes: int) -> str:
    """Register the digits example (0.05 s steps, a curve linear up to `max_nodes`, free
    rescaling, a global batch of DIGITS_BATCH) as alice on `app`; its job id."""
    status, job = app.request("POST", "/api/jobs", {
        "name": name, "min_nodes": 1, "max_nodes": max_nodes, "total_samples": DIGITS_BATCH * 10**6,
        "curve": f"1:100, {max_nodes}:{100 * max_nodes}", "scale_up_seconds": 0, "scale_down_seconds": 0,
        "global_batch": DIGITS_BATCH,
        "command": [sys.executable, "examples/digits_cnn.py", "--step-seconds", "0.05", "--log-every", "1000000"]},
        token=app.token("alice"))
    assert status == 201, job
    return job["id"]
