"""Rescale latency of a real elastic job on this machine: the product's in-place regroup against
the stop-checkpoint-relaunch baseline (what torchrun-style elastic training does).

    python -m bench.rescale [--json] [--repeats 10] [--transport local,ssh] [--slots 1] [--quick]

For each transport (local processes on local-0..3; ssh to node0..node3 through a loopback sshd
that the bench starts in a temporary directory and stops at the end; `--slots N`: N ranks per
node, one worker process each, a node's ranks joining and leaving together) one job of
examples/digits_cnn.py (--step-seconds 0.02, a total far beyond the run) is driven through its
JobCoordinator, and each worker is started and stopped through the transport:

1. elastic grow 2->3 / shrink 3->2, alternated `--repeats` times each, the product's way: for a
   grow a fresh worker is started on the added node while the job trains on 2 and the decision
   (`regroup()`) comes once it is warm (`ready()`); a shrink regroups without the node, then
   dismisses it (the worker exits by itself). Latency = the coordinator's own
   `decision_s` (regroup() call -> rank 0's first committed step at the new size); the training
   pause (`switch_s`, stop sent -> first step) is shown beside it.
2. cold grow 2->3: the worker is started at the decision (worker_env, regroup, transport.start),
   so the latency includes process start, `import torch`, the model build and the regroup.
3. relaunch baseline: SIGTERM every worker (the group stops at a step boundary, rank 0 writes the
   checkpoint when the last rank leaves), wait until they are gone, start fresh processes at the
   new size, which restore the checkpoint. Latency = decision -> first step of the new group
   (its `first_step_at`); the new group must resume at the step the old one stopped at, and from
   the checkpoint. Relaunch grow 2->3 and shrink 3->2 alternate.

Correctness is checked along the way: every generation resumes exactly at the step the previous
one stopped at (committed steps never go back, none is repeated), ranks hold identical parameters
at every sync (checksums), the coordinator counts no lost samples, at the end the job is paused
and samples_done = committed steps x global batch = the step of the checkpoint written when the
workers leave, and afterwards no process with HARVEST_JOB=<job id> in its environment is alive
(/proc), checked before sshd's own cleanup could hide a leak.

`--quick` (one of each rescale; local and torchrun ~30 s) runs every check above once
(tests/test_bench_quick.py); its latencies are single samples.

A table goes to stdout, progress to stderr; with --json the last stdout line is
{"local": {"grow_ms_p50", "grow_ms_p95", "shrink_ms_p50", "shrink_ms_p95", "cold_grow_ms_p50",
"relaunch_grow_ms_p50", "relaunch_shrink_ms_p50", "slots", "ranks": {nodes: ranks}, ...},
"ssh": {...}}.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

from core.inventory import local_nodes
from core.replay import percentile
from core.runtime import protocol as P
from core.runtime import ranks
from core.runtime.coordinator import JobCoordinator
from core.transports.base import Handle, NodeSpec, Transport

ROOT = Path(__file__).resolve().parent.parent
GOAL_MS = 1000.0
GLOBAL_BATCH = 64
TOTAL_SAMPLES = GLOBAL_BATCH * 10**8       # never reached: the job is stopped at the end
STEP_SECONDS = 0.02
BASE, BIG = 2, 3                           # grow BASE -> BIG, shrink BIG -> BASE


def _python() -> str:
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _log(msg: str) -> None:
    print(f"[bench.rescale] {msg}", file=sys.stderr, flush=True)


def job_pids(job_id: str) -> list[int]:
    """Live (non-zombie) processes with HARVEST_JOB=<job_id> in their environment."""
    needle = f"{P.ENV_JOB}={job_id}".encode()
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != b"Z" and needle in env:
            out.append(int(entry.name))
    return out


class Bench:
    """One job on 4 nodes of one transport, driven through its coordinator; every node runs
    one worker per slot and is grown, shrunk and relaunched as a whole."""

    def __init__(self, kind: str, transport: Transport, specs: list[NodeSpec], tmp: Path,
                 node_env: Optional[dict[str, dict[str, str]]] = None, step_seconds: float = STEP_SECONDS) -> None:
        self.kind, self.transport, self.tmp = kind, transport, tmp
        self.node_env = node_env or {}             # extra env of each node's workers (device binding)
        self.specs = {s.name: s for s in specs}
        self.slots = specs[0].slots
        self.names = [s.name for s in specs]
        self.job_id = f"rescale-{kind}-{os.getpid()}-{secrets.token_hex(3)}"
        self.ckpt = tmp / "checkpoint"
        self.coord = JobCoordinator(
            self.job_id, GLOBAL_BATCH, TOTAL_SAMPLES, checkpoint_dir=str(self.ckpt),
            extra_env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
        self.argv = [_python(), "examples/digits_cnn.py", "--step-seconds", str(step_seconds),
                     "--checkpoint-every", "86400", "--log-every", "1000000"]
        self.handles: dict[str, Handle] = {}       # worker key -> its current process
        self.incs: dict[str, int] = {}
        self.all_handles: list[Handle] = []
        self.pool = ThreadPoolExecutor(max_workers=4)

    # ---- workers ---------------------------------------------------------------------------
    def keys(self, nodes: list[str]) -> list[str]:
        return [k for n in nodes for k in ranks.keys_of(n, self.slots)]

    def env(self, node: str, order: list[str]) -> dict[str, dict[str, str]]:
        """The env of each of `node`'s ranks, started for a generation on `order` (nodes)."""
        envs = {}
        for key in self.keys([node]):
            env = self.coord.worker_env(key)
            env.update(ranks.place(self.keys(order), key).env())
            env.update(self.node_env.get(node, {}))
            self.incs[key] = int(env[P.ENV_INCARNATION])
            envs[key] = env
        return envs

    def launch(self, node: str, envs: dict[str, dict[str, str]]) -> None:
        for key, env in envs.items():
            log = str(self.tmp / "logs" / f"{key}-{env[P.ENV_INCARNATION]}.log")
            h = self.transport.start(self.specs[node], self.argv, env, str(ROOT), log)
            self.handles[key] = h
            self.all_handles.append(h)

    def start(self, node: str, order: list[str]) -> None:
        self.launch(node, self.env(node, order))

    def regroup(self, nodes: list[str]) -> int:
        return self.coord.regroup(self.keys(nodes))

    def dismiss(self, node: str) -> None:
        for key in self.keys([node]):
            self.coord.dismiss(key, incarnation=self.incs[key])

    def retire(self, node: str, wait_exit_s: float = 10.0) -> None:
        """After a dismiss: let the node's workers exit by themselves, then make sure (SIGTERM,
        SIGKILL)."""
        hs = [self.handles.pop(k) for k in self.keys([node])]
        deadline = time.monotonic() + wait_exit_s
        while time.monotonic() < deadline and any(self.transport.alive_many(hs).values()):
            time.sleep(0.02)
        res = self.transport.stop_many(hs, grace_s=5.0)
        if any(r != "gone" for r in res.values()):
            _log(f"{self.kind}: a dismissed worker on {node} did not exit by itself ({res})")

    # ---- waiting ---------------------------------------------------------------------------
    def wait(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            st = self.coord.status()
            if st["failed"] or st["finished"]:
                raise RuntimeError(f"{self.kind}: job ended while waiting for {what}: {st['error']}")
            if time.monotonic() > deadline:
                tails = {n: self.transport.tail(h, 8) for n, h in self.handles.items()}
                raise TimeoutError(f"{self.kind}: timed out after {timeout:.0f} s waiting for {what}\n"
                                   f"status={st}\nlogs={tails}")
            time.sleep(0.005)

    def gen(self, number: int) -> Optional[dict]:
        for g in reversed(self.coord.generations()):
            if g["gen"] == number:
                return g
        return None

    def wait_first_step(self, number: int, members: list[str], timeout: float = 120.0) -> dict:
        """The generation `number` once rank 0 committed its first step (it must run on the
        ranks of the nodes `members`)."""
        def done() -> bool:
            g = self.gen(number)
            return g is not None and g["first_step_at"] is not None
        self.wait(done, timeout, f"the first step of generation {number} on {members}")
        g = self.gen(number)
        assert g is not None
        if g["members"] != self.keys(members):
            raise RuntimeError(f"{self.kind}: generation {number} runs on {g['members']}, not {members}")
        return g

    def wait_steps(self, n: int, timeout: float = 60.0) -> None:
        """Let the running group commit `n` more steps (progress is published ~5x/s)."""
        s0 = self.coord.status()["committed_step"]
        self.wait(lambda: self.coord.status()["committed_step"] >= s0 + n, timeout, f"{n} more steps")

    def wait_ready(self, node: str, timeout: float = 120.0) -> None:
        self.wait(lambda: set(self.keys([node])) <= self.coord.ready(), timeout, f"warm workers on {node}")

    # ---- phases ----------------------------------------------------------------------------
    def setup(self, base: list[str]) -> None:
        t0 = time.monotonic()
        for n in base:
            self.start(n, base)
        self.wait(lambda: set(self.keys(base)) <= self.coord.ready(), 180, f"warm workers on {base}")
        g = self.regroup(base)
        self.wait_first_step(g, base)
        self.wait_steps(10)
        _log(f"{self.kind}: job {self.job_id} training on {base} ({time.monotonic() - t0:.1f} s)")

    def elastic(self, base: list[str], spares: list[str], repeats: int) -> dict:
        grow, shrink, grow_sw, shrink_sw, sync = [], [], [], [], []
        for k in range(repeats):
            node = spares[k % len(spares)]
            self.start(node, base + [node])           # the product: start while the job trains
            self.wait_ready(node)
            self.wait_steps(3)
            g = self.regroup(base + [node])           # the decision
            gr = self.wait_first_step(g, base + [node])
            grow.append(gr["decision_s"] * 1000)
            grow_sw.append(gr["switch_s"] * 1000)
            sync.append((gr["synced_at"] - gr["published_at"]) * 1000)
            self.wait_steps(10)
            g = self.regroup(base)                    # shrink, then dismiss the leaving workers
            sr = self.wait_first_step(g, base)
            self.dismiss(node)
            shrink.append(sr["decision_s"] * 1000)
            shrink_sw.append(sr["switch_s"] * 1000)
            _log(f"{self.kind} {k + 1}/{repeats}: grow {len(base)}->{len(base) + 1} "
                 f"{grow[-1]:.0f} ms (pause {grow_sw[-1]:.0f}), shrink {len(base) + 1}->{len(base)} "
                 f"{shrink[-1]:.0f} ms (pause {shrink_sw[-1]:.0f})")
            self.retire(node)
            self.wait_steps(3)
        return {"grow": grow, "shrink": shrink, "grow_pause": grow_sw, "shrink_pause": shrink_sw,
                "grow_sync": sync}

    def cold_grow(self, base: list[str], spares: list[str], repeats: int) -> list[float]:
        out = []
        for k in range(repeats):
            node = spares[k % len(spares)]
            self.wait_steps(3)
            env = self.env(node, base + [node])
            g = self.regroup(base + [node])           # the decision; the workers start now
            self.launch(node, env)
            gr = self.wait_first_step(g, base + [node])
            out.append(gr["decision_s"] * 1000)
            _log(f"{self.kind} cold grow {k + 1}/{repeats}: {out[-1]:.0f} ms "
                 f"(start + import torch + warm-up + regroup)")
            self.wait_steps(5)
            g = self.regroup(base)
            self.wait_first_step(g, base)
            self.dismiss(node)
            self.retire(node)
        return out

    def relaunch(self, old: list[str], new: list[str]) -> float:
        """Stop every worker of `old`, start fresh ones on `new`; ms to their first step."""
        before = self.coord.generations()[-1]["gen"]
        t0 = time.time()                              # the decision
        handles = [self.handles.pop(k) for k in self.keys(old)]
        res = self.transport.stop_many(handles, grace_s=20.0)
        if any(r != "term" for r in res.values()):
            raise RuntimeError(f"{self.kind}: a worker did not stop on SIGTERM: {res}")
        t_gone = time.time()
        # the coordinator has seen them go (a few ms): the new incarnations replace nothing live
        self.wait(lambda: all(self.coord.status()["workers"].get(k) == "gone" for k in self.keys(old)), 30,
                  f"the coordinator to see {old} gone")
        envs = {n: self.env(n, new) for n in new}
        g = self.regroup(new)
        list(self.pool.map(lambda n: self.launch(n, envs[n]), new))
        gr = self.wait_first_step(g, new)
        ms = (gr["first_step_at"] - t0) * 1000
        # the new group resumes from the checkpoint, at the step the old workers stopped at
        ended = [x for x in self.coord.generations() if before <= x["gen"] < g and x["end_step"] is not None]
        disk = json.loads((self.ckpt / "checkpoint.json").read_text())["step"]
        # (fresh processes: each restores it in attach(), so all ranks sync at the disk step)
        if not gr["start_step"] or gr["start_step"] != disk or not ended or \
                gr["start_step"] != max(x["end_step"] for x in ended):
            raise RuntimeError(f"{self.kind}: relaunch did not resume from the checkpoint: generation {gr}, "
                               f"checkpoint step {disk}, stopped generations {ended}")
        _log(f"{self.kind} relaunch {len(old)}->{len(new)}: {ms:.0f} ms (stop {1000 * (t_gone - t0):.0f} ms, "
             f"start -> first step {1000 * (gr['first_step_at'] - t_gone):.0f} ms), resumed at step "
             f"{gr['start_step']} from the checkpoint")
        return ms

    def finish(self) -> dict:
        """Pause the job (nothing runs), check the accounting, let every worker exit."""
        gens = self.coord.generations()
        g = self.coord.regroup([])
        self.wait(lambda: self.coord.status()["phase"] == "idle" and not self.coord.status()["regrouping"],
                  30, "the job to pause")
        st = self.coord.status()
        gens = self.coord.generations()
        checks: dict = {"generations": len(gens)}
        # every generation resumes where the previous one stopped: nothing lost, nothing repeated
        bad = [(a["gen"], a["end_step"], b["gen"], b["start_step"]) for a, b in zip(gens, gens[1:])
               if b["start_step"] is not None and a["end_step"] is not None and b["start_step"] != a["end_step"]]
        checks["steps_continuous"] = not bad and all(x["end_step"] is not None for x in gens)
        checks["checksums_equal"] = all(len({s["checksum"] for s in x["synced"].values()}) <= 1 for x in gens)
        checks["failed_generations"] = sum(1 for x in gens if x["failed"])
        committed = st["committed_step"]
        checks["committed_steps"] = committed
        checks["samples_done"] = st["samples_done"]
        checks["lost_samples"] = st["lost_samples"]
        held = ranks.nodes_of(self.handles)
        for n in held:                                # every worker is told to exit
            self.dismiss(n)
        for n in held:
            self.retire(n)
        disk = json.loads((self.ckpt / "checkpoint.json").read_text())["step"]
        checks["checkpoint_step"] = disk
        checks["samples_exact"] = (st["samples_done"] == committed * GLOBAL_BATCH == disk * GLOBAL_BATCH
                                   and gens[-1]["end_step"] == committed and st["lost_samples"] == 0)
        del g
        return checks

    def close(self) -> list[int]:
        """Stop everything this job started; returns the PIDs of its processes still alive."""
        try:
            self.coord.close(grace_s=1.0)
        finally:
            self.transport.stop_many(self.all_handles, grace_s=3.0)
            self.pool.shutdown(wait=True)
        deadline = time.monotonic() + 5.0
        left = job_pids(self.job_id)
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = job_pids(self.job_id)
        return left


def measure(kind: str, repeats: int, baseline_repeats: int, tmp: Path, slots: int = 1) -> dict:
    sshd = None
    transport: Optional[Transport] = None
    bench: Optional[Bench] = None
    out: dict = {}
    t_start = time.monotonic()
    try:
        if kind == "local":
            from core.transports.local import LocalTransport
            transport, specs = LocalTransport(), local_nodes(4, slots)
        elif kind == "ssh":
            from core.transports.ssh import SshTransport
            from tests.support.sshd import start_sshd
            sshd = start_sshd(tmp / "sshd")
            transport = SshTransport(config=str(sshd.client_config))
            specs = [NodeSpec(a, a, slots) for a in sshd.aliases[:4]]
        else:
            raise SystemExit(f"unknown transport {kind!r}: choose local or ssh")
        bench = Bench(kind, transport, specs, tmp / kind)
        names = bench.names
        base, spares = names[:BASE], names[BASE:]
        bench.setup(base)
        el = bench.elastic(base, spares, repeats)
        cold = bench.cold_grow(base, spares, baseline_repeats)
        rl_grow, rl_shrink = [], []
        for _ in range(baseline_repeats):
            rl_grow.append(bench.relaunch(base, base + spares[:1]))
            bench.wait_steps(5)
            rl_shrink.append(bench.relaunch(base + spares[:1], base))
            bench.wait_steps(5)
        checks = bench.finish()

        def p(v: list[float], q: float) -> Optional[float]:
            r = percentile(v, q)
            return None if r is None else round(r, 1)

        out = {"pattern": f"grow {BASE}->{BIG}, shrink {BIG}->{BASE}",
               "grow_ms_p50": p(el["grow"], .5), "grow_ms_p95": p(el["grow"], .95), "grow_n": len(el["grow"]),
               "shrink_ms_p50": p(el["shrink"], .5), "shrink_ms_p95": p(el["shrink"], .95),
               "shrink_n": len(el["shrink"]),
               "grow_pause_ms_p50": p(el["grow_pause"], .5), "shrink_pause_ms_p50": p(el["shrink_pause"], .5),
               "grow_sync_ms_p50": p(el["grow_sync"], .5),
               "cold_grow_ms_p50": p(cold, .5), "cold_grow_ms_p95": p(cold, .95), "cold_grow_n": len(cold),
               "relaunch_grow_ms_p50": p(rl_grow, .5), "relaunch_grow_ms_p95": p(rl_grow, .95),
               "relaunch_grow_n": len(rl_grow),
               "relaunch_shrink_ms_p50": p(rl_shrink, .5), "relaunch_shrink_ms_p95": p(rl_shrink, .95),
               "relaunch_shrink_n": len(rl_shrink),
               "step_seconds": STEP_SECONDS, "slots": slots,
               "ranks": {str(BASE): BASE * slots, str(BIG): BIG * slots}, **checks}
    finally:
        left: list[int] = []
        if bench is not None:
            left = bench.close()
            if left:
                _log(f"{kind}: processes of job {bench.job_id} still alive after stopping: {left}")
        if transport is not None:
            transport.close()
        if sshd is not None:
            extra = sshd.stop()
            if extra:
                _log(f"{kind}: sshd had to kill session leftovers {extra}")
            left = sorted(set(left) | set(job_pids(bench.job_id) if bench else []))
        if out:
            out["leftover_processes"] = len(left)
            out["wall_s"] = round(time.monotonic() - t_start, 1)
    return out


def measure_torchrun(repeats: int, tmp: Path, slots: int = 1) -> dict:
    """What the import buys: examples/torchrun_digits.py (an unmodified torchrun-style script) as
    a `launcher: torchrun` job on local nodes, through the dispatcher's restart path; grow 2->3 and
    shrink 3->2 are each a stop (SIGTERM, the script checkpoints) and a restart from the
    checkpoint. The figure is the dispatcher's own measured cost: stop -> first progress line of
    the new generation, plus the samples lost to the checkpoint at the previous rate."""
    from core.dispatchers.workers import WorkerDispatcher
    from core.model import Curve, Job, PauseSample
    from core.transports.local import LocalTransport

    t_start = time.monotonic()
    specs = local_nodes(3, slots)
    d = WorkerDispatcher(LocalTransport(), specs, tmp / "torchrun", workdir=str(ROOT))
    job = Job(id=f"rescale-torchrun-{os.getpid()}-{secrets.token_hex(3)}", min_nodes=1, max_nodes=3,
              total_samples=float(TOTAL_SAMPLES), curve=Curve((1,), (1.0,)), launcher="torchrun",
              stop_grace_seconds=30.0,
              command=(_python(), "examples/torchrun_digits.py", "--total-samples", str(TOTAL_SAMPLES),
                       "--global-batch", str(GLOBAL_BATCH), "--step-seconds", str(STEP_SECONDS),
                       "--checkpoint-every", "50", "--log-every", "5"))
    names = [s.name for s in specs]
    costs: dict[str, list[float]] = {"up": [], "down": []}

    def drive(until: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            for e in d.poll(time.time()):
                if e.job == job.id and e.kind.value in ("job_failed", "node_leave"):
                    raise RuntimeError(f"torchrun: {e.kind.value} {e.detail}")
            for smp in d.samples(time.time()):
                if isinstance(smp, PauseSample):
                    costs[smp.kind].append(smp.seconds * 1000)
            if time.monotonic() > deadline:
                raise TimeoutError(f"torchrun: timed out waiting for {what}: {d.status(job.id)}")
            time.sleep(0.05)

    try:
        d.resize(job, names[:BASE], time.time())
        drive(lambda: d.progress(job, 0) > 0, 180, "the first progress")
        for k in range(repeats):
            for size, kind in ((BIG, "up"), (BASE, "down")):
                n = len(costs[kind])
                before = d.progress(job, 0)
                d.resize(job, names[:size], time.time())
                drive(lambda: len(costs[kind]) > n, 300, f"the restart at {size} nodes")
                drive(lambda: d.progress(job, 0) > before, 120, "progress after the restart")
                _log(f"torchrun {k + 1}/{repeats}: restart to {size} nodes {costs[kind][-1]:.0f} ms")
        st = d.status(job.id) or {}
    finally:
        d.stop(job, time.time())
        d.close()
    left = job_pids(job.id)
    return {"pattern": f"grow {BASE}->{BIG}, shrink {BIG}->{BASE}", "slots": slots,
            "ranks": {str(BASE): BASE * slots, str(BIG): BIG * slots},
            "restart_grow_ms_p50": round(percentile(costs["up"], .5), 1),
            "restart_grow_ms_p95": round(percentile(costs["up"], .95), 1), "restart_grow_n": len(costs["up"]),
            "restart_shrink_ms_p50": round(percentile(costs["down"], .5), 1),
            "restart_shrink_ms_p95": round(percentile(costs["down"], .95), 1),
            "restart_shrink_n": len(costs["down"]), "lost_samples": st.get("lost_samples"),
            "leftover_processes": len(left), "wall_s": round(time.monotonic() - t_start, 1)}


ROWS = [("grow", "elastic grow 2->3 (warm worker), ms", True),
        ("shrink", "elastic shrink 3->2, ms", True),
        ("cold_grow", "cold grow 2->3 (worker started at decision), ms", False),
        ("relaunch_grow", "relaunch grow 2->3 (stop, ckpt, restart), ms", False),
        ("relaunch_shrink", "relaunch shrink 3->2 (stop, ckpt, restart), ms", False)]


def table(results: dict) -> str:
    head = ["transport", "metric", "p50", "p95", "n", "goal p50", "ok?"]
    lines = [head]
    for kind, r in results.items():
        for key, label, goal in ROWS:
            p50, p95 = r.get(f"{key}_ms_p50"), r.get(f"{key}_ms_p95")
            ok = "-" if not goal else ("yes" if p50 is not None and p50 <= GOAL_MS else "NO")
            lines.append([kind, label, "-" if p50 is None else f"{p50:.0f}",
                          "-" if p95 is None else f"{p95:.0f}", str(r.get(f"{key}_n", 0)),
                          f"<= {GOAL_MS:.0f}" if goal else "(baseline)", ok])
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    text = "\n".join("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     for row in lines)
    notes = []
    for kind, r in results.items():
        if r.get("grow_ms_p50") and r.get("relaunch_grow_ms_p50"):
            notes.append(f"{kind}: relaunch grow / elastic grow = "
                         f"{r['relaunch_grow_ms_p50'] / r['grow_ms_p50']:.1f}x; training pause p50 "
                         f"grow {r['grow_pause_ms_p50']:.0f} ms, shrink {r['shrink_pause_ms_p50']:.0f} ms; "
                         f"state sync of a grow (run sent -> every rank synced) {r['grow_sync_ms_p50']:.0f} ms")
        notes.append(f"{kind}: {r['generations']} generations, {r['committed_steps']} steps committed, "
                     f"samples_done {r['samples_done']} = steps x {GLOBAL_BATCH} = checkpoint: "
                     f"{r['samples_exact']}; steps continuous: {r['steps_continuous']}; checksums equal: "
                     f"{r['checksums_equal']}; lost samples {r['lost_samples']}; failed generations "
                     f"{r['failed_generations']}; processes left: {r['leftover_processes']}; {r['wall_s']} s")
    return text + "\n" + "\n".join(notes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.rescale", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeats", type=int, default=10, help="elastic grows and shrinks (each)")
    ap.add_argument("--baseline-repeats", type=int, default=None,
                    help="cold grows, relaunch grows and relaunch shrinks (each; default min(3, repeats))")
    ap.add_argument("--transport", default="local,ssh,torchrun",
                    help="local, ssh (the runtime's regroups) and torchrun (an unmodified script, "
                         "restarted from its checkpoint, on local nodes)")
    ap.add_argument("--slots", type=int, default=1, help="ranks (worker processes) per node")
    ap.add_argument("--quick", action="store_true",
                    help="one of each rescale (--repeats 1 --baseline-repeats 1): does every path still work")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.baseline_repeats = 1, 1
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if not 1 <= args.slots <= 16:
        ap.error("--slots must be from 1 to 16 (each rank is a process on this machine)")
    base_n = args.baseline_repeats if args.baseline_repeats is not None else min(3, args.repeats)
    kinds = [k.strip() for k in args.transport.split(",") if k.strip()]
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-rescale-") as tmp:
        for kind in kinds:
            _log(f"{kind}: start")
            results[kind] = (measure_torchrun(base_n, Path(tmp), args.slots) if kind == "torchrun" else
                             measure(kind, args.repeats, base_n, Path(tmp), args.slots))
    print(f"Rescale latency, decision -> first step at the new size; digits CNN, global batch "
          f"{GLOBAL_BATCH}, step >= {STEP_SECONDS * 1000:.0f} ms, {args.slots} rank(s) per node "
          f"({BASE * args.slots} -> {BIG * args.slots} ranks), {os.cpu_count()} CPUs")
    regroups = {k: r for k, r in results.items() if k != "torchrun"}
    if regroups:
        print(table(regroups))
    if "torchrun" in results:
        r = results["torchrun"]
        print(f"torchrun (unmodified script, restart from checkpoint), local: grow {BASE}->{BIG} p50 "
              f"{r['restart_grow_ms_p50']:.0f} ms (p95 {r['restart_grow_ms_p95']:.0f}), shrink {BIG}->{BASE} p50 "
              f"{r['restart_shrink_ms_p50']:.0f} ms (p95 {r['restart_shrink_ms_p95']:.0f}); n {r['restart_grow_n']}; "
              f"processes left: {r['leftover_processes']}")
    ok = all(r["leftover_processes"] == 0 and (k == "torchrun" or (r["samples_exact"] and r["steps_continuous"]
                                                                      and r["checksums_equal"]))
             for k, r in results.items())
    if args.json:
        print(json.dumps(results))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
