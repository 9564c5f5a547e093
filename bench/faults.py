"""Dead hosts under training jobs (issue 56): how soon a host that dies is noticed, how soon its
job trains again on the rest, and how soon the host is used again once it recovers.

Real pieces only: `python -m app --dispatch ssh` with four hosts in network namespaces (each its
own address, loopback and sshd: tests/support/netns.py), a runtime job (examples/digits_cnn.py)
and a torchrun job (examples/torchrun_digits.py) of 2 nodes each, registered through the API, so
that each has another host to train on when one of its hosts dies. Round after round
one host of one job (the launchers take turns) dies the hard way: its link goes down, then its
sshd and every process in it get SIGKILL, no word to anyone. It stays dead `--down` seconds, then
its link and a fresh sshd come back. Per loss, from the kill (or from the recovery):

  detect_s       the host leaves its job (the harvester noticed)
  train_s        the job's progress moves again on the other hosts
  back_s         from the recovery: the host is offered again (idle or harvested)
  regrow_s       from the recovery: a job holds the host again

and what must never happen (`violations`): a job failing, a dead host offered after it was
noticed, a healthy host declared lost, a host not back within 30 s of its recovery. At the end
both jobs run to their exact total samples. `--json` prints one line; `--quick` does one loss per
launcher (the chaos test, tests/test_chaos.py).

    python -m bench.faults [--rounds 10] [--down 20] [--json] [--quick]
"""
from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from core.replay import percentile
from tests.support.netns import NetnsCluster
from tests.support.pace import PaceFile
from tests.support.server import ROOT, AppProcess, start_app

GLOBAL_BATCH = 64
STEP_S = 0.05            # a step's pace while the hosts die (released at the end)
BACK_WITHIN_S = 30.0     # a recovered host must be offered again within this
HOSTS, PER_JOB = 4, 2    # two jobs of 2 nodes each on 4 hosts
OFFERED = ("idle", "harvested")


@dataclass
class Loss:
    launcher: str
    node: str
    killed: float                     # monotonic times
    killed_wall: float = 0.0          # the same on the wall clock (the store's events)
    detected: Optional[float] = None
    trained: Optional[float] = None
    recovered: Optional[float] = None
    back: Optional[float] = None
    regrown: Optional[float] = None

    def figures(self) -> dict:
        def since(a: Optional[float], b: Optional[float]) -> Optional[float]:
            return None if a is None or b is None else round(b - a, 2)
        return {"launcher": self.launcher, "node": self.node, "detect_s": since(self.killed, self.detected),
                "train_s": since(self.killed, self.trained), "back_s": since(self.recovered, self.back),
                "regrow_s": since(self.recovered, self.regrown)}


@dataclass
class Watch:
    """Polls /api/cluster and the jobs every 0.25 s in a thread: who holds what, and progress."""
    app: AppProcess
    jobs: dict[str, str]              # launcher -> job id
    nodes: dict[str, dict] = field(default_factory=dict)       # node -> its row
    progress: dict[str, float] = field(default_factory=dict)   # job id -> samples done
    moved: dict[str, float] = field(default_factory=dict)      # job id -> when its progress last went up
    states: dict[str, str] = field(default_factory=dict)
    offered_while_dead: list[str] = field(default_factory=list)
    dead: dict[str, float] = field(default_factory=dict)       # node -> when it was noticed dead
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.poll()
            except (OSError, ValueError, KeyError):
                pass
            self.stop.wait(0.25)

    def poll(self) -> None:
        t = time.monotonic()
        _, cluster = self.app.get("/api/cluster")
        self.nodes = {row["name"]: row for row in cluster["nodes"]}
        for node, noticed in list(self.dead.items()):
            if t - noticed > 1.0 and self.nodes[node]["state"] in OFFERED:
                self.offered_while_dead.append(f"{node} offered ({self.nodes[node]['state']}) "
                                               f"{t - noticed:.1f} s after it was noticed dead")
        for jid in self.jobs.values():
            _, job = self.app.get(f"/api/jobs/{jid}")
            self.states[jid] = job["state"]
            done = float(job.get("samples_done") or 0.0)
            if done > self.progress.get(jid, -1.0):
                self.moved[jid] = t
            self.progress[jid] = done

    def holders(self, jid: str) -> list[str]:
        return [n for n, row in self.nodes.items() if row.get("job") == jid]


def until(cond, timeout: float, what: str, period: float = 0.1) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return time.monotonic()
        time.sleep(period)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


