"""One row of the capacity DP (core.policies.milp.dp_sizes) in time linear in the node count.

A row is a max-plus convolution, row[r] = max over sizes t of ext[r + m - t] + v[t]. Summed
directly that is (rows x sizes) additions: 29 million for one job that may take all of 5,400
idle nodes, each step of a live controller at 10,624 nodes (issue 59). BFTrainer's values are
piecewise linear in the size (np.interp between curve points, one rescale cost either side of
the current size, core.objective), so each linear run [a, b] of v adds

    v[a] + beta * r + max over a window of L = b - a + 1 of (ext[u] - beta * u'),

a sliding window maximum (van Herk / Gil-Werman), linear in the row's length. A run is linear
within LINEAR_TOL of the table's largest value, checked point by point, so a row differs from
the direct sum by no more than that per job (tables from core.objective are linear between
their knots up to rounding, ~1e-16). A table with too many runs to pay (small jobs, a learned
curve with many points) is summed directly, in blocks, so its memory stays bounded.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

#: how far (relative to the table's largest magnitude) a run may stray from its line
LINEAR_TOL = 1e-11
#: rows x sizes below which the direct sum is cheaper than finding runs
DIRECT_CELLS = 1 << 16
#: sizes below which a table is summed directly (a row then costs at most this many sums a
#: capacity, and finding runs would cost more than it saves: 100 jobs of up to 64 nodes)
RUN_SIZES = 128
#: what a run costs per element of its row, in direct sums (measured 12-29 ns against 1.3-4 ns)
RUN_PASSES = 12
#: cells of the direct sum per block (64 MB of float64)
BLOCK_CELLS = 1 << 23

Run = tuple[int, int]


def linear_runs(v: np.ndarray, tol: float = LINEAR_TOL) -> Optional[list[Run]]:
    """Maximal runs [a, b] of finite entries of v on which v is linear (neighbouring runs
    share their knot); None when a run found by its slopes strays from its line (a slow bend)."""
    finite = np.isfinite(v)
    if not finite.any():
        return []
    scale = float(np.abs(v[finite]).max())
    eps = tol * max(1.0, scale)
    edges = np.flatnonzero(np.diff(np.concatenate(([False], finite, [False])).astype(np.int8)))
    runs: list[Run] = []
    for s, e in zip(edges[::2].tolist(), (edges[1::2] - 1).tolist()):
        seg = v[s:e + 1]
        knots = (s + 1 + np.flatnonzero(np.abs(np.diff(seg, 2)) > eps)).tolist() if e - s >= 2 else []
        bounds = [s, *knots, e]
        for a, b in zip(bounds[:-1], bounds[1:]):
            if b - a >= 2 and not _straight(v[a:b + 1], eps):
                return None
            runs.append((a, b))
    return runs


def _straight(seg: np.ndarray, eps: float) -> bool:
    line = seg[0] + (seg[-1] - seg[0]) * (np.arange(len(seg)) / (len(seg) - 1))
    return float(np.abs(seg - line).max()) <= eps


def window_max(x: np.ndarray, width: int) -> np.ndarray:
    """max(x[s:s + width]) for every s = 0..len(x) - width, in a few passes (van Herk /
    Gil-Werman: prefix and suffix maxima within blocks of `width`)."""
    if width == 1:
        return x.copy()
    n = len(x)
    blocks = -(-n // width)
    padded = np.full(blocks * width, -math.inf)
    padded[:n] = x
    b = padded.reshape(blocks, width)
    prefix = np.maximum.accumulate(b, axis=1).ravel()
    suffix = np.maximum.accumulate(b[:, ::-1], axis=1)[:, ::-1].ravel()
    return np.maximum(suffix[:n - width + 1], prefix[width - 1:n])


def row_by_runs(ext: np.ndarray, v: np.ndarray, runs: list[Run]) -> np.ndarray:
    """row[r] = max over t of ext[r + m - t] + v[t] (m = len(v) - 1), one linear run at a time."""
    m = len(v) - 1
    rows = len(ext) - m
    out = np.full(rows, -math.inf)
    r = np.arange(rows)
    for a, b in runs:
        width = b - a + 1
        if width == 1:
            cand = ext[m - a:m - a + rows] + v[a]
        else:
            beta = (v[b] - v[a]) / (b - a)
            g = ext[m - b:m - a + rows] - beta * np.arange(a - b, rows)
            cand = window_max(g, width) + (v[a] + beta * r)
        np.maximum(out, cand, out=out)
    return out


def row_direct(ext: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The same row summed over every (row, size) pair, in blocks of rows."""
    m = len(v) - 1
    rows = len(ext) - m
    windows = sliding_window_view(ext, m + 1)
    vals = v[::-1]
    step = max(1, BLOCK_CELLS // (m + 1))
    return np.concatenate([(windows[k:k + step] + vals).max(axis=1) for k in range(0, rows, step)])


def maxplus_row(ext: np.ndarray, v: np.ndarray) -> np.ndarray:
    """row[r] = max over t of ext[r + m - t] + v[t]: by linear runs where that is cheaper."""
    m = len(v) - 1
    rows = len(ext) - m
    cells = rows * (m + 1)
    if cells > DIRECT_CELLS and m >= RUN_SIZES:
        runs = linear_runs(v)
        if runs is not None and RUN_PASSES * len(runs) * (rows + m) < cells:
            return row_by_runs(ext, v, runs)
    return row_direct(ext, v)
