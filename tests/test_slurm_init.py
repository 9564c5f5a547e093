"""The test Slurm's init restarts slurmctld and the slurmds once when the slurmds do not register
(tests/support/slurm_init.py). The fault it works around (munged refusing the registrations) could
not be caused on demand, so the first start here spawns stand-in slurmds that never register and
times out as the real wait does; the restart must then bring up real ones and leave nothing."""
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


def test_the_slurmds_are_started_again_when_they_do_not_register(tmp_path):
    ensure_slurm()
    script = tmp_path / "check.py"
    script.write_text(SCRIPT)
    work = tmp_path / "cluster"
    work.mkdir()
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable,
                        str(script), str(work)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"calls": 2, "idle": ["node1", "node2"], "left": []}
    assert "restarting slurmctld and the slurmds" in r.stderr
