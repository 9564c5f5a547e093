"""bench.facility's report: the figures of the two passes side by side, against core.replay's
prediction, with the lag from a node going idle to a job using it (bench/facility_lag.py), as
JSON and as a table (see bench/facility.py)."""
from __future__ import annotations

from typing import Optional

from bench.facility_lag import PeriodLag, lag_report, measure
from bench.facility_slice import IdlePeriod, Slice, idle_periods
from bench.facility_slurm import PassResult
from core.replay import percentile
from core.timeutil import iso


def delays_ms(sl: Slice, r: PassResult) -> dict[int, float]:
    return {j.idx: (r.started[j.idx][0] - (r.clock0 + j.at)) * 1000.0
            for j in sl.jobs if not j.initial and j.idx in r.started}


def slurm_delays_ms(sl: Slice, r: PassResult) -> dict[int, float]:
    """From sbatch's return to the job running: Slurm's part alone, without the submission's own
    lateness (sbatch answers slower while slurmctld and this host are busier)."""
    return {j.idx: (r.started[j.idx][0] - r.sent_at[j.idx]) * 1000.0
            for j in sl.jobs if j.idx in r.started and j.idx in r.sent_at}


def dist(values: list[float]) -> dict:
    return {k: round(percentile(values, q), 1) if values else None
            for k, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99), ("max", 1.0))}


def rounded(v: Optional[float], digits: int = 1) -> Optional[float]:
    return round(v, digits) if v is not None else None


def rpc_rate(r: PassResult, user: str = "root") -> float:
    return (r.sdiag_after["users"].get(user, 0) - r.sdiag_before["users"].get(user, 0)) / r.measured_s


def histogram_quantile(m: dict, name: str, q: float) -> Optional[float]:
    """Prometheus's histogram_quantile: linear within the bucket that holds the q-th sample."""
    buckets = sorted(((float(dict(labels)["le"]), v) for (n, labels), v in m.items()
                      if n == f"{name}_bucket"), key=lambda b: b[0])
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    lo_b, lo_n = 0.0, 0.0
    for b, n in buckets:
        if n >= rank:
            if b == float("inf"):
                return lo_b
            return lo_b + (b - lo_b) * ((rank - lo_n) / (n - lo_n) if n > lo_n else 0.0)
        lo_b, lo_n = b, n
    return lo_b


def delay_figures(sl: Slice, without: PassResult, with_: PassResult) -> dict:
    """Main-job start delays, without and with the harvester, and what it added per job."""
    d0, d1 = delays_ms(sl, without), delays_ms(sl, with_)
    both = sorted(set(d0) & set(d1))
    added = [d1[i] - d0[i] for i in both]
    s0, s1 = slurm_delays_ms(sl, without), slurm_delays_ms(sl, with_)
    added_slurm = [s1[i] - s0[i] for i in sorted(set(s0) & set(s1))]
    wrong = {w: [j.idx for j in sl.jobs if j.idx not in r.started or r.started[j.idx][1] != j.node]
             for w, r in (("without", without), ("with", with_))}
    return {
        "main_jobs_played": len(both), "main_jobs_wrong": wrong,
        "main_delay_ms": {"without": dist(list(d0.values())), "with": dist(list(d1.values()))},
        **{f"added_delay_ms_{k}": rounded(percentile(added, q)) for k, q in (("p50", 0.5), ("p95", 0.95),
                                                                             ("p99", 0.99), ("max", 1.0))},
        "slurm_delay_ms": {"without": dist(list(s0.values())), "with": dist(list(s1.values()))},
        "added_slurm_delay_ms_p50": rounded(percentile(added_slurm, 0.5)),
        "added_slurm_delay_ms_p99": rounded(percentile(added_slurm, 0.99)),
        "submit_late_ms_p99": {"without": round(percentile(without.submit_late_ms, 0.99) or 0, 1),
                               "with": round(percentile(with_.submit_late_ms, 0.99) or 0, 1)},
    }


