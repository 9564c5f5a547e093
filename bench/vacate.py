"""Preemption, measured on the product's own path: a job runs on 3 nodes through the
WorkerDispatcher; the node source takes one back (`vacate`, as the controller calls it), and we
time until the worker process is gone and until the job's first step without it. Both
transports run their workers on this machine (ssh through a loopback sshd), so "gone" is read
from /proc every 2 ms for either, not through a round trip of the transport.

    python -m bench.vacate [--json] [--repeats 10] [--transport local,ssh] [--quick]

`--quick` (2 vacates per transport, ~20 s) checks that the path still works, not how fast.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from core.dispatchers.workers import WorkerDispatcher
from core.inventory import local_nodes
from core.model import Curve, Job
from core.replay import percentile
from core.transports.base import NodeSpec

ROOT = Path(__file__).resolve().parent.parent
GOAL_MS = 2000.0


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def _wait(cond, timeout: float, what: str):
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(what)
        time.sleep(0.002)


def measure(kind: str, repeats: int, workdir: Path, log=print) -> dict:
    sshd = None
    if kind == "local":
        from core.transports.local import LocalTransport
        transport, specs = LocalTransport(), local_nodes(4)
    else:
        from core.transports.ssh import SshTransport
        from tests.support.sshd import start_sshd
        sshd = start_sshd(workdir / "sshd")
        transport = SshTransport(config=str(sshd.client_config))
        specs = [NodeSpec(f"node{i}", f"node{i}") for i in range(4)]
    names = [s.name for s in specs]
    d = WorkerDispatcher(transport, specs, workdir / f"workers-{kind}", workdir=str(ROOT))
    job = Job(id=f"vacate-{kind}", min_nodes=1, max_nodes=4, total_samples=64 * 10**7,
              curve=Curve((1, 4), (100.0, 400.0)), global_batch=64,
              command=(sys.executable, "examples/digits_cnn.py", "--step-seconds", "0.02"))
    gone_ms, resumed_ms = [], []
    try:
        members = names[:3]
        d.resize(job, members, time.time())
        _wait(lambda: (d.status(job.id) or {}).get("world_size") == 3 and
              (d.status(job.id) or {}).get("samples_per_second"), 120, "3 nodes")
        for k in range(repeats):
            victim = members[k % 3]
            handle = d._runs[job.id].handles[victim]
            step0 = d.status(job.id)["committed_step"]
            t0 = time.monotonic()
            d.vacate(job, [victim], time.time())
            gone_at = resumed_at = None
            while gone_at is None or resumed_at is None:
                now = time.monotonic()
                if now - t0 > 20:
                    raise TimeoutError("vacate")
                st = d.status(job.id)
                if resumed_at is None and st["world_size"] == 2 and not st["regrouping"] \
                        and st["committed_step"] > step0:
                    resumed_at = now
                if gone_at is None and _gone(handle.pid):
                    gone_at = now
                time.sleep(0.002)
            gone_ms.append((gone_at - t0) * 1000)
            resumed_ms.append((resumed_at - t0) * 1000)
            log(f"[bench.vacate] {kind} {k + 1}/{repeats}: worker gone {gone_ms[-1]:.0f} ms, "
                f"training on 2 nodes {resumed_ms[-1]:.0f} ms", file=sys.stderr)
            members = [n for n in members if n != victim]
            spare = next(n for n in names if n not in members and n != victim)
            members = members + [spare]
            d.resize(job, members, time.time())
            _wait(lambda: d.status(job.id)["world_size"] == 3 and not d.status(job.id)["regrouping"], 120, "back to 3")
    finally:
        d.stop(job, time.time())
        d.close()
        if sshd is not None:
            sshd.stop()
    return {"vacate_ms_p50": round(percentile(gone_ms, 0.5), 1), "vacate_ms_p95": round(percentile(gone_ms, 0.95), 1),
            "vacate_resumed_ms_p50": round(percentile(resumed_ms, 0.5), 1),
            "vacate_resumed_ms_p95": round(percentile(resumed_ms, 0.95), 1), "vacate_n": len(gone_ms)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.vacate", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--transport", default="local,ssh")
    ap.add_argument("--quick", action="store_true", help="2 vacates per transport (--repeats 2)")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats = 2
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench-vacate-") as tmp:
        for kind in args.transport.split(","):
            out[kind] = measure(kind, args.repeats, Path(tmp))
    print(f"{'transport':<10} {'metric':<40} {'p50':>8} {'p95':>8} {'goal':>10}")
    for kind, r in out.items():
        print(f"{kind:<10} {'reclaim -> worker gone, ms':<40} {r['vacate_ms_p50']:>8} {r['vacate_ms_p95']:>8} "
              f"{'<= 2000':>10}")
        print(f"{kind:<10} {'reclaim -> training on the rest, ms':<40} {r['vacate_resumed_ms_p50']:>8} "
              f"{r['vacate_resumed_ms_p95']:>8}")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