def submit(app: AppProcess, token: str, launcher: str, pace: PaceFile, steps: int, folder: Path) -> str:
    total = GLOBAL_BATCH * steps
    if launcher == "torchrun":
        command = [sys.executable, str(ROOT / "examples" / "torchrun_digits.py"), "--total-samples", str(total),
                   "--global-batch", str(GLOBAL_BATCH), "--checkpoint-every", "20", "--log-every", "5",
                   "--pg-timeout", "20", *pace.args]
        extra = {"launcher": "torchrun", "stop_grace_seconds": 10}
    else:
        command = [sys.executable, str(ROOT / "examples" / "digits_cnn.py"), "--total-samples", str(total),
                   "--global-batch", str(GLOBAL_BATCH), "--log-every", "100", "--checkpoint-dir",
                   str(folder / "ckpt-runtime"), *pace.args]
        extra = {"global_batch": GLOBAL_BATCH}
    status, job = app.request("POST", "/api/jobs", {
        "name": f"{launcher} under dying hosts", "min_nodes": 1, "max_nodes": PER_JOB, "total_samples": total,
        "curve": "1:100, 2:200", "scale_up_seconds": 1, "scale_down_seconds": 1,
        "command": command, **extra}, token=token)
    if status != 201:
        raise RuntimeError(f"the {launcher} job was refused: {job}")
    return job["id"]


def one_loss(cluster: NetnsCluster, watch: Watch, launcher: str, down_s: float, turn: int = 0) -> Loss:
    jid = watch.jobs[launcher]
    victims = until(lambda: len(watch.holders(jid)) == PER_JOB, 120, f"the {launcher} job on {PER_JOB} hosts") \
        and watch.holders(jid)
    until(lambda: time.monotonic() - watch.moved.get(jid, 0.0) < 1.0, 120, f"the {launcher} job training")
    node = sorted(victims)[turn % len(victims)]      # each of the job's hosts in turn
    loss = Loss(launcher, node, time.monotonic(), time.time())
    cluster.take_down(node)
    loss.detected = until(lambda: node not in watch.holders(jid), 60, f"{node}'s loss noticed")
    watch.dead[node] = loss.detected
    seen = watch.progress.get(jid, 0.0)
    last = [seen]

    def moving() -> bool:
        now, before = watch.progress.get(jid, 0.0), last[0]
        last[0] = now
        return now > before and watch.holders(jid) != []
    try:           # measured while the host is still dead: the job trains on the others
        loss.trained = until(moving, max(1.0, loss.killed + down_s - time.monotonic()),
                             f"the {launcher} job training again", period=0.25)
    except TimeoutError:
        pass
    time.sleep(max(0.0, loss.killed + down_s - time.monotonic()))
    cluster.bring_back(node)
    loss.recovered = time.monotonic()
    watch.dead.pop(node, None)
    try:
        loss.back = until(lambda: watch.nodes[node]["state"] in OFFERED, 60, f"{node} offered again")
        loss.regrown = until(lambda: watch.nodes[node]["state"] == "harvested", 90, f"{node} used again")
    except TimeoutError:
        pass
    print(f"{launcher}: {node} " + ", ".join(f"{k} {v}" for k, v in loss.figures().items()
                                              if k.endswith("_s")), file=sys.stderr, flush=True)
    return loss


