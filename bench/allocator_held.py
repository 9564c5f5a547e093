"""A live controller's decision with thousands of held nodes (`python -m bench.allocator --held N`).

bench.scale measured a controller step at 10,624 nodes slower than the allocator alone (issue
59): there a few jobs that could take the whole machine hold every idle node, and each size
they may take is a candidate. This builds that state in process, SIMULATED (the simulated
dispatcher, events made up here, no Slurm, no pilots): a controller (core.controller, tfwd
auto) on N idle nodes of a Summit-named machine, the nodes joining in cohorts of 1-64 as batch
jobs end, `jobs` jobs with bench.scale's linear curve up to the whole machine, which take them
all; then `steps` decisions 5 s apart, each with 1-8 held nodes taken back and the last
decision's returned. It times each step (the controller's whole work) and its solve_ms (build,
solve and mapping: what the store's solver_runs record).
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np

from core.clock import SimClock
from core.controller import Controller
from core.controller_config import ControllerConfig
from core.dispatchers.simulated import SimulatedDispatcher
from core.model import Curve, Event, EventKind, Job

T0 = 1_800_000_000.0
WARM_STEPS = 3


@dataclass
class HeldResult:
    nodes: int
    jobs: int
    held: int
    steps: int
    step_ms: list[float]
    solve_ms: list[float]

    def row(self) -> dict:
        return {"nodes": self.nodes, "jobs": self.jobs, "held": self.held, "steps": self.steps,
                "step_p50_ms": pct(self.step_ms, 50), "step_p99_ms": pct(self.step_ms, 99),
                "solve_p50_ms": pct(self.solve_ms, 50), "solve_p99_ms": pct(self.solve_ms, 99)}


def pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 2)


def held_controller(names: list[str], jobs: int, seed: int) -> tuple[Controller, SimClock, random.Random]:
    """A controller whose `jobs` big jobs hold every one of `names`, joined in cohorts."""
    rng = random.Random(seed)
    clock = SimClock(T0)
    ctl = Controller(SimulatedDispatcher(), clock, ControllerConfig(tfwd="auto"), None, names)
    ctl.start([])
    order = names[:]
    rng.shuffle(order)
    k = 0
    while k < len(order):
        clock.advance_to(clock.now() + 1.0)
        n = rng.randint(1, 64)
        ctl.step([Event(clock.now(), EventKind.NODE_JOIN, node=x) for x in order[k:k + n]])
        k += n
    top = len(names)
    curve = Curve((1, top), (10_000.0, 9_000.0 * top))      # bench.scale's jobs: 9,000 samples/s a node
    for j in range(jobs):
        ctl.submit(Job(f"big{j}", 1, top, 1e15, curve, 1.78, 1.13, submit_time=clock.now(), true_curve=curve))
    clock.advance_to(clock.now() + 1.0)
    ctl.step()
    return ctl, clock, rng


def run_held(names: list[str], jobs: int = 3, steps: int = 40, seed: int = 59) -> HeldResult:
    """Time `steps` steps of a controller whose big jobs hold all of `names` (machine order)."""
    ctl, clock, rng = held_controller(names, jobs, seed)
    held = len(ctl.owner)
    step_ms: list[float] = []
    solve_ms: list[float] = []
    back: list[str] = []
    for s in range(WARM_STEPS + steps):
        clock.advance_to(clock.now() + 5.0)
        gone = rng.sample(sorted(ctl.owner), rng.randint(1, 8))
        events = [Event(clock.now(), EventKind.NODE_LEAVE, node=x) for x in gone]
        events += [Event(clock.now(), EventKind.NODE_JOIN, node=x) for x in back]
        back = gone
        t0 = time.perf_counter()
        result = ctl.step(events)
        ms = (time.perf_counter() - t0) * 1000.0
        if s >= WARM_STEPS and result is not None:
            step_ms.append(ms)
            solve_ms.append(result.solve_ms)
    return HeldResult(len(names), jobs, held, len(step_ms), step_ms, solve_ms)


def held_table(r: dict) -> str:
    return (f"live-like step: {r['jobs']} jobs holding {r['held']:,} of {r['nodes']:,} idle nodes, "
            f"{r['steps']} steps of 1-8 leaves (SIMULATED dispatcher and events)\n"
            f"  step   p50 {r['step_p50_ms']:.2f} ms  p99 {r['step_p99_ms']:.2f} ms\n"
            f"  solve  p50 {r['solve_p50_ms']:.2f} ms  p99 {r['solve_p99_ms']:.2f} ms")
