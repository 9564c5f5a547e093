"""The capacity DP at thousands of nodes (issue 59): a row by linear runs (core.policies.maxplus)
is the direct max-plus sum, the optimum with jobs that may take the whole machine is the brute
force's, and the work (here: memory, not time) grows with the node count, not with its square."""
from __future__ import annotations

import math
import random
import tracemalloc

import numpy as np
import pytest

from bench.allocator import summit_names
from bench.allocator_held import run_held
from core.allocator import allocate
from core.model import Curve
from core.objective import Cap, JobRequest, Problem, tables_for, value_table
from core.policies.maxplus import DIRECT_CELLS, linear_runs, maxplus_row, row_by_runs, row_direct
from core.policies.milp import dp_sizes

REL = 1e-9


def piecewise(rng: random.Random, m: int, rising: bool = False) -> np.ndarray:
    """A table linear between a few knots, with jumps, maybe -inf from 1 to a minimum;
    `rising`: every slope positive, as values that grow with the nodes (the DP keeps them all)."""
    v = np.zeros(m + 1)
    knots = sorted({0, m, *(rng.randint(0, m) for _ in range(rng.randint(0, 6)))})
    level = rng.uniform(-100, 100)
    for a, b in zip(knots[:-1], knots[1:]):
        slope = rng.uniform(1, 50) if rising else rng.choice([0.0, rng.uniform(-50, 50)])
        v[a:b + 1] = level + slope * np.arange(b - a + 1)
        if rng.random() < 0.3:
            v[b] += rng.uniform(-30, 30)
        level = v[b]
    if m > 2 and rng.random() < 0.5:
        v[1:rng.randint(1, m)] = -math.inf
    return v