def lost_events(db: Path) -> list[tuple[float, str, str]]:
    """(time, node, detail) of every node a dispatcher lost (a leave with a job)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        return [tuple(r) for r in con.execute(
            "SELECT time, node, detail FROM events WHERE kind = 'node_leave' AND job IS NOT NULL ORDER BY id")]


def run(rounds: int, down_s: float, folder: Path) -> dict:
    with NetnsCluster(HOSTS, folder / "hosts") as cluster:
        inventory = cluster.write_inventory(folder / "nodes.txt")
        app = start_app(folder / "app", "--fresh", "--dispatch", "ssh", "--nodes", str(inventory),
                        "--ssh-config", str(cluster.ssh_config), "--advertise", cluster.head,
                        "--worker-env", "GLOO_SOCKET_IFNAME", "--tick", "0.1", "--workdir", str(ROOT),
                        "--no-profiler", env={"GLOO_SOCKET_IFNAME": "eth0"})
        watch: Optional[Watch] = None
        try:
            token = app.token("alice")
            pace = PaceFile(folder, STEP_S)
            steps = int((2 * rounds * (down_s + 30) + 120) / STEP_S)     # still training after the last round
            jobs = {name: submit(app, token, name, pace, steps, folder) for name in ("runtime", "torchrun")}
            watch = Watch(app, jobs)
            threading.Thread(target=watch.run, daemon=True, name="faults-watch").start()
            losses = [one_loss(cluster, watch, ("runtime", "torchrun")[i % 2], down_s, i // 2)
                      for i in range(2 * rounds)]
            pace.release()
            until(lambda: all(watch.states.get(j) in ("done", "failed", "cancelled") for j in jobs.values()),
                  600, "both jobs ended", period=0.5)
            finals = {name: app.get(f"/api/jobs/{jid}")[1] for name, jid in jobs.items()}
            violations = list(watch.offered_while_dead)
            for t, node, detail in lost_events(app.db):
                if not any(x.node == node and x.killed_wall - 1 <= t <= x.killed_wall + down_s + 60 for x in losses):
                    violations.append(f"{node} declared lost while it was healthy: {detail}")
            for x in losses:
                if x.back is None or x.recovered is None or x.back - x.recovered > BACK_WITHIN_S:
                    violations.append(f"{x.node} not offered again within {BACK_WITHIN_S:g} s of its recovery")
            for name, job in finals.items():
                if job["state"] != "done" or job["samples_done"] != job["total_samples"]:
                    violations.append(f"the {name} job ended {job['state']} at {job['samples_done']} of "
                                      f"{job['total_samples']} samples: {job.get('failure')}")
            return summary(losses, violations, finals, rounds, down_s)
        finally:
            if watch is not None:
                watch.stop.set()
            app.stop()


def summary(losses: list[Loss], violations: list[str], finals: dict, rounds: int, down_s: float) -> dict:
    out: dict = {"rounds": rounds, "down_s": down_s, "hosts": HOSTS, "losses": [x.figures() for x in losses],
                 "violations": violations,
                 "jobs": {n: {"state": j["state"], "samples_done": j["samples_done"],
                              "total_samples": j["total_samples"]} for n, j in finals.items()}}
    for launcher in ("runtime", "torchrun"):
        rows = [x.figures() for x in losses if x.launcher == launcher]
        for key in ("detect_s", "train_s", "back_s", "regrow_s"):
            vals = [r[key] for r in rows if r[key] is not None]
            for q, name in ((0.5, "p50"), (0.95, "p95")):
                v = percentile(vals, q)
                out[f"{launcher}_{key}_{name}"] = None if v is None else round(v, 2)
            out[f"{launcher}_{key}_n"] = len(vals)
    return out


def table(out: dict) -> str:
    lines = [f"{len(out['losses'])} host losses on {out['hosts']} namespaced hosts (ssh), each down {out['down_s']:g} s",
             "", "| launcher | detected | trains again | offered again | used again |", "|---|---:|---:|---:|---:|"]
    for launcher in ("runtime", "torchrun"):
        cells = [f"{out[f'{launcher}_{k}_p50']} / {out[f'{launcher}_{k}_p95']} s (n={out[f'{launcher}_{k}_n']})"
                 for k in ("detect_s", "train_s", "back_s", "regrow_s")]
        lines.append(f"| {launcher} | " + " | ".join(cells) + " |")
    lines += ["", "p50 / p95; detected and trains again from the kill, offered and used again from the recovery",
              "jobs: " + ", ".join(f"{n} {j['state']} {j['samples_done']:,.0f}/{j['total_samples']:,.0f}"
                                   for n, j in out["jobs"].items()),
              "violations: " + ("; ".join(out["violations"]) or "none")]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10, help="host losses per launcher (default 10)")
    ap.add_argument("--down", type=float, default=None,
                    help="seconds a host stays dead (default 50: longer than a torchrun job's restart under load)")
    ap.add_argument("--quick", action="store_true", help="one loss per launcher (the chaos test)")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON line")
    ap.add_argument("--keep", default=None, help="a folder for the hosts, the store and the logs, kept afterwards")
    args = ap.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    args.down = args.down if args.down is not None else 50.0
    if rounds < 1 or args.down <= 0:
        ap.error("--rounds must be at least 1 and --down positive")
    if args.keep:
        out = run(rounds, args.down, Path(args.keep).resolve())
    else:
        with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
            out = run(rounds, args.down, Path(tmp))
    print(json.dumps(out) if args.json else table(out))
    return 0 if not out["violations"] else 1


if __name__ == "__main__":
    sys.exit(main())
