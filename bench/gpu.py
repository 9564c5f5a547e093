"""Elastic regroups through NCCL on this machine's GPUs: one rank per GPU, the node as the unit.

    python -m bench.gpu [--json] [--repeats 5]

With G >= 2 GPUs the machine is split into two pretend nodes of G // 2 GPUs each (each node's
workers see only their GPUs through CUDA_VISIBLE_DEVICES; rank i of a node runs on its
cuda:LOCAL_RANK). One job of examples/digits_cnn.py trains on node 0 (G // 2 ranks), grows to
both nodes (all GPUs used) and shrinks back, `--repeats` times, through JobCoordinator and the
local transport, as bench.rescale does on CPUs. With one GPU it runs the job on that GPU alone
and pauses and resumes it (a new NCCL group each time): growing needs a second GPU. Checked:
every rank synced on its cuda device with the nccl backend, parameters equal on every rank at
each sync, steps continuous, samples exact, no process left. Without CUDA it says so and exits
0: nothing was measured.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.rescale import Bench, _log
from core.replay import percentile
from core.transports.base import NodeSpec
from core.transports.local import LocalTransport


def _gpus() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _nccl_everywhere(bench: Bench) -> bool:
    places = [s.get("place") or {} for g in bench.coord.generations() for s in g["synced"].values()]
    return bool(places) and all(p.get("backend") == "nccl" and str(p.get("device", "")).startswith("cuda")
                                for p in places)


def run(gpus: int, repeats: int, tmp: Path) -> dict:
    per_node = max(1, gpus // 2)
    nodes = 2 if gpus >= 2 else 1
    specs = [NodeSpec(f"gpu-node-{i}", "", per_node) for i in range(nodes)]
    node_env = {s.name: {"CUDA_VISIBLE_DEVICES": ",".join(str(i * per_node + d) for d in range(per_node))}
                for i, s in enumerate(specs)}
    bench = Bench("cuda", LocalTransport(), specs, tmp, node_env=node_env, step_seconds=0.0)
    out: dict = {"gpus": gpus, "nodes": nodes, "slots": per_node}
    try:
        base = [specs[0].name]
        bench.setup(base)
        if nodes == 2:
            el = bench.elastic(base, [specs[1].name], repeats)
            out.update({"grow_ms": el["grow"], "shrink_ms": el["shrink"],
                        "ranks": {"1": per_node, "2": 2 * per_node}})
        else:
            resume = []
            for k in range(repeats):
                bench.regroup([])
                bench.wait(lambda: bench.coord.status()["phase"] == "idle", 60, "the pause")
                g = bench.regroup(base)
                resume.append(bench.wait_first_step(g, base)["decision_s"] * 1000)
                _log(f"cuda pause/resume {k + 1}/{repeats}: {resume[-1]:.0f} ms")
                bench.wait_steps(5)
            out.update({"resume_ms": resume, "ranks": {"1": 1}})
        out["nccl_on_every_rank"] = _nccl_everywhere(bench)
        out.update(bench.finish())
    finally:
        out["leftover_processes"] = len(bench.close())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    gpus = _gpus()
    if not gpus:
        print("bench.gpu: CUDA is not available on this machine: nothing was measured (the NCCL path "
              "needs a GPU machine)")
        if args.json:
            print(json.dumps({"cuda": False}))
        return 0
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        r = run(gpus, args.repeats, Path(tmp))
    r["wall_s"] = round(time.monotonic() - t0, 1)
    p50 = lambda k: percentile(r[k], 0.5) if r.get(k) else None
    print(f"NCCL regroups: {gpus} GPU(s), {r['nodes']} pretend node(s) x {r['slots']} GPU(s), digits CNN")
    for key, label in (("grow_ms", f"grow 1->2 nodes ({r['slots']}->{2 * r['slots']} ranks)"),
                       ("shrink_ms", f"shrink 2->1 nodes ({2 * r['slots']}->{r['slots']} ranks)"),
                       ("resume_ms", "pause/resume on 1 GPU")):
        if r.get(key):
            print(f"  {label:<36} p50 {p50(key):7.0f} ms   max {max(r[key]):7.0f} ms   n {len(r[key])}")
    ok = (r["nccl_on_every_rank"] and r["samples_exact"] and r["steps_continuous"] and r["checksums_equal"]
          and r["leftover_processes"] == 0)
    print(f"  nccl on every rank: {r['nccl_on_every_rank']}; samples exact: {r['samples_exact']}; steps "
          f"continuous: {r['steps_continuous']}; checksums equal: {r['checksums_equal']}; processes left: "
          f"{r['leftover_processes']}; {r['wall_s']} s")
    if args.json:
        print(json.dumps({"cuda": True, **r}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
