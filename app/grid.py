"""The node grid: where each node sits on screen, what colour it is, and the smallest update
that brings a browser from the snapshot it has to the current one.

Summit-style names (`a01n07`: row letter, rack number, node) are laid out as the machine is
built: one block per rack (3 x 6 cells for 18 nodes), racks side by side by number, a band per
row letter, which is a wide picture for a wall screen. Any other names fall back to a compact
grid in the given order.
"""
from __future__ import annotations

import math
import re
import threading
import time
import zlib
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from dash import Patch

from core.snapshot import BUSY, HELD, IDLE, LOST_PREFIX, Snapshot

from .format import extent, gpus, plotly_text

_NAME = re.compile(r"^([A-Za-z]+)(\d+)n(\d+)$")

#: cell codes (z of the heatmap): busy with the main scheduler, idle and unused, rescaling,
#: then one code per job colour slot, then the same slots probing (a job at a size it has no
#: throughput sample at yet: a lighter shade of its colour).
C_BUSY, C_IDLE, C_RESCALE, C_JOB0 = 0, 1, 2, 3
#: idle nodes a light grey, busy ones a dark grey, both without hue so that no job colour (and
#: no probing shade of one) reads as either; the white gaps between racks are lighter still
BUSY_COLOUR, IDLE_COLOUR, RESCALE_COLOUR = "#4d4d4d", "#c8c8c8", "#f5a000"
#: running jobs: strong hues far apart from each other and from the greys, the rescaling orange
#: and white (CIEDE2000 >= 25, their probing shades >= 18; tests/test_pages_newcomer.py), none
#: near-black (a navy or a maroon cell reads as busy). After Trubetskoy's 20 distinct colours.
JOB_COLOURS = ("#e6194b", "#3cb44b", "#2b65ee", "#f032e6", "#bfef45", "#911eb4", "#00b2ff",
               "#992e00", "#0b8e81", "#f97b72", "#8e8e0b", "#00ffe6")
C_PROBE0 = C_JOB0 + len(JOB_COLOURS)
N_CODES = C_PROBE0 + len(JOB_COLOURS)
#: how far towards white a probing job's shade is
PROBE_LIGHTEN = 0.55
#: above this many changed cells a full resend is smaller than per-cell patches
PATCH_LIMIT = 600


def lighter(colour: str, amount: float = PROBE_LIGHTEN) -> str:
    """`colour` (#rrggbb) moved `amount` of the way to white."""
    rgb = [int(colour[k:k + 2], 16) for k in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * amount):02x}" for c in rgb)


PROBE_COLOURS = tuple(lighter(c) for c in JOB_COLOURS)


@dataclass(frozen=True)
class Layout:
    """Cell position of every node, in snapshot order."""

    rows: int
    cols: int
    row: np.ndarray          # per node
    col: np.ndarray          # per node
    labels: tuple[str, ...]  # rack or band label per grid row (for the y axis), '' for none
    kind: str                # "racks" or "compact"


def make_layout(names: Sequence[str], width: int = 3) -> Layout:
    parsed = [_NAME.match(n) for n in names]
    if names and all(parsed):
        return _rack_layout(names, parsed, width)
    return _compact_layout(len(names))


