"""bench.scale's result (one JSON object) and its table: what the run measured, next to the
acceptance goals of the issue (figures are printed against them, never asserted)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from . import scale_measure as measure

if TYPE_CHECKING:
    from .scale import Run, World

#: the issue's acceptance on a 2-core host (10,624 nodes; CPU at Summit's trace x1)
GOALS = {"pilots_peak": 10_000, "rss_mb": 2048.0, "cpu_share": 0.10, "hello_to_alloc_ms_p99": 1000.0,
         "leave_to_shrunk_ms_p99": 1000.0, "alloc_ms_p99": 100.0, "burst_alloc_s": 5.0}


def _r(v: Optional[float], digits: int = 1) -> Optional[float]:
    return round(v, digits) if v is not None else None


def report(run: "Run", world: "World", db: Path) -> dict:
    from .scale import SIMULATED
    args, m = run.args, run.metrics
    window_s = max(1e-9, run.wall1 - run.wall0)
    records = list(world.fleet.records)
    ch = measure.read_changes(db)
    hello, never = measure.hello_to_alloc_ms([r for r in records if (r.hello_at or 0) >= run.wall0], ch)
    hello_cold, never_cold = measure.hello_to_alloc_ms([r for r in records if (r.hello_at or 0) < run.wall0], ch)
    leave = measure.leave_to_shrunk_ms(records, ch)
    solves = measure.solve_ms(db)
    solves_replay = measure.solve_ms(db, run.wall0)
    burst = (measure.burst_alloc_s(run.burst_nodes, run.burst_last_hello, ch)
             if run.burst_nodes and run.burst_last_hello is not None else None)
    events = measure.event_count(db, run.wall0, run.wall1)
    cpu0, cpu1 = run.cpu0, run.cpu1
    assert cpu0 is not None and cpu1 is not None
    own = (cpu1.own_s - cpu0.own_s) / window_s
    children = (cpu1.children_s - cpu0.children_s) / window_s
    grown = run.rss_burst_mb - run.rss_before_mb
    hours = window_s / 3600.0
    feed = world.feed.stats
    return {
        "simulated": SIMULATED,
        "nodes": len(run.machine.names), "hours": args.hours, "compress": args.compress,
        "window_s": round(window_s, 1), "tile_shift_days": run.machine.shifts_days,
        "idle_at_start": run.machine.idle_at_start, "trace_changes": len(run.machine.changes),
        "nofile": run.nofile, "startup_s": run.startup_s, "cold_start": run.cold,
        "pilots_peak": {"fleet": world.fleet.peak,
                        "hub": int(measure.metric(m, "harvest_slurm_hub_connections_peak"))},
        "pilots_at_end": {"fleet": run.connected_end, "hub": int(measure.metric(m, "harvest_slurm_hub_connections"))},
        "rss_mb": {"peak": _r(run.mem_end.get("VmHWM")), "end": _r(run.mem_end.get("VmRSS")),
                   "before_pilots": _r(run.rss_before_mb), "after_burst": _r(run.rss_burst_mb)},
        "threads_end": int(run.mem_end.get("Threads", 0)),
        "cpu_share": {"harvester": round(own, 4), "with_commands": round(own + children, 4),
                      "fleet_and_feed": round(run.fleet_cpu_s / window_s, 4)},
        "kb_per_pilot": round(grown * 1024.0 / run.connected_burst, 1) if run.connected_burst else None,
        "hello_to_alloc_ms_p50": _r(measure.percentile(hello, 0.5)) if hello else None,
        "hello_to_alloc_ms_p99": _r(measure.percentile(hello, 0.99)) if hello else None,
        "hello_to_alloc_ms": measure.dist(hello), "hellos_never_allocated": never,
        "hello_to_alloc_ms_cold": measure.dist(hello_cold), "hellos_never_allocated_cold": never_cold,
        "leave_to_shrunk_ms_p50": _r(measure.percentile(leave, 0.5)) if leave else None,
        "leave_to_shrunk_ms_p99": _r(measure.percentile(leave, 0.99)) if leave else None,
        "leave_to_shrunk_ms": measure.dist(leave),
        "alloc_ms_p99": _r(measure.percentile(solves, 0.99), 2) if solves else None,
        "alloc_ms": measure.dist(solves, 2), "alloc_ms_replay": measure.dist(solves_replay, 2),
        "burst_nodes": len(run.burst_nodes), "burst_alloc_s": _r(burst, 3),
        "events_per_s": round(sum(events.values()) / window_s, 2), "events_by_kind": events,
        "trace_changes_per_s": round(len(run.machine.changes) / window_s, 2),
        "store_mb_per_hour": round((run.store1 - run.store0) / 1e6 / hours, 2),
        "store_mb_per_trace_hour": round((run.store1 - run.store0) / 1e6 / args.hours, 2),
        "store_mb_end": round(run.store1 / 1e6, 2),
        "grid": {"full": measure.grid_summary(run.grid_full), "update": measure.grid_summary(run.grid_updates)},
        "slurm_calls_per_s": {c: round((n - run.calls0.get(c, 0)) / window_s, 2) for c, n in sorted(run.calls1.items())},
        "slurm_calls": dict(feed.calls), "feed_ms_per_call": {c: round(1000 * feed.serve_s[c] / n, 2)
                                                              for c, n in feed.calls.items() if n},
        "pilots": {"started": feed.started, "preempted": feed.preempted, "cancelled": feed.cancelled,
                   "submitted": int(measure.metric(m, "harvest_slurm_pilots_total", outcome="submitted")),
                   "ended": _endings(records)},
        "samples": run.samples[::max(1, len(run.samples) // 60)],
    }


def _endings(records) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        how = r.how.split(":")[0] if r.how else "running"
        out[how] = out.get(how, 0) + 1
    return out


def _goal(value, goal, lower_is_better: bool = True) -> str:
    if value is None:
        return "(no data)"
    ok = value <= goal if lower_is_better else value >= goal
    return f"goal {'<=' if lower_is_better else '>='} {goal:g}: {'met' if ok else 'NOT met'}"


def print_table(r: dict) -> None:
    print(f"# bench.scale: {r['nodes']} nodes from {r['start']}, {r['hours']:g} h of trace at x{r['compress']:g} "
          f"({r['window_s']:.0f} s), {r['idle_at_start']} idle at the start, {r['trace_changes']} trace changes")
    print(f"# {r['simulated']}")
    row = "{:<44} {}"
    pk = r["pilots_peak"]
    print(row.format("pilots connected at peak (fleet, hub)", f"{pk['fleet']}, {pk['hub']}   "
                     f"({_goal(pk['hub'], GOALS['pilots_peak'], False)} at 10,624 nodes)"))
    rss = r["rss_mb"]
    print(row.format("harvester RSS MB (peak, end, before pilots)",
                     f"{rss['peak']}, {rss['end']}, {rss['before_pilots']}   {_goal(rss['peak'], GOALS['rss_mb'])}"))
    print(row.format("harvester threads at the end", r["threads_end"]))
    print(row.format("KB per pilot (RSS growth / pilots)", r["kb_per_pilot"]))
    c = r["cpu_share"]
    print(row.format("CPU share of a core (harvester, +commands)", f"{c['harvester']:.3f}, {c['with_commands']:.3f}   "
                     f"{_goal(c['with_commands'], GOALS['cpu_share'])} at x1 (this run x{r['compress']:g}); "
                     f"fleet+feed {c['fleet_and_feed']:.3f}"))
    for key in ("hello_to_alloc_ms", "leave_to_shrunk_ms", "alloc_ms"):
        d = r[key]
        label = "hello_to_alloc (replay) ms" if key == "hello_to_alloc_ms" else f"{key.replace('_ms', '')} ms"
        print(row.format(f"{label} (p50, p99, max; n)",
                         f"{d['p50']}, {d['p99']}, {d['max']}; {d['n']}   {_goal(d['p99'], GOALS[key + '_p99'])}"))
    d = r["hello_to_alloc_ms_cold"]
    print(row.format("  the cold start's pilots (p50, p99, max; n)", f"{d['p50']}, {d['p99']}, {d['max']}; {d['n']}   "
                     "(joins held until the burst is in: see burst)"))
    print(row.format("pilots that said hello, never allocated", f"{r['hellos_never_allocated']} "
                     f"(cold start {r['hellos_never_allocated_cold']})"))
    cs = r["cold_start"]
    print(row.format("cold start: pilots, nodes used, target, s", f"{cs['connected']}, {cs['used']}, {cs['target']}, {cs['s']}"))
    print(row.format("burst: nodes, last hello -> all allocated s",
                     f"{r['burst_nodes']}, {r['burst_alloc_s']}   {_goal(r['burst_alloc_s'], GOALS['burst_alloc_s'])}"))
    print(row.format("events/s sustained (store), trace changes/s", f"{r['events_per_s']}, {r['trace_changes_per_s']}"))
    print(row.format("store MB per hour (wall, trace), at end", f"{r['store_mb_per_hour']}, "
                     f"{r['store_mb_per_trace_hour']}, {r['store_mb_end']}"))
    g = r["grid"]
    print(row.format("grid full figure: ms p50, KB (sent)", f"{g['full']['ms_p50']}, {g['full']['kb_p50']} "
                     f"({g['full']['kb_sent_p50']})"))
    print(row.format("grid update (diff): ms p50, max, KB (sent)", f"{g['update']['ms_p50']}, {g['update']['ms_max']}, "
                     f"{g['update']['kb_p50']} ({g['update']['kb_sent_p50']})"))
    print(row.format("Slurm calls per second", r["slurm_calls_per_s"]))
    print(row.format("pilots", r["pilots"]))
