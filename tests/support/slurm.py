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

Two Slurm versions: the host's 22.05, and 24.11 from Debian 13 in a chroot
(tests/support/slurm_chroot.py, built once into a cache folder). For 24.11 the init binds the
host's paths into the chroot in its own mount namespace and runs every daemon there, and
`cluster.bin` is a folder of wrapper scripts (sinfo, squeue, sbatch, ...) that enter that
namespace and the chroot, for the tests (first on `cluster.env`'s PATH) and for the harvester
under test (`cluster.app_args()`, `cluster.slurm_settings()`). The helpers read Slurm's stable
text formats, the same on both.

In a test module:  `from tests.support.slurm import slurm_cluster`  makes the module-scoped fixture
available there, once per version (ids `slurm22.05`, `slurm24.11`; HARVEST_SLURM_VERSIONS=22.05
runs one); `slurm_netns_cluster` is a 3-node one whose pilots run on the test hosts of
tests/support/netns.py (slurmd stays on loopback).
"""
from __future__ import annotations

import json
import os
import select
import shlex
import stat
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import pytest

from tests.support import apt
from tests.support.files import ROOT
from tests.support.netns import NetnsCluster
from tests.support.ports import free_ports
from tests.support.slurm_accounting import Database, accounting_conf, start_database
from tests.support.slurm_chroot import RELEASES, ensure_chroot

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("slurmctld", "slurmd", "munged")
#: the host's Slurm (Debian 12's packages), and the versions the tests run against
HOST_VERSION = "22.05"
VERSIONS = (HOST_VERSION, *RELEASES)
#: those `make test` runs: the host's and Debian 13's (26.05, from sid, on demand with the variable)
DEFAULT_VERSIONS = (HOST_VERSION, "24.11")
VERSIONS_ENV = "HARVEST_SLURM_VERSIONS"
#: the Slurm commands a chrooted version gets a wrapper for
CLIENTS = ("sinfo", "squeue", "sbatch", "scancel", "scontrol", "sacctmgr", "sacct", "srun", "sdiag")
#: the stable text formats the helpers read (the job name last: it may hold a `|`)
SQUEUE_FIELDS = ("job_id", "job_state", "nodes", "partition", "user_name", "state_reason", "name")
SQUEUE_FORMAT = "%i|%T|%N|%P|%u|%r|%j"
SINFO_FIELDS = ("name", "state", "partition", "address", "gres")
SINFO_FORMAT = ",".join(f"{f}:0|" for f in ("NodeList", "StateComplete", "Partition", "NodeAddr", "Gres"))
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
SlurmdSpoolDir={spool}/%n
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
    apt.ensure(DAEMONS, PACKAGES, "Slurm")


def spool_dir(d: Path) -> Path:
    """slurmd's spool, where each job step gets a Unix socket (`node2_1.4294967291`): a path is at
    most 108 bytes, and a test's folder under xdist's `popen-gwN` left too few. So it is a short
    folder of its own under the temporary folder (bound into a chroot as the rest), linked from
    `d/state/d` and removed with the cluster (`SlurmCluster.stop`)."""
    link = d / "state" / "d"
    if link.is_symlink():
        return link.resolve()
    spool = Path(tempfile.mkdtemp(prefix="slurmd-"))
    link.symlink_to(spool)
    return spool


def remove_spool(d: Path) -> None:
    """The spool `spool_dir(d)` made, once the daemons are gone."""
    link = d / "state" / "d"
    if link.is_symlink():
        shutil.rmtree(link.resolve(), ignore_errors=True)
        link.unlink()


def write_conf(d: Path, nodes: list[str], gpus: int = GPUS, preempt: str = "partition",
               database: Optional[Database] = None, extra: str = "") -> Path:
    """The folder layout, munge key, slurm.conf and gres.conf of a cluster in `d` whose nodes
    have `gpus` GPUs each (`Gres=gpu:N`; 0: none). preempt="qos": QOS preemption with accounting
    in `database` and one partition, `batch` (tests/support/slurm_accounting.py). `extra`: lines
    added to slurm.conf (`SlurmdTimeout=10`)."""
    for sub in ("munge", "state/ctld", "run", "log"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    spool = spool_dir(d)
    (d / "munge").chmod(0o755)
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    ports = free_ports(len(nodes) + 2)       # slurmctld, the slurmds, slurmdbd (with preempt="qos")
    gres = f" Gres=gpu:{gpus}" if gpus else ""
    lines = "\n".join(f"NodeName={n} NodeHostname=localhost Port={p} CPUs=1 RealMemory=1000{gres} State=UNKNOWN"
                      for n, p in zip(nodes, ports[1:]))
    write_gres(d, nodes, gpus)
    conf = d / "slurm.conf"
    text = CONF.format(d=d, spool=spool, ctld_port=ports[0], node_lines=lines)
    if preempt == "qos":
        if database is None:
            raise ValueError("preempt='qos' needs the accounting database")
        text = accounting_conf(d, text, database, dbd_port=ports[-1])
    elif preempt != "partition":
        raise ValueError(f"preempt: 'partition' or 'qos', not {preempt!r}")
    conf.write_text(text + (extra.rstrip("\n") + "\n" if extra else ""))
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


def versions_under_test() -> tuple[str, ...]:
    """The versions the Slurm fixtures run against: DEFAULT_VERSIONS, or those HARVEST_SLURM_VERSIONS lists."""
    wanted = tuple(v.strip() for v in os.environ.get(VERSIONS_ENV, "").split(",") if v.strip())
    unknown = [v for v in wanted if v not in VERSIONS]
    if unknown:
        raise ValueError(f"{VERSIONS_ENV}: no test Slurm {', '.join(unknown)} (known: {', '.join(VERSIONS)})")
    return wanted or DEFAULT_VERSIONS


def write_wrappers(folder: Path, chroot: Path, init_pid: int) -> Path:
    """One script per Slurm command that runs the chroot's own in the mount namespace of the
    init (PID `init_pid`, as this namespace numbers it), in the caller's folder where the chroot
    has it. Run from inside that namespace (a job calling scontrol), it runs the command as is."""
    folder.mkdir(exist_ok=True)
    ns = os.readlink(f"/proc/{init_pid}/ns/mnt")
    for name in CLIENTS:
        real = f"/usr/bin/{name}"
        if not (chroot / real[1:]).exists():
            continue
        inner = shlex.quote(f'cd "$1" 2>/dev/null || cd /; shift; exec {real} "$@"')
        (folder / name).write_text(
            f"#!/bin/sh\n# {name} of the Slurm in {chroot}, through the mount namespace of its test cluster\n"
            f'if [ "$(readlink /proc/self/ns/mnt)" = {shlex.quote(ns)} ]; then exec {real} "$@"; fi\n'
            f"exec nsenter --mount=/proc/{init_pid}/ns/mnt -- chroot {shlex.quote(str(chroot))} /bin/sh -c {inner} "
            f'{name} "$PWD" "$@"\n')
        (folder / name).chmod(0o755)
    return folder


@dataclass
class SlurmCluster:
    dir: Path
    nodes: list[str]
    conf: Path
    proc: subprocess.Popen
    env: dict = field(default_factory=dict)
    version: str = HOST_VERSION
    #: the folder of this version's Slurm commands ('' for the host's: PATH)
    bin: str = ""
    #: the chroot its daemons, jobs and commands run in (None: the host's Slurm)
    chroot: Optional[Path] = None
    #: MariaDB of a preempt="qos" cluster (slurmdbd's), stopped by `stop()` after Slurm
    database: Optional[Database] = None
    _stopped: bool = field(default=False, repr=False)

    def app_args(self) -> list[str]:
        """The options that point `python -m app --source slurm` at this cluster."""
        return ["--slurm-conf", str(self.conf), *(["--slurm-bin", self.bin] if self.bin else [])]

    def slurm_settings(self) -> dict:
        """The same for PilotSettings (a harvester built in the test's process)."""
        return {"conf": str(self.conf), "bin_dir": self.bin}

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

    def kill_slurmd(self, node: str) -> None:
        """SIGKILL `node`'s slurmd, as a dead host would leave it; its jobs' processes run on."""
        self._ask(f"kill-slurmd {node}")

    def start_slurmd(self, node: str) -> None:
        """Start `node`'s slurmd again; returns at once (it registers in its own time)."""
        self._ask(f"start-slurmd {node}")

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
            if self.database is not None and self.database.stop():
                left.append(f"{self.database.proc.pid} mariadbd (killed: SIGTERM did not end it)")
            remove_spool(self.dir)
        return left

    def check_version(self) -> None:
        """The commands this cluster's clients run are its own version's (`sinfo --version`:
        `slurm-wlm 22.05.8`, `slurm 24.11.5`)."""
        out = self.run("sinfo", "--version").stdout.split()
        if not out or not out[-1].startswith(self.version + "."):
            raise RuntimeError(f"sinfo --version says {' '.join(out)!r}, not Slurm {self.version}")

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
        """Every job slurmctld knows, ended ones included, by id: SQUEUE_FIELDS as strings."""
        out = self.run("squeue", "-h", "-t", "all", "-o", SQUEUE_FORMAT).stdout
        return {j["job_id"]: j for j in _records(out, SQUEUE_FIELDS, "squeue")}

    def job_state(self, job_id: str) -> Optional[str]:
        j = self.jobs().get(str(job_id))
        return j["job_state"] if j else None

    def job_gres(self, job_id: str) -> str:
        """The GRES a job asked for per node, as squeue prints it (`%b`: 22.05 `gres:gpu:2`,
        24.11 `gres/gpu:2`)."""
        return self.run("squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%b").stdout.strip()

    def node_info(self) -> dict[str, dict]:
        """Every node once (sinfo prints a line per node and partition): SINFO_FIELDS, the
        partitions as a list without the default's `*`."""
        out = self.run("sinfo", "-N", "-h", "-a", "-O", SINFO_FORMAT).stdout
        nodes: dict[str, dict] = {}
        for n in _records(out, SINFO_FIELDS, "sinfo", trailing="|"):
            part = n.pop("partition").rstrip("*")
            nodes.setdefault(n["name"], {**n, "partitions": []})["partitions"].append(part)
        return nodes

    def node_states(self) -> dict[str, str]:
        """Node -> its state with every flag (`idle`, `allocated`, `idle+drain`, ...)."""
        return {name: n["state"] for name, n in self.node_info().items()}

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


def _records(out: str, fields: tuple[str, ...], what: str, trailing: str = "") -> list[dict]:
    """Lines of `|`-separated fields (the last may hold `|`s unless `trailing` ends each line)."""
    records = []
    for line in out.splitlines():
        if not line.strip():
            continue
        body = line.rstrip()
        if trailing:
            if not body.endswith(trailing):
                raise RuntimeError(f"{what} printed {line!r}")
            body = body[:-len(trailing)]
        values = body.split("|", len(fields) - 1)
        if len(values) != len(fields):
            raise RuntimeError(f"{what} printed {line!r}, not {len(fields)} fields")
        records.append(dict(zip(fields, (v.strip() for v in values))))
    return records


def write_cgroup_conf(d: Path, version: str) -> None:
    """23.11 and later need cgroup.conf beside slurm.conf (no cgroup here: disabled); 22.05
    has no such plugin and must not get the file."""
    if version != HOST_VERSION:
        (d / "cgroup.conf").write_text("CgroupPlugin=disabled\n")


def start_cluster(workdir: Path, nodes: int = 8, timeout: float = START_TIMEOUT_S, gpus: int = GPUS,
                  version: str = HOST_VERSION, preempt: str = "partition", extra_conf: str = "") -> SlurmCluster:
    """preempt: "partition" (main preempts scavenger) or "qos" (in partition batch, QOS normal
    preempts QOS scavenger; MariaDB and slurmdbd run for it, on the host's Slurm only).
    `extra_conf`: lines added to slurm.conf."""
    ensure_slurm()
    if os.geteuid() != 0:
        pytest.fail("the test Slurm runs its daemons as root (SlurmUser=root)", pytrace=False)
    if version not in VERSIONS:
        pytest.fail(f"no test Slurm {version} (known: {', '.join(VERSIONS)})", pytrace=False)
    chroot = ensure_chroot(version) if version != HOST_VERSION else None
    workdir = workdir.resolve()
    names = [f"node{i}" for i in range(1, nodes + 1)]
    if preempt == "qos" and chroot:
        pytest.fail(f"preempt='qos' runs on the host's Slurm {HOST_VERSION} only (no slurmdbd in the chroot)",
                    pytrace=False)
    database = start_database(workdir / "mariadb") if preempt == "qos" else None
    try:
        conf = write_conf(workdir, names, gpus, preempt, database, extra_conf)
    except BaseException:
        if database is not None:
            database.stop()
        raise
    write_cgroup_conf(workdir, version)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    # setpriv: unshare dies with us; --kill-child: the namespace's init dies with unshare.
    argv = ["setpriv", "--pdeathsig", "KILL", "--", "unshare", "--pid", "--fork", "--mount-proc",
            "--kill-child", sys.executable, "-m", "tests.support.slurm_init", str(workdir), ",".join(names),
            *(["--chroot", str(chroot)] if chroot else [])]
    err = open(workdir / "log" / "init.err", "w")
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=err, text=True, bufsize=1)
    err.close()
    cluster = SlurmCluster(workdir, names, conf, proc, env, version, chroot=chroot)
    cluster.database = database
    try:
        if chroot:
            # unshare (proc.pid) made the mount namespace the init binds into, and stays in it
            cluster.bin = str(_wait_for_namespace(proc, chroot, workdir / "bin"))
            env["PATH"] = f"{cluster.bin}:{env.get('PATH', os.defpath)}"
        cluster._answer(timeout)
        cluster.check_version()
    except (RuntimeError, TimeoutError):
        cluster.stop()
        raise
    return cluster


def _wait_for_namespace(proc: subprocess.Popen, chroot: Path, folder: Path, timeout: float = 10.0) -> Path:
    """The wrappers, once unshare has its own mount namespace (right after it starts)."""
    mine = os.readlink("/proc/self/ns/mnt")
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.readlink(f"/proc/{proc.pid}/ns/mnt") != mine:
                return write_wrappers(folder, chroot, proc.pid)
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"unshare (pid {proc.pid}) made no mount namespace within {timeout:g} s")
        time.sleep(0.01)


@pytest.fixture(scope="module", params=versions_under_test(), ids=lambda v: f"slurm{v}")
def slurm_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp(f"slurm{request.param}"), version=request.param)
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


@pytest.fixture(scope="module", params=versions_under_test(), ids=lambda v: f"slurm{v}")
def slurm_netns_cluster(request: pytest.FixtureRequest,
                        tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmOnHosts]:
    """Slurm's node1..node3 (slurmd on loopback) over the test hosts node1..node3 (no sshd). The
    namespaces are made first: Slurm's init has a mount namespace of its own, which sees only
    the /run/netns/* bindings made before it. Tear-down checks that Slurm left nothing and that
    no process had to be killed in a namespace."""
    d = tmp_path_factory.mktemp(f"slurm{request.param}-netns")
    with NetnsCluster(3, d / "hosts", sshd=False) as hosts:
        cluster = start_cluster(d / "slurm", nodes=len(hosts.names), version=request.param)
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
