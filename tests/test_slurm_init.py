"""The test Slurm's init restarts slurmctld and the slurmds once when the slurmds do not register
(tests/support/slurm_init.py). Two faults: slurmds that run but never register (no slurmd came up
once in a full suite, cause unknown; here stand-ins that never register), and a slurmd that exits
because another process holds its port (seen in CI; here caused for real). Either way the restart
must bring up real slurmds on every node and leave nothing behind."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.support.files import ROOT
from tests.support.slurm import ensure_slurm

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
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable,
                        str(script), str(work)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=180)
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