def _rack_layout(names, parsed, width) -> Layout:
    per_rack: dict[tuple[str, int], list[int]] = {}
    for i, m in enumerate(parsed):
        per_rack.setdefault((m.group(1), int(m.group(2))), []).append(i)
    bands = sorted({b for b, _ in per_rack})
    numbers = sorted({r for _, r in per_rack})
    biggest = max(len(v) for v in per_rack.values())
    height = math.ceil(biggest / width)
    col_of_rack = {r: k * (width + 1) for k, r in enumerate(numbers)}
    row_of_band = {b: k * (height + 1) for k, b in enumerate(bands)}
    row = np.zeros(len(names), dtype=np.int32)
    col = np.zeros(len(names), dtype=np.int32)
    for (band, rack), idx in per_rack.items():
        idx = sorted(idx, key=lambda i: int(parsed[i].group(3)))
        for k, i in enumerate(idx):
            row[i] = row_of_band[band] + k // width
            col[i] = col_of_rack[rack] + k % width
    rows = len(bands) * (height + 1) - 1
    labels = [""] * rows
    for b, r in row_of_band.items():
        labels[r + height // 2] = b
    return Layout(rows, len(numbers) * (width + 1) - 1, row, col, tuple(labels), "racks")


def _compact_layout(n: int) -> Layout:
    cols = max(1, math.ceil(math.sqrt(n * 2.5)))
    rows = max(1, math.ceil(n / cols))
    i = np.arange(n)
    return Layout(rows, cols, (i // cols).astype(np.int32), (i % cols).astype(np.int32),
                  ("",) * rows, "compact")


class ColourBook:
    """A stable colour slot per job: a job keeps its slot while it runs, and a new job gets a
    slot no running job has (the least recently freed), so ten jobs never share a colour."""

    def __init__(self, slots: int = len(JOB_COLOURS)) -> None:
        self._slot: dict[str, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(slots))
        self._lock = threading.Lock()

    def slot(self, job: str) -> int:
        with self._lock:
            s = self._slot.get(job)
            if s is None:
                if self._free:
                    s, _ = self._free.popitem(last=False)
                else:
                    s = zlib.crc32(job.encode()) % len(JOB_COLOURS)
                self._slot[job] = s
            return s

    def release_except(self, live: set[str]) -> None:
        with self._lock:
            for job in [j for j in self._slot if j not in live]:
                s = self._slot.pop(job)
                if s not in self._slot.values():
                    self._free[s] = None


@dataclass(frozen=True)
class Cells:
    """What the grid shows for one snapshot: a code and a hover line per node."""

    seq: int
    codes: np.ndarray
    text: tuple[str, ...]


def _when(t: Optional[float]) -> str:
    return " since " + time.strftime("%b %d %H:%M", time.gmtime(t)) if t is not None else ""


def job_label(snap: Snapshot) -> dict[str, str]:
    return {j["id"]: plotly_text(f'{j["name"]} ({j["id"]})' if j["name"] else j["id"]) for j in snap.jobs
            if j["state"] == "running"}


def job_extents(snap: Snapshot) -> dict[str, str]:
    """What each running job holds, in the words of the job page ("3 nodes × 6 GPUs = 18 ranks")."""
    runs = bool(snap.config.get("runs_workers"))
    return {j["id"]: extent(j["nodes"], j.get("slots"), j.get("ranks", j["nodes"]), runs) for j in snap.jobs
            if j["state"] == "running"}


def cells_of(snap: Snapshot, book: ColourBook) -> Cells:
    """A code and a hover line per node. Where some node runs more than one rank, the hover also
    says its GPUs and, on a held node, what its job holds in all; on a machine of one-slot nodes
    that would only repeat the node count, so it is left out."""
    state = np.asarray(snap.state, dtype=np.int16)
    codes = np.where(state == BUSY, C_BUSY, C_IDLE).astype(np.int16)
    text = []
    names = job_label(snap)
    live = set(names)
    book.release_except(live)
    info = snap.node_info
    sizes = Counter(j for j in snap.job_of if j in snap.probing) if snap.probing else {}
    multi = snap.kpis.get("gpus", len(snap.nodes)) > len(snap.nodes)
    per_node = snap.slots if multi and snap.slots else (1,) * len(snap.nodes)
    node_words = {k: f"<br>{gpus(k)}" if multi else "" for k in set(per_node)}
    job_words = {j: f" · the job: {e}" for j, e in job_extents(snap).items()} if multi else {}
    for i, (st, job, k) in enumerate(zip(snap.state, snap.job_of, per_node)):
        since = _when(snap.since[i] if snap.since else None)
        if info and info[i]:
            since += f" · {plotly_text(info[i])}"          # the source's own word on the node (Slurm's state)
        own = node_words[k]
        if st == HELD and job is not None:
            own += job_words.get(job, "")
            if job in snap.rescaling:
                codes[i] = C_RESCALE
                text.append(f"rescaling {names.get(job, job)}{since}{own}")
            elif job in sizes:
                codes[i] = C_PROBE0 + book.slot(job)
                size = f"{sizes[job]} node" + ("s" if sizes[job] != 1 else "")
                text.append(f"{names.get(job, job)}{since}<br>probing: no sample at {size} yet{own}")
            else:
                codes[i] = C_JOB0 + book.slot(job)
                text.append(f"{names.get(job, job)}{since}{own}")
        elif st == IDLE:
            text.append(f"idle{since}{own}")
        elif info and info[i].startswith(LOST_PREFIX):
            text.append(f"lost (held out){since}{own}")
        else:
            text.append(f"busy{since}{own}")
    return Cells(snap.seq, codes, tuple(text))


def z_matrix(layout: Layout, codes: np.ndarray) -> list[list[Optional[int]]]:
    z = np.full((layout.rows, layout.cols), -1, dtype=np.int16)
    z[layout.row, layout.col] = codes
    return [[None if v < 0 else int(v) for v in r] for r in z]


def text_matrix(layout: Layout, text: Sequence[str]) -> list[list[str]]:
    t = [[""] * layout.cols for _ in range(layout.rows)]
    for r, c, s in zip(layout.row.tolist(), layout.col.tolist(), text):
        t[r][c] = s
    return t


def names_matrix(layout: Layout, names: Sequence[str]) -> list[list[str]]:
    return text_matrix(layout, names)


def colourscale() -> list[list]:
    colours = [BUSY_COLOUR, IDLE_COLOUR, RESCALE_COLOUR, *JOB_COLOURS, *PROBE_COLOURS]
    n = len(colours)
    scale = []
    for k, c in enumerate(colours):
        scale.append([k / n, c])
        scale.append([(k + 1) / n, c])
    return scale


def grid_figure(layout: Layout, names: Sequence[str], cells: Cells) -> dict:
    """The whole figure, sent once per page load; later updates are patches of z and text."""
    return {
        "data": [{
            "type": "heatmap", "z": z_matrix(layout, cells.codes), "text": text_matrix(layout, cells.text),
            "customdata": names_matrix(layout, [plotly_text(n) for n in names]), "zmin": -0.5, "zmax": N_CODES - 0.5,
            "colorscale": colourscale(), "showscale": False, "xgap": 1, "ygap": 1,
            "hoverongaps": False,
            "hovertemplate": "<b>%{customdata}</b><br>%{text}<extra></extra>",
        }],
        "layout": {
            "margin": {"l": 28, "r": 4, "t": 4, "b": 4}, "height": max(260, 9 * layout.rows + 8),
            "xaxis": {"visible": False, "fixedrange": True},
            "yaxis": {"autorange": "reversed", "fixedrange": True, "tickmode": "array",
                      "tickvals": [i for i, s in enumerate(layout.labels) if s],
                      "ticktext": [s for s in layout.labels if s], "showgrid": False, "zeroline": False},
            "plot_bgcolor": "#ffffff", "paper_bgcolor": "#ffffff", "uirevision": "grid",
        },
    }


def grid_patch(layout: Layout, old: Optional[Cells], new: Cells) -> Patch:
    """The smallest update from `old` (what the browser has) to `new`: per-cell assignments when
    few cells changed, whole z and text otherwise (or when the browser's snapshot is unknown)."""
    patch = Patch()
    if old is None or len(old.codes) != len(new.codes):
        changed = None
    else:
        changed = np.flatnonzero((old.codes != new.codes)
                                 | np.fromiter((a is not b and a != b for a, b in zip(old.text, new.text)),
                                               dtype=bool, count=len(new.text)))
    if changed is None or len(changed) > PATCH_LIMIT:
        patch["data"][0]["z"] = z_matrix(layout, new.codes)
        patch["data"][0]["text"] = text_matrix(layout, new.text)
        return patch
    for i in changed.tolist():
        r, c = int(layout.row[i]), int(layout.col[i])
        patch["data"][0]["z"][r][c] = int(new.codes[i])
        patch["data"][0]["text"][r][c] = new.text[i]
    return patch


class CellCache:
    """Cells of the last few snapshots, shared by every browser: one build per snapshot, and a
    browser that reports the seq it has gets a diff against exactly that."""

    def __init__(self, keep: int = 64) -> None:
        self.keep = keep
        self.book = ColourBook()
        self._cells: OrderedDict[int, Cells] = OrderedDict()
        self._lock = threading.Lock()
        self._layouts: dict[tuple[str, ...], Layout] = {}

    def layout(self, names: tuple[str, ...]) -> Layout:
        lay = self._layouts.get(names)
        if lay is None:
            lay = self._layouts[names] = make_layout(names)
        return lay

    @staticmethod
    def machine_id(names: Sequence[str]) -> str:
        """A stable text id of the node list (text: a browser keeps it exactly, unlike a 64-bit
        int, which JavaScript rounds)."""
        return f"{len(names)}-{zlib.crc32(chr(10).join(names).encode()):08x}"

    def get(self, seq: int) -> Optional[Cells]:
        with self._lock:
            return self._cells.get(seq)

    def cells(self, snap: Snapshot) -> Cells:
        with self._lock:
            c = self._cells.get(snap.seq)
            if c is None:
                c = self._cells[snap.seq] = cells_of(snap, self.book)
                while len(self._cells) > self.keep:
                    self._cells.popitem(last=False)
            return c