def load_figures(without: PassResult, with_: PassResult) -> dict:
    """What the harvester cost: vacate latency, CPU, memory, slurmctld RPCs and cycle times."""
    m = with_.metrics
    vac = {q: histogram_quantile(m, "harvest_slurm_vacate_seconds", q) for q in (0.5, 0.99)}
    rpc_with, rpc_without = rpc_rate(with_), rpc_rate(without)
    types = {t: round((with_.sdiag_after["types"].get(t, 0) - without.sdiag_after["types"].get(t, 0))
                      / with_.measured_s, 2) for t in with_.sdiag_after["types"]}

    def both(section: str, key: str) -> dict:
        return {"without": without.sdiag_after[section].get(key), "with": with_.sdiag_after[section].get(key)}

    return {
        "vacate_ms_p50": rounded(vac[0.5] * 1000 if vac[0.5] is not None else None),
        "vacate_ms_p99": rounded(vac[0.99] * 1000 if vac[0.99] is not None else None),
        "vacates": int(m.get(("harvest_slurm_vacate_seconds_count", ()), 0)),
        "harvester_cpu_pct": round(100.0 * with_.cpu_s / with_.measured_s, 2),
        "harvester_rss_mb": round(with_.rss_mb, 1),
        "harvester_rpc_per_s": round(rpc_with - rpc_without, 2),
        "root_rpc_per_s": {"without": round(rpc_without, 2), "with": round(rpc_with, 2)},
        "rpc_per_s_by_type_added": {t: v for t, v in sorted(types.items(), key=lambda kv: -kv[1]) if v > 0.01},
        "sched_mean_cycle_us": both("main", "Mean cycle"), "sched_max_cycle_us": both("main", "Max cycle"),
        "backfill_mean_cycle_us": both("backfill", "Mean cycle"),
        "pilots": {o: int(m.get(("harvest_slurm_pilots_total", (("outcome", o),)), 0))
                   for o in ("submitted", "cancelled", "preempted", "lost")},
        "hub_connections_peak": int(m.get(("harvest_slurm_hub_connections_peak", ()), 0)),
        "pilots_left": with_.pilots_left + without.pilots_left,
    }


def period_lags(sl: Slice, with_: PassResult) -> tuple[list[IdlePeriod], list[PeriodLag]]:
    """The slice's idle periods and the lags measured for them in the pass with the harvester."""
    periods = idle_periods(sl)
    return periods, measure(periods, with_.started, with_.ended, with_.joins, with_.uses,
                            with_.clock0 + with_.measured_s)


def report(sl: Slice, version: str, without: PassResult, with_: PassResult, replay: dict) -> dict:
    harvest = with_.used_node_s / sl.idle_node_s if sl.idle_node_s else 0.0
    held = with_.held_node_s / sl.idle_node_s if sl.idle_node_s else 0.0
    replay_share = replay["harvest_pct"] / 100.0
    vs_replay = round(harvest / replay_share, 4) if replay_share else None
    periods, lags = period_lags(sl, with_)
    return {
        "nodes": len(sl.names), "slurm": version, "start": iso(sl.start), "hours": round((sl.end - sl.start) / 3600, 3),
        "compress": sl.compress, "window_s": round(sl.window_s, 1), "main_jobs": len(sl.jobs),
        "main_jobs_clocked": sum(not j.initial for j in sl.jobs),
        **delay_figures(sl, without, with_),
        "idle_node_s": round(sl.idle_node_s, 1),
        "held_share": round(held, 4), "harvest_share": round(harvest, 4), "replay_share": round(replay_share, 4),
        "harvest_vs_replay": vs_replay,
        **lag_report(periods, lags, sl.compress),
        "cold_start_s": rounded(with_.cold_start_s),
        **load_figures(without, with_),
        "replay": {k: replay[k] for k in ("idle_node_hours", "used_node_hours", "harvest_pct", "rescales")},
    }


