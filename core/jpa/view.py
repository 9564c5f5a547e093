"""What the dashboard and the API read of a job: its measured points, the fit with its band,
cap, probes and learned costs, and one word for how much of its curve rests on measurements."""
from __future__ import annotations

import math
from typing import Iterable, Mapping

import numpy as np

from ..scaling import Fit
from .profile import Profile

BAND_Z = 2.0                          # the band shown: +-2 sd of log throughput (~95 %)


def spread(f: Fit, max_nodes: int) -> float:
    """Mean sd of log throughput over the sizes the job may run at: how unsure its curve is."""
    top = min(max(1, max_nodes), len(f.sd_log) - 1)
    return float(np.mean(f.sd_log[1:top + 1]))


def confidence(sizes: int, spread: float, given: bool) -> str:
    """A word for the jobs table: how much of the curve in use rests on measurements."""
    if sizes == 0:
        return "given" if given else "prior"
    if sizes < 3 or spread > 0.25:
        return "low"
    if spread > 0.10:
        return "medium"
    return "high"


def cached_confidence(p: Profile) -> str:
    """`confidence` from the fit last made (none is made here), cheap enough for every row."""
    s = spread(p.fit_cache[1], p.max_nodes) if p.fit_cache is not None else 1.0
    return confidence(len(p.sums), s, p.given is not None)


def is_probing(p: Profile) -> bool:
    """The job runs at a size it has no sample at yet."""
    return p.size > 0 and p.size not in p.sums


def probing(profiles: Mapping[str, Profile], active: Iterable[str]) -> set[str]:
    return {jid for jid in active if is_probing(profiles[jid])}


def profile_view(p: Profile, f: Fit, cap: int, up_seconds: float, down_seconds: float,
                 noise_floor: float) -> dict:
    """Measured points, the fit `f` with its band, the cap, probes and learned costs of one job."""
    ns = list(range(1, min(max(p.max_nodes, 1), len(f.mean) - 1) + 1))
    counts = {n: int(acc[3]) for n, acc in p.sums.items()}
    s = spread(f, p.max_nodes)
    return {
        "measured": [{"nodes": n, "samples_per_second": math.exp(st.mean_log), "weight": st.weight,
                      "count": counts[n],
                      "sd_pct": 100.0 * math.sqrt(st.var_log) if counts[n] >= 2 else None}
                     for n, st in sorted(p.stats().items())],
        "fit": {"nodes": ns, "mean": [float(f.mean[n]) for n in ns],
                "lo": [f.band(n, BAND_Z)[0] for n in ns], "hi": [f.band(n, BAND_Z)[1] for n in ns],
                "band_sd": BAND_Z, "model": f.model, "lam": f.lam, "sigma": f.sigma, "kappa": f.kappa,
                "peak": int(np.argmax(f.mean[1:ns[-1] + 1]) + 1), "noise_pct": 100.0 * p.noise(noise_floor)},
        "cap": cap, "given": p.given.to_dict() if p.given else None,
        "probe": p.probe,
        "probes": [{"time": t, "nodes": n, "why": w, "kind": k} for t, n, w, k in p.probes[-50:]],
        "scale_up_seconds": up_seconds, "scale_down_seconds": down_seconds,
        "pauses": {k: len(v) for k, v in p.pauses.items()},
        "confidence": confidence(len(p.sums), s, p.given is not None),
        "uncertainty_pct": 100.0 * (math.exp(s) - 1.0),
        "size": p.size, "probing": is_probing(p),
    }
