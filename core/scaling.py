"""Scalability models and their fit to throughput samples, with an uncertainty.

The Universal Scalability Law (Gunther)

    X(n) = lam * n / (1 + sigma * (n - 1) + kappa * n * (n - 1))

with contention sigma and coherency kappa; Amdahl's law is the special case kappa = 0. Fitted
to the shipped Summit job sets, USL is the closer of the two (see `python -m core.scaling`
and the README), and it is the only one of the two that can say a job slows down past a size.

The fit is Bayesian on a fixed grid of (sigma, kappa) with lam profiled in closed form: for a
given shape, log X(n) = log lam + log g(n) is linear in log lam, so the best log lam is a
weighted mean and the misfit a weighted sum of squares. The grid posterior then gives a mean
curve and a band at every size for the price of a few numpy operations (~0.1 ms), robust to
one sample or many, with no optimiser that could fail to converge.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Optional, Sequence

import numpy as np

MODELS = ("usl", "amdahl")


def usl(n: "np.ndarray | float", lam: float, sigma: float, kappa: float = 0.0) -> "np.ndarray | float":
    """Throughput at n nodes under the Universal Scalability Law (kappa = 0: Amdahl)."""
    n = np.asarray(n, dtype=float)
    return lam * n / (1.0 + sigma * (n - 1.0) + kappa * n * (n - 1.0))


@dataclass(frozen=True)
class Grid:
    """The shapes a fit chooses among, with log g(n) tabulated for n = 0..nmax."""

    sigma: np.ndarray        # per grid point
    kappa: np.ndarray        # per grid point
    log_prior: np.ndarray    # per grid point (normalised)
    log_g: np.ndarray        # [points, nmax + 1]; column 0 unused (-inf)

    @property
    def nmax(self) -> int:
        return self.log_g.shape[1] - 1


@lru_cache(maxsize=8)
def grid(model: str = "usl", nmax: int = 64) -> Grid:
    """Log-spaced shapes from near-perfect scaling to a job that is fastest on one node and
    slows to a fraction of that as nodes are added (a small model on an oversubscribed host).

    The prior is flat over the grid (log-uniform in sigma and kappa, with some mass on exactly
    zero), i.e. it does not presume that a job scales well or badly."""
    if model not in MODELS:
        raise ValueError(f"unknown scalability model {model!r}; choose one of {', '.join(MODELS)}")
    sig = np.concatenate([[0.0], np.geomspace(1e-4, 4.0, 61)])
    kap = np.concatenate([[0.0], np.geomspace(1e-6, 1.0, 61)]) if model == "usl" else np.zeros(1)
    S, K = np.meshgrid(sig, kap, indexing="ij")
    S, K = S.ravel(), K.ravel()
    n = np.arange(nmax + 1, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_g = np.log(n)[None, :] - np.log1p(S[:, None] * (n - 1.0)[None, :] +
                                               K[:, None] * (n * (n - 1.0))[None, :])
    log_g[:, 0] = -np.inf
    prior = np.full(len(S), -math.log(len(S)))
    return Grid(S, K, prior, log_g)


@dataclass(frozen=True)
class SizeStats:
    """What is known at one size: how much evidence (samples of the reference length), their
    weighted mean log throughput and its spread."""

    weight: float
    mean_log: float
    var_log: float = 0.0


@dataclass(frozen=True)
class Fit:
    """A fitted curve at n = 1..nmax: the expected throughput (what an allocator should weigh),
    and the geometric centre and log-space standard deviation of the belief (its band)."""

    mean: np.ndarray          # E[X(n)], samples/s, index n (0 unused)
    sd_log: np.ndarray        # sd of log X(n), index n
    lam: float                # the most probable shape's parameters (for display)
    sigma: float
    kappa: float
    model: str
    log_lam: float = 0.0                    # posterior mean of log lam (the 1-node rate)
    evidence: Optional[np.ndarray] = None   # posterior over the grid under the flat prior
    center: Optional[np.ndarray] = None     # exp(E[log X(n)]), index n

    def band(self, n: int, z: float = 1.0) -> tuple[float, float]:
        """Lower and upper edge of the z-sigma band at n (around the geometric centre)."""
        m = float(self.center[n] if self.center is not None else self.mean[n])
        s = float(self.sd_log[n])
        return m * math.exp(-z * s), m * math.exp(z * s)

    @property
    def peak(self) -> int:
        """The size the fit expects to be fastest."""
        return int(np.argmax(self.mean[1:]) + 1)


def fit(points: Mapping[int, SizeStats], nmax: int, *, noise: float = 0.03,
        model_error: float = 0.03, prior_mu: float = math.log(1000.0), prior_tau: float = 2.0,
        model: str = "usl", extra: Optional[Sequence[tuple[int, float, float]]] = None,
        shape_prior: Optional[np.ndarray] = None) -> Fit:
    """Fit the model to per-size statistics of log throughput.

    Each size weighs 1 / (noise^2 / weight + model_error^2): more samples make a size more
    certain, but never more certain than the model can be (the shipped curves are not exactly
    USL). `prior_mu`, `prior_tau`: a normal prior on log lam (the 1-node rate), which is all
    there is for a job with no samples. `extra`: pseudo-observations (n, log rate, sd), e.g.
    the points of a curve a user gave, which measurements then refine. `shape_prior`: log
    weights over the grid's shapes replacing the flat prior (e.g. what other jobs showed); the
    returned `evidence` is the posterior under the flat prior, what this job alone says."""
    g = grid(model, nmax)
    obs = [(n, s.mean_log, noise * noise / s.weight + model_error * model_error)
           for n, s in points.items() if 1 <= n <= nmax and s.weight > 0]
    obs += [(n, m, sd * sd + model_error * model_error) for n, m, sd in (extra or ()) if 1 <= n <= nmax]
    w0 = 1.0 / (prior_tau * prior_tau)
    if obs:
        ns = np.array([o[0] for o in obs], dtype=int)
        ys = np.array([o[1] for o in obs])
        ws = 1.0 / np.array([o[2] for o in obs])
        r = ys[None, :] - g.log_g[:, ns]                       # log lam implied per (shape, point)
        W = ws.sum() + w0
        mu = (r @ ws + w0 * prior_mu) / W                      # profiled log lam per shape
        sse = ((r - mu[:, None]) ** 2) @ ws + w0 * (mu - prior_mu) ** 2
    else:
        W = w0
        mu = np.full(len(g.sigma), prior_mu)
        sse = np.zeros(len(g.sigma))
    flat = -0.5 * sse
    ev = np.exp(flat - flat.max())
    ev /= ev.sum()
    logp = (g.log_prior if shape_prior is None else shape_prior) + flat
    p = np.exp(logp - logp.max())
    keep = p > 1e-9                                            # shapes the data has ruled out drop
    p, mu, log_g = p[keep] / p[keep].sum(), mu[keep], g.log_g[keep]
    curves = mu[:, None] + log_g[:, 1:]                        # [shapes, nmax]
    center = p @ curves
    var = p @ (curves - center[None, :]) ** 2 + 1.0 / W
    expected = (p @ np.exp(curves - center[None, :])) * np.exp(center + 0.5 / W)   # E[X], mixture over shapes
    best = int(np.argmax(p))
    return Fit(np.concatenate([[0.0], expected]), np.concatenate([[0.0], np.sqrt(np.maximum(var, 0.0))]),
               float(math.exp(mu[best])), float(g.sigma[keep][best]), float(g.kappa[keep][best]), model,
               float(p @ mu), ev, np.concatenate([[0.0], np.exp(center)]))


def stats_of(rates: Sequence[float]) -> SizeStats:
    """SizeStats of raw throughput samples at one size (non-positive samples are dropped)."""
    logs = np.log([r for r in rates if r > 0])
    if len(logs) == 0:
        return SizeStats(0, 0.0)
    return SizeStats(len(logs), float(logs.mean()), float(logs.var()))


def best_fit(ns: Sequence[int], rates: Sequence[float], model: str = "usl") -> tuple[float, float, float]:
    """Least-squares (in log space) lam, sigma, kappa on a fine grid: for comparing models on
    exact measured curves, where the coarse grid of `fit` would blur the difference."""
    sig = np.concatenate([[0.0], np.geomspace(1e-5, 2.0, 300)])
    kap = np.concatenate([[0.0], np.geomspace(1e-8, 0.5, 300)]) if model == "usl" else np.zeros(1)
    n = np.asarray(ns, dtype=float)
    y = np.log(np.asarray(rates, dtype=float))
    S, K = np.meshgrid(sig, kap, indexing="ij")
    log_g = np.log(n)[None, None, :] - np.log1p(S[..., None] * (n - 1) + K[..., None] * n * (n - 1))
    mu = (y - log_g).mean(axis=-1)
    sse = ((y - log_g - mu[..., None]) ** 2).sum(axis=-1)
    i, k = np.unravel_index(int(np.argmin(sse)), sse.shape)
    return float(math.exp(mu[i, k])), float(sig[i]), float(kap[k])


def compare_models(curves: Mapping[str, tuple[Sequence[int], Sequence[float]]]) -> dict:
    """RMS and worst relative error of the best USL and Amdahl fit to each measured curve."""
    out: dict = {}
    for name, (ns, rates) in curves.items():
        row = {}
        for model in MODELS:
            lam, sigma, kappa = best_fit(ns, rates, model)
            rel = usl(np.asarray(ns, dtype=float), lam, sigma, kappa) / np.asarray(rates) - 1.0
            row[model] = {"rms_pct": round(100 * float(np.sqrt(np.mean(rel ** 2))), 2),
                          "max_pct": round(100 * float(np.max(np.abs(rel))), 2),
                          "sigma": sigma, "kappa": kappa}
        out[name] = row
    return out


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m core.scaling [JOBSET.csv ...]`: which model fits the measured curves better."""
    import argparse
    from pathlib import Path

    from .jobsets import load_jobset
    data = Path(__file__).resolve().parent.parent / "data"
    ap = argparse.ArgumentParser(prog="python -m core.scaling", description=main.__doc__.split(":", 1)[1].strip())
    ap.add_argument("jobsets", nargs="*", type=Path,
                    default=[data / "jobs-imagenet-1001.csv", data / "jobs-hps-shufflenet-1000.csv"])
    args = ap.parse_args(argv)
    curves: dict = {}
    for path in args.jobsets:
        for job in load_jobset(path):
            key = f"{path.stem}:{job.name or job.id}"
            curves.setdefault(key, (job.curve.nodes, job.curve.samples_per_second))
    result = compare_models(curves)
    print(f"{'curve':<38} {'USL rms %':>9} {'max %':>6} {'sigma':>8} {'kappa':>9}   "
          f"{'Amdahl rms %':>12} {'max %':>6} {'sigma':>8}")
    for name, r in result.items():
        u, a = r["usl"], r["amdahl"]
        print(f"{name:<38} {u['rms_pct']:>9.2f} {u['max_pct']:>6.2f} {u['sigma']:>8.2g} {u['kappa']:>9.2g}   "
              f"{a['rms_pct']:>12.2f} {a['max_pct']:>6.2f} {a['sigma']:>8.2g}")
    mean = {m: sum(r[m]["rms_pct"] for r in result.values()) / len(result) for m in MODELS}
    print(f"{'mean':<38} {mean['usl']:>9.2f} {'':>26}   {mean['amdahl']:>12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