def print_table(r: dict) -> None:
    dw, d1 = r["main_delay_ms"]["without"], r["main_delay_ms"]["with"]
    print(f"# facility slice: {r['nodes']} nodes of Summit from {r['start']} for {r['hours']} h at x{r['compress']:g} "
          f"({r['window_s']:.0f} s), Slurm {r['slurm']}; {r['main_jobs']} main jobs, {r['main_jobs_played']} "
          f"submitted while the clock ran")
    print(f"{'main-job start delay (ms)':<46} {'p50':>8} {'p95':>8} {'p99':>8} {'max':>8}")
    for label, d in (("  without the harvester", dw), ("  with the harvester", d1)):
        print(f"{label:<46} " + " ".join(f"{d[k] if d[k] is not None else '-':>8}" for k in ("p50", "p95", "p99", "max")))
    print(f"{'  added per job':<46} {r['added_delay_ms_p50']:>8} {r['added_delay_ms_p95']:>8} "
          f"{r['added_delay_ms_p99']:>8} {r['added_delay_ms_max']:>8}   goal p50 <= 500, p99 <= 1000")
    sw, s1 = r["slurm_delay_ms"]["without"], r["slurm_delay_ms"]["with"]
    print(f"{'sbatch returned -> running (ms): without':<46} " + " ".join(f"{sw[k]:>8}" for k in ("p50", "p95", "p99", "max")))
    print(f"{'  with':<46} " + " ".join(f"{s1[k]:>8}" for k in ("p50", "p95", "p99", "max")))
    print(f"{'  added per job (p50, p99)':<46} {r['added_slurm_delay_ms_p50']:>8} {'':>8} {r['added_slurm_delay_ms_p99']:>8}")
    print(f"{'submission late, p99 (ms): without, with':<46} {r['submit_late_ms_p99']['without']:>8} "
          f"{r['submit_late_ms_p99']['with']:>8}")
    print(f"{'idle node-seconds held by pilots':<46} {100 * r['held_share']:>7.1f}%")
    print(f"{'idle node-seconds used by jobs':<46} {100 * r['harvest_share']:>7.1f}%   replay predicts "
          f"{100 * r['replay_share']:.1f}% -> {100 * (r['harvest_vs_replay'] or 0):.0f}% of it (goal >= 90%)")
    print_lag(r)
    print(f"{'vacate: signal -> pilot gone (ms)':<46} p50 {r['vacate_ms_p50']}, p99 {r['vacate_ms_p99']} "
          f"({r['vacates']} vacates)")
    print(f"{'harvester CPU (% of one core), peak RSS':<46} {r['harvester_cpu_pct']:>7}%  {r['harvester_rss_mb']} MB"
          f"   goal <= 10%")
    print(f"{'slurmctld RPCs/s caused by the harvester':<46} {r['harvester_rpc_per_s']:>8}   goal <= 5 "
          f"(root: {r['root_rpc_per_s']['without']} without, {r['root_rpc_per_s']['with']} with)")
    print(f"{'  by type':<46} {r['rpc_per_s_by_type_added']}")
    print(f"{'scheduler mean / max cycle (us)':<46} without {r['sched_mean_cycle_us']['without']} / "
          f"{r['sched_max_cycle_us']['without']}, with {r['sched_mean_cycle_us']['with']} / "
          f"{r['sched_max_cycle_us']['with']}")
    print(f"{'pilots':<46} {r['pilots']}, hub connections at peak {r['hub_connections_peak']}")
    print(f"{'cold start (pilots on every idle node, used)':<46} {r['cold_start_s']} s")



def print_lag(r: dict) -> None:
    """The lag rows: real seconds, and the harvest they imply at x1 and x2."""
    p = r["idle_periods"]
    print(f"{'node idle -> pilot holds it (real s)':<46} p50 {r['idle_to_held_s_p50']}, p99 {r['idle_to_held_s_p99']} "
          f"({p['held']} of {p['opened']} periods opened by a main job's end)")
    print(f"{'node idle -> a job uses it (real s)':<46} p50 {r['idle_to_used_s_p50']}, p99 {r['idle_to_used_s_p99']} "
          f"({p['used']} of {p['played']} played periods)")
    at_k = f", x{r['compress']:g} {r['harvest_modelled']}" if r["compress"] not in (1.0, 2.0) else ""
    print(f"{'harvest the lag leaves, against the replay':<46} x1 {r['harvest_projected_x1']}, "
          f"x2 {r['harvest_projected_x2']}{at_k} (measured x{r['compress']:g}: {r['harvest_vs_replay']})")
