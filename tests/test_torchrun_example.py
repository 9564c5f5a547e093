"""examples/torchrun_digits.py is a plain torchrun script, the "bring your own script" job of a
`launcher: torchrun` job: under `python -m torch.distributed.run` alone it trains, checkpoints
every K steps and on SIGTERM (which torchrun's agent forwards to every worker), and a second run
at another size resumes from that step and ends with exactly the total samples; copied out of
the repository with `python -I` and the harvester's environment contract set by hand, it runs
too; and it imports nothing of this project (only examples/data.py and examples/pace.py, by path)."""
from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import torch

from tests.support.files import ROOT
from tests.support.procs import leftovers
from tests.support.server import free_port
from tests.support.waiting import wait

SCRIPT = ROOT / "examples" / "torchrun_digits.py"
DATA = ROOT / "examples" / "data.py"
PACE = ROOT / "examples" / "pace.py"
GLOBAL_BATCH = 32
STEPS = 120
TOTAL = GLOBAL_BATCH * STEPS
EVERY = 25                       # --checkpoint-every
ARGS = ["--total-samples", str(TOTAL), "--global-batch", str(GLOBAL_BATCH), "--checkpoint-every", str(EVERY),
        "--log-every", "5", "--seed", "4"]
SAMPLES = re.compile(r"samples=(\d+)")     # the harvester's default progress_pattern
#: top-level packages of this repository that the example must not need
PROJECT_PACKAGES = {"core", "app", "bench", "tests", "examples"}


def environment(job: str, **extra: str) -> dict[str, str]:
    """One core per process on the 2 shared cores; HARVEST_JOB only marks the processes, so the
    test can find (and finally kill) workers torchrun started in their own sessions."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HARVEST_", "TORCHELASTIC_"))
           and k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH"}}
    return {**env, "OMP_NUM_THREADS": "1", "HARVEST_JOB": job, **extra}


@pytest.fixture
def job() -> Iterator[str]:
    name = f"trun-{uuid.uuid4().hex[:8]}"
    yield name
    for pid in leftovers(name):
        os.kill(pid, signal.SIGKILL)


def progress(text: str) -> list[int]:
    """Every `samples=` value in the order printed, as the harvester reads rank 0's output."""
    return [int(m) for m in SAMPLES.findall(text)]


def last_step(text: str) -> int:
    steps = re.findall(r"^step=(\d+) ", text, re.M)
    return int(steps[-1]) if steps else -1


def checkpoint_of(directory: Path) -> dict:
    return torch.load(directory / "torchrun_digits.pt", map_location="cpu", weights_only=True)


