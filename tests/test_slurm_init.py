"""The test Slurm's init restarts slurmctld and the slurmds once when the slurmds do not register
(tests/support/slurm_init.py). Two faults: slurmds that run but never register (no slurmd came up
once in a full suite, cause unknown; here stand-ins that never register), and a slurmd that exits
because another process holds its port (seen in CI; here caused for real). Either way the restart
must bring up real slurmds on every node and leave nothing behind.

And each Slurm version the tests run against starts, runs a job with the checkout's Python (in
the chroot for 24.11, through the wrapper commands), and stops leaving no process and no mount
on the host."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.files import ROOT
from tests.support.slurm import ensure_slurm, processes_with_env, remove_spool, start_cluster, versions_under_test
from tests.support.waiting import wait

SCRIPT = textwrap.dedent("""
    import json, os, pathlib, sys
    from tests.support import slurm, slurm_init
    d = pathlib.Path(sys.argv[1])
    names = ["node1", "node2"]
    os.environ["SLURM_CONF"] = str(slurm.write_conf(d, names, 2))
    real, calls = slurm_init.Init.start_nodes, []
    def first_never_registers(self):
        calls.append(1)
        if len(calls) > 1:
            return real(self)
        for n in self.nodes:
            self.spawn(f"slurmd-{n}", ["sleep", "600"])
        raise TimeoutError("every slurmd to register idle within 30 s")
    slurm_init.Init.start_nodes = first_never_registers
    init = slurm_init.Init(d, names)
    init.start_munge()
    try:
        init.start_slurm()
        idle = sorted(set(init.slurm("sinfo", "-h", "-N", "-t", "idle", "-o", "%N").stdout.split()))
    finally:
        left = init.quit()
    print(json.dumps({"calls": len(calls), "idle": idle, "left": left}))
""")


PORT_TAKEN = textwrap.dedent("""
    import json, os, pathlib, re, socket, sys
    from tests.support import slurm, slurm_init
    d = pathlib.Path(sys.argv[1])
    names = ["node1", "node2"]
    conf = slurm.write_conf(d, names, 0)
    holder = socket.socket()
    holder.bind(("", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    conf.write_text(re.sub(r"(NodeName=node2 .*?Port=)[0-9]+", rf"\\g<1>{taken}", conf.read_text()))
    os.environ["SLURM_CONF"] = str(conf)
    slurm_init.READY_WAIT_S = 10.0
    init = slurm_init.Init(d, names)
    init.start_munge()
    try:
        init.start_slurm()
        idle = sorted(set(init.slurm("sinfo", "-h", "-N", "-t", "idle", "-o", "%N").stdout.split()))
        port = int(re.search(r"NodeName=node2 .*?Port=([0-9]+)", conf.read_text()).group(1))
    finally:
        left = init.quit()
    print(json.dumps({"idle": idle, "left": left, "moved": port != taken}))
""")


def run_in_pid_namespace(tmp_path, source: str) -> subprocess.CompletedProcess:
    ensure_slurm()
    script = tmp_path / "check.py"
    script.write_text(source)
    work = tmp_path / "cluster"
    work.mkdir()
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    try:
        r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable,
                            str(script), str(work)], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=180)
    finally:
        remove_spool(work)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_the_slurmds_are_started_again_when_they_do_not_register(tmp_path):
    r = run_in_pid_namespace(tmp_path, SCRIPT)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"calls": 2, "idle": ["node1", "node2"], "left": []}
    assert "restarting slurmctld and the slurmds" in r.stderr


def test_a_slurmd_that_lost_its_port_is_started_again_on_a_fresh_one(tmp_path):
    r = run_in_pid_namespace(tmp_path, PORT_TAKEN)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"idle": ["node1", "node2"], "left": [], "moved": True}
    assert "slurmd-node2 had exited" in r.stderr and "Address already in use" in r.stderr


def mount_points() -> set[str]:
    return {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


@pytest.mark.parametrize("version", versions_under_test(), ids=lambda v: f"slurm{v}")
def test_each_version_runs_a_job_of_the_checkouts_python_and_leaves_nothing(tmp_path, version):
    before = mount_points()
    cluster = start_cluster(tmp_path / "cluster", nodes=2, gpus=0, version=version)
    try:
        assert cluster.node_states() == {"node1": "idle", "node2": "idle"}
        assert cluster.run("sinfo", "--version").stdout.split()[-1].startswith(version + ".")
        out = tmp_path / "job.out"
        job = cluster.sbatch("-p", "main", "-w", "node2", "-o", str(out), "--wrap",
                             f"pwd; cat /etc/debian_version; {sys.executable} -c 'import sys; print(sys.prefix)'")
        wait(lambda: cluster.job_state(job) in ("COMPLETED", "FAILED"), 30, "the job's end", cluster.jobs)
        assert cluster.jobs()[job] | {"job_id": job} == {
            "job_id": job, "job_state": "COMPLETED", "nodes": "node2", "partition": "main", "user_name": "root",
            "state_reason": "None", "name": "wrap"}, out.read_text()
        release = ((cluster.chroot or Path("/")) / "etc" / "debian_version").read_text().strip()
        assert out.read_text().split() == [str(Path.cwd()), release, sys.prefix]
        assert mount_points() == before, "the chroot's binds stay in the cluster's own mount namespace"
    finally:
        left = cluster.stop()
    assert left == []
    assert mount_points() == before
    assert not processes_with_env(f"SLURM_CONF={cluster.conf}"), "nothing of the cluster runs on"
    if cluster.bin:
        r = subprocess.run([f"{cluster.bin}/sinfo"], env=cluster.env, capture_output=True, text=True, timeout=15)
        assert r.returncode != 0, "the wrappers reach nothing once the cluster's namespace is gone"
