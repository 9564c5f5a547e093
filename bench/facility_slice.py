"""bench.facility's slice of the trace: the main jobs a window of it makes on N nodes, its idle
periods and node-seconds, the harvester's job set run K times faster, and what core.replay
predicts for the same (see bench/facility.py)."""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from core.controller_config import ControllerConfig
from core.jobsets import load_jobset
from core.model import Job
from core.replay import Replay, ReplaySettings
from core.sources.trace import read_node_list, read_transitions
from core.timeutil import iso


@dataclass
class MainJob:
    idx: int
    node: str          # the Slurm node it is pinned to (nodeI)
    at: float          # seconds after the clock starts (compressed); 0 for the initial ones
    run_s: float       # compressed span
    initial: bool      # under way when the window opens: submitted before the clock starts


@dataclass
class Slice:
    summit: list[str]                      # the trace's node names, in order
    names: list[str]                       # node1..nodeN, the same order
    start: float
    end: float
    compress: float
    jobs: list[MainJob]
    idle_node_s: float                     # idle node-seconds of the slice, compressed
    lines: list[tuple[float, str, str]]    # the compressed trace (time, node, state) for the replay

    @property
    def window_s(self) -> float:
        return (self.end - self.start) / self.compress


def take_slice(trace: Path, node_list: Path, nodes: int, start: float, hours: float, compress: float) -> Slice:
    """The slice's main jobs, its idle node-seconds and its compressed trace (see the module doc)."""
    end = start + hours * 3600.0
    order = {n: i for i, n in enumerate(read_node_list(node_list))}
    state: dict[str, bool] = {}                # idle? as of the window's start
    inside: list[tuple[float, str, bool]] = []
    for t, node, idle, _ in read_transitions(trace):
        if t < start:
            state[node] = idle
        elif t < end:
            inside.append((t, node, idle))
        else:
            break
    seen = {n for n, idle in state.items() if idle} | {n for _, n, _ in inside}
    pick = sorted(seen, key=lambda n: (order.get(n, len(order)), n))[:nodes]
    if len(pick) < nodes:                      # too few ever idle: the rest busy throughout
        rest = [n for n in sorted(order, key=order.get) if n not in set(pick)]
        pick += rest[:nodes - len(pick)]
    name = {s: f"node{i + 1}" for i, s in enumerate(pick)}
    k = compress
    idle = {s: state.get(s, False) for s in pick}
    since = {s: start for s in pick}
    jobs: list[MainJob] = []
    idle_s = 0.0
    lines = [(start - 1.0, name[s], "idle") for s in pick if idle[s]]

    def close(s: str, t: float) -> None:
        nonlocal idle_s
        if idle[s]:
            idle_s += t - since[s]
        else:
            b = since[s]
            jobs.append(MainJob(len(jobs), name[s], (b - start) / k, (t - b) / k, b == start))

    for t, s, now_idle in inside:
        if s not in name or idle[s] == now_idle:
            continue
        close(s, t)
        idle[s], since[s] = now_idle, t
        lines.append((start + (t - start) / k, name[s], "idle" if now_idle else "busy"))
    for s in pick:
        close(s, end)
    jobs.sort(key=lambda j: (j.at, j.idx))
    for i, j in enumerate(jobs):
        j.idx = i
    return Slice(pick, [name[s] for s in pick], start, end, k, jobs, idle_s / k, lines)


def compressed_jobs(path: Path, count: int, compress: float) -> list[Job]:
    """The first `count` jobs of the job set, K times faster: costs / K, throughputs x K."""
    jobs = load_jobset(path)[:count]
    if len(jobs) < count:
        raise SystemExit(f"{path} holds {len(jobs)} job(s), fewer than --job-count {count}")
    for j in jobs:
        j.scale_up_seconds /= compress
        j.scale_down_seconds /= compress
        for attr in ("curve", "true_curve", "given_curve"):
            c = getattr(j, attr)
            if c is not None:
                setattr(j, attr, type(c)(c.nodes, tuple(r * compress for r in c.samples_per_second)))
    return jobs


def curve_text(job: Job) -> str:
    return ", ".join(f"{n}:{r:g}" for n, r in zip(job.curve.nodes, job.curve.samples_per_second))


def replay_prediction(sl: Slice, jobs: list[Job], folder: Path) -> dict:
    """core.replay on the compressed slice, with the same jobs all there at the start, curves given."""
    trace, node_list, jobset = folder / "slice.csv", folder / "slice-nodes.txt", folder / "jobs.csv"
    with trace.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["time", "node", "state"])
        for t, node, st in sl.lines:
            w.writerow([datetime_text(t), node, st])
    node_list.write_text("\n".join(sl.names) + "\n")
    with jobset.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["job", "model", "submit_time", "min_nodes", "max_nodes", "total_samples",
                    "scale_up_seconds", "scale_down_seconds", "nodes", "samples_per_second"])
        for j in jobs:
            w.writerow([j.id, j.name or j.id, iso(sl.start), j.min_nodes, j.max_nodes, j.total_samples,
                        j.scale_up_seconds, j.scale_down_seconds, ";".join(map(str, j.curve.nodes)),
                        ";".join(f"{r:g}" for r in j.curve.samples_per_second)])
    settings = ReplaySettings(trace=trace, jobs=jobset, node_list=node_list, start=iso(sl.start),
                              hours=sl.window_s / 3600.0, config=ControllerConfig(), curves="given",
                              gpus_per_node=1)
    return Replay(settings).run()


def datetime_text(t: float) -> str:
    whole = int(t)
    return f"{iso(whole)[:-1]}.{int(round((t - whole) * 1e6)):06d}Z"


@dataclass
class IdlePeriod:
    """One idle period of a node in the slice: opened by a main job's end (`after`) or by the
    window's start (None), closed by the node's next main job (`until`) or the window's end."""
    node: str
    after: Optional[int]
    until: Optional[int]
    trace_s: float         # its length in the trace (uncompressed seconds)


def idle_periods(sl: Slice) -> list[IdlePeriod]:
    """Every idle period of the slice; their lengths add up to its idle node-seconds (× K)."""
    by_node: dict[str, list[MainJob]] = {n: [] for n in sl.names}
    for j in sl.jobs:
        by_node[j.node].append(j)
    out: list[IdlePeriod] = []
    for node, jobs in by_node.items():
        jobs.sort(key=lambda j: j.at)
        first = jobs[0].at if jobs else sl.window_s
        if first > 1e-6:
            out.append(IdlePeriod(node, None, jobs[0].idx if jobs else None, first * sl.compress))
        for j, nxt in zip(jobs, [*jobs[1:], None]):
            gap = (nxt.at if nxt else sl.window_s) - (j.at + j.run_s)
            if gap > 1e-6:
                out.append(IdlePeriod(node, j.idx, nxt.idx if nxt else None, gap * sl.compress))
    return out