def torchrun(nproc: int, ckpt: Path, log: Path, job: str, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}",
            "--master-addr=127.0.0.1", f"--master-port={free_port()}",   # not 29500: other runs share the host
            str(SCRIPT), *ARGS, "--checkpoint-dir", str(ckpt), *extra]
    return subprocess.Popen(argv, cwd=log.parent, env=environment(job), stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def test_under_plain_torchrun_it_checkpoints_on_sigterm_and_resumes_at_another_size(tmp_path: Path, job: str):
    ckpt, log1, log2 = tmp_path / "ckpt", tmp_path / "run1.log", tmp_path / "run2.log"
    agent = torchrun(2, ckpt, log1, job, "--step-seconds", "0.05")
    try:
        wait(lambda: f"checkpoint step={EVERY} " in log1.read_text() and last_step(log1.read_text()) >= EVERY + 5,
             90, "a periodic checkpoint and 5 more steps", diag=lambda: log1.read_text()[-2000:])
        assert checkpoint_of(ckpt)["step"] >= EVERY
        agent.send_signal(signal.SIGTERM)       # the agent's own group: workers live in their own sessions
        agent.wait(timeout=60)
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
    out = log1.read_text()
    assert "Received 15 death signal" in out, out[-3000:]        # torchrun forwarded SIGTERM...
    stops = re.findall(r"^rank (\d): stopping at step=(\d+) on signal 15$", out, re.M)
    assert sorted(r for r, _ in stops) == ["0", "1"], out[-3000:]  # ...to both ranks, which agreed
    stopped = {int(s) for _, s in stops}
    assert len(stopped) == 1, stops
    stop_step = stopped.pop()
    assert EVERY + 5 <= stop_step < STEPS
    assert f"checkpoint step={stop_step} samples={stop_step * GLOBAL_BATCH} kind=signal" in out
    state = checkpoint_of(ckpt)
    assert (state["step"], state["samples"], state["world_size"]) == (stop_step, stop_step * GLOBAL_BATCH, 2)
    assert progress(out)[-1] == stop_step * GLOBAL_BATCH
    wait(lambda: not leftovers(job), 10, "no worker left behind", diag=lambda: leftovers(job))

    agent = torchrun(1, ckpt, log2, job)       # same folder, half the ranks
    try:
        assert agent.wait(timeout=90) == 0, log2.read_text()[-3000:]
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
    out = log2.read_text()
    assert f"start step={stop_step} samples={stop_step * GLOBAL_BATCH} world=1 backend=gloo resumed=True" in out
    seen = progress(out)
    assert min(seen) == stop_step * GLOBAL_BATCH and seen == sorted(seen), seen
    assert seen[-1] == TOTAL
    done = re.search(rf"^done step={STEPS} samples={TOTAL} loss=\S+ test_accuracy=([\d.]+)", out, re.M)
    assert done, out[-2000:]
    assert float(done.group(1)) > 0.2            # 10 classes: it learned something in 3840 samples
    assert checkpoint_of(ckpt)["step"] == STEPS
    assert not leftovers(job)


def test_the_harvester_contract_by_hand_runs_a_copy_outside_the_repository(tmp_path: Path, job: str):
    """What the harvester does for a 1-rank generation: torchrun's variables, no torchrun, and
    HARVEST_CHECKPOINT_DIR instead of --checkpoint-dir. The script, data.py and pace.py are
    copied away and run with `python -I` (no PYTHONPATH, no script folder on sys.path beyond its
    own load of data.py and pace.py), so nothing of this project can be imported."""
    copy = tmp_path / "byo"
    copy.mkdir()
    shutil.copy(SCRIPT, copy / SCRIPT.name)
    for sibling in (DATA, PACE):
        shutil.copy(sibling, copy / sibling.name)
    ckpt = tmp_path / "harvest-ckpt"
    env = environment(job, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", GROUP_RANK="0",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), TORCHELASTIC_RESTART_COUNT="0",
                      TORCHELASTIC_RUN_ID=job, HARVEST_CHECKPOINT_DIR=str(ckpt))
    probe = subprocess.run([sys.executable, "-I", "-c", "import core"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=30)
    assert probe.returncode != 0 and "No module named 'core'" in probe.stderr
    run = subprocess.run([sys.executable, "-I", str(copy / SCRIPT.name), *ARGS], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=90)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "start step=0 samples=0 world=1 backend=gloo resumed=False" in run.stdout
    seen = progress(run.stdout)
    assert seen == sorted(seen) and seen[-1] == TOTAL, seen
    assert re.search(rf"^done step={STEPS} samples={TOTAL} ", run.stdout, re.M), run.stdout
    assert f"checkpoint step={EVERY} samples={EVERY * GLOBAL_BATCH} kind=periodic path={ckpt}" in run.stdout
    assert checkpoint_of(ckpt)["step"] == STEPS
    assert not (tmp_path / "runs").exists()      # HARVEST_CHECKPOINT_DIR took the place of the local default


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every module a file imports anywhere (functions included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}:{node.lineno}: relative import"
            out.add((node.module or "").split(".")[0])
    return out


def test_the_script_imports_only_the_standard_library_torch_and_numpy():
    for path in (SCRIPT, DATA, PACE):
        outside = imported_modules(path) - set(sys.stdlib_module_names) - {"__future__", "torch", "numpy"}
        assert not outside, f"{path.name} imports {sorted(outside)}"
        assert not imported_modules(path) & PROJECT_PACKAGES
    tree = ast.parse(SCRIPT.read_text())
    touches_sys_path = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "path"
                        and isinstance(n.value, ast.Name) and n.value.id == "sys"]
    assert not touches_sys_path, f"sys.path used at lines {touches_sys_path}: no way back into the repository"
    assert 'Path(__file__).resolve().parent / f"{name}.py"' in SCRIPT.read_text()