@pytest.mark.parametrize("seed", range(40))
def test_a_row_by_linear_runs_is_the_direct_sum(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(20):
        m, rows = rng.randint(0, 400), rng.randint(1, 400)
        v = piecewise(rng, m)
        ext = np.array([rng.uniform(-1e3, 1e3) for _ in range(rows + m)])
        if rng.random() < 0.5:
            ext = np.maximum.accumulate(ext)      # as the DP's rows: best with at most c nodes
        if rng.random() < 0.3:
            ext[:rng.randint(0, rows + m)] = -math.inf     # capacities below zero
        runs = linear_runs(v)
        assert runs is not None and len(runs) <= 8 * 3
        got, want = row_by_runs(ext, v, runs), row_direct(ext, v)
        assert (np.isfinite(got) == np.isfinite(want)).all()
        ok = np.isfinite(want)
        assert np.allclose(got[ok], want[ok], rtol=1e-12, atol=1e-9)


def test_a_table_that_bends_slowly_is_summed_directly() -> None:
    """Second differences under the tolerance that add up to more: no runs, the direct sum."""
    n = np.arange(1001, dtype=float)
    v = n + 4e-9 * n * n
    assert linear_runs(v) is None
    ext = np.maximum.accumulate(np.random.default_rng(1).uniform(0, 1e3, 1500 + 1000))
    assert np.array_equal(maxplus_row(ext, v), row_direct(ext, v))


def brute(tables: list[np.ndarray], capacity: int) -> float:
    """max sum t_j[n_j] with sum n_j <= capacity, for 2 or 3 jobs, by plain enumeration."""
    best = np.full(capacity + 1, -math.inf)       # the last jobs on exactly k nodes
    last = tables[-1][:capacity + 1]
    if len(tables) == 3:
        for n, x in enumerate(tables[1][:capacity + 1]):
            seg = x + last[:capacity + 1 - n]
            best[n:n + len(seg)] = np.maximum(best[n:n + len(seg)], seg)
    else:
        best[:len(last)] = last
    best = np.maximum.accumulate(best)
    first = tables[0][:capacity + 1]
    return float(np.max(first + best[capacity - np.arange(len(first))]))


@pytest.mark.parametrize("seed", range(30))
def test_the_dp_on_long_piecewise_tables_finds_the_brute_force_optimum(seed: int) -> None:
    rng = random.Random(seed)
    tables = []
    for _ in range(rng.choice((2, 3))):
        t = piecewise(rng, rng.randint(300, 900), rising=True)
        t[0] = 0.0 if rng.random() < 0.8 else t[0]
        tables.append(t)
    capacity = rng.randint(200, sum(len(t) - 1 for t in tables) - 100)
    current = [rng.randint(0, len(t) - 1) for t in tables]
    sizes = dp_sizes(tables, capacity, current)
    got, want = sum(t[n] for t, n in zip(tables, sizes)), brute(tables, capacity)
    assert sum(sizes) <= capacity and abs(got - want) <= REL * max(1.0, abs(want)), (got, want)


CURVES = (Curve((1, 4000), (10_000.0, 36_000_000.0)),                    # bench.scale's, linear
          Curve((1, 8, 64, 512, 2000), (100.0, 790.0, 6000.0, 40000.0, 61000.0)),
          Curve((4, 300, 900), (400.0, 25_000.0, 26_000.0)))               # flat past 900


def big_problem(seed: int, nodes: int = 1200, jobs_: int = 0) -> Problem:
    """2 or 3 jobs (`jobs_` where given) that may take twice the machine, some holding nodes."""
    rng = random.Random(seed)
    names = [f"x{i:05d}" for i in range(nodes)]
    pool = names[:]
    rng.shuffle(pool)
    jobs = []
    for k in range(jobs_ or rng.choice((2, 3))):
        curve = rng.choice(CURVES)
        take = rng.randint(0, nodes // 3)
        cur, pool = pool[:take], pool[take:]
        jobs.append(JobRequest(f"J{k}", curve.nodes[0], nodes * 2, curve, rng.uniform(0, 30), rng.uniform(0, 20),
                               tuple(cur), rng.choice((1.0, 2.5)), horizon=rng.choice((None, 300.0)),
                               paused_s=rng.choice((0.0, 5.0))))
    return Problem(names, jobs, rng.choice((10.0, 600.0)), rng.choice(("throughput", "priority")))


@pytest.mark.parametrize("seed", range(30))
def test_jobs_that_may_take_the_machine_get_the_brute_force_optimum(seed: int) -> None:
    p = big_problem(seed)
    tables = tables_for(p)
    assert any(len(t) * p.capacity > DIRECT_CELLS and linear_runs(t) for t in tables), "the runs path is exercised"
    plan = allocate(p)
    want = brute(tables, p.capacity)
    assert abs(plan.objective - want) <= REL * max(1.0, abs(want)), (plan.objective, want)
    assert sum(plan.sizes.values()) <= p.capacity


def scale_problem(n: int) -> Problem:
    """bench.scale's state: three jobs that may take all n nodes hold nearly all of them."""
    curve = Curve((1, n), (10_000.0, 9_000.0 * n))
    names = [f"x{i:05d}" for i in range(n)]
    jobs = [JobRequest(f"J{k}", 1, n, curve, 1.78, 1.13, tuple(names[k * n // 3:(k + 1) * n // 3 - 5]),
                       horizon=300.0) for k in range(3)]
    return Problem(names, jobs)


def test_a_table_has_as_many_runs_at_10624_nodes_as_at_100() -> None:
    """What a row costs is its runs: from the curve's points and the current size, not the nodes."""
    for n in (100, 10_624):
        p = scale_problem(n)
        for job in p.jobs:
            assert len(linear_runs(value_table(job, 300.0, n, amortised=True))) <= len(job.curve.nodes) + 4


def dp_peak(n: int) -> int:
    p = scale_problem(n)
    tables = tables_for(p)
    tracemalloc.start()
    try:
        dp_sizes(tables, p.capacity, [j.current for j in p.jobs])
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_dp_memory_grows_with_the_nodes_not_their_square() -> None:
    """Rows x sizes at 16,000 nodes would be 2 GB (64 MB a block summed directly): the runs need
    a few arrays of the row's length, twice as much for twice the nodes."""
    small, big = dp_peak(8_000), dp_peak(16_000)
    assert big < 16 * 2 ** 20, big
    assert big < 2.5 * small, (small, big)


@pytest.mark.parametrize("seed", range(10))
def test_a_cap_over_jobs_that_may_take_the_machine_keeps_the_optimum(seed: int) -> None:
    """An owner's cap over two big jobs merges their tables by the same rows (core.policies.caps)."""
    rng = random.Random(seed)
    p = big_problem(seed, 900, 3)
    limit = rng.randint(50, 700)
    p.caps = (Cap(limit, (p.jobs[0].id, p.jobs[1].id), "alice"),)
    t0, t1, t2 = tables_for(p)
    pair = np.full(limit + 1, -math.inf)      # the two capped jobs on exactly k <= limit nodes
    for n, x in enumerate(t0[:limit + 1]):
        seg = x + t1[:limit + 1 - n]
        pair[n:n + len(seg)] = np.maximum(pair[n:n + len(seg)], seg)
    want = brute([pair, t2], p.capacity)
    plan = allocate(p)
    assert plan.sizes["J0"] + plan.sizes["J1"] <= limit
    assert abs(plan.objective - want) <= REL * max(1.0, abs(want)), (plan.objective, want)


def test_the_held_bench_times_steps_with_every_node_held() -> None:
    """`python -m bench.allocator --held N` at a small N: every node held, every step timed."""
    r = run_held(summit_names(300), jobs=2, steps=3).row()
    assert (r["nodes"], r["held"], r["steps"]) == (300, 300, 3)
    assert 0 < r["solve_p50_ms"] <= r["solve_p99_ms"] and r["step_p50_ms"] > 0
