"""The exact optimum under node caps (an owner's, an account's: core.quotas), by merging each
capped group of jobs into one item before the knapsack over the idle nodes.

The caps of a problem are laminar (owners inside accounts): any two are disjoint or one holds
the other. Taking them from the innermost out, the jobs (and the groups already merged) under a
cap become one item whose value at k nodes is the best way to split exactly k nodes among them
(a max-plus convolution of their tables), cut at the cap. The capacity DP (milp.dp_sizes) then
chooses one size per item, and each item's size is split back, recursively, into job sizes.
Every size combination that respects the caps is reachable and none that breaks one is, so this
is the same optimum as the MILP with one extra row per cap (tests check both against exhaustive
enumeration).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .base import GroupCap
from .maxplus import maxplus_row

NEG_INF = -math.inf


@dataclass
class Item:
    """A job, or a group of items merged under a cap: its table (value at exactly k nodes) and
    how a size splits back into job sizes."""
    table: np.ndarray
    current: int
    jobs: tuple[int, ...]
    parts: list["Item"] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)   # rows[i]: parts 0..i on exactly k nodes

    def split(self, k: int, out: list[int]) -> None:
        if not self.parts:
            out[self.jobs[0]] = k
            return
        for i in range(len(self.parts) - 1, -1, -1):
            part = self.parts[i]
            t = part.table
            if i == 0:
                n = k
            else:
                before = self.rows[i - 1]
                m = min(len(t) - 1, k)
                ns = np.arange(m + 1)
                rest = k - ns
                ok = rest < len(before)
                total = np.full(m + 1, NEG_INF)
                total[ok] = before[rest[ok]] + t[: m + 1][ok]
                best = total.max()
                cur = part.current
                n = cur if cur <= m and total[cur] == best else int(np.flatnonzero(total == best)[0])
            part.split(n, out)
            k -= n


def convolve(a: np.ndarray, b: np.ndarray, limit: int) -> np.ndarray:
    """c[k] = max over n of a[k - n] + b[n], for k = 0..min(limit, len(a) + len(b) - 2)."""
    m = len(b) - 1
    top = min(limit, len(a) - 1 + m)
    ext = np.full(m + top + 1, NEG_INF)
    end = min(len(a), top + 1)
    ext[m: m + end] = a[:end]
    return maxplus_row(ext, np.asarray(b, dtype=float))     # a job's table: by its linear runs


def merge(parts: list[Item], limit: int) -> Item:
    rows = [parts[0].table[: limit + 1]]
    for p in parts[1:]:
        rows.append(convolve(rows[-1], p.table, limit))
    return Item(rows[-1], sum(p.current for p in parts), tuple(j for p in parts for j in p.jobs),
                parts, rows)


def capped_sizes(tables: Sequence[np.ndarray], capacity: int, current: Sequence[int],
                 caps: Sequence[GroupCap],
                 solve: Callable[[list[np.ndarray], int, list[int]], list[int]]) -> list[int]:
    """Exact optimum of max sum_j t_j[n_j] s.t. sum_j n_j <= capacity and, for every cap,
    the sum over its jobs <= its limit. `solve`: the capacity DP over item tables."""
    items: dict[int, Item] = {j: Item(np.asarray(t), current[j], (j,)) for j, t in enumerate(tables)}
    owner_of = {j: j for j in items}          # job -> key of the item that holds it now
    for limit, members in sorted(caps, key=lambda c: (len(c[1]), c[0])):
        keys = sorted({owner_of[j] for j in members}, key=lambda k: min(items[k].jobs))
        inside = {j for k in keys for j in items[k].jobs}
        if inside != set(members):
            raise ValueError("caps must be laminar: two caps overlap without one holding the other")
        merged = merge([items.pop(k) for k in keys], min(limit, capacity))
        key = keys[0]
        items[key] = merged
        for j in merged.jobs:
            owner_of[j] = key
    order = sorted(items, key=lambda k: min(items[k].jobs))
    totals = solve([items[k].table for k in order], capacity, [items[k].current for k in order])
    sizes = [0] * len(tables)
    for k, n in zip(order, totals):
        items[k].split(n, sizes)
    return sizes
