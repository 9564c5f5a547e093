"""Job sets: CSV files of training jobs measured on Summit (data/jobs-*.csv).

The whole file is validated before anything uses it, so a bad line never leaves half a job
set in the store.
"""
from __future__ import annotations

import csv
from pathlib import Path

from pydantic import ValidationError

from .errors import InputError
from .model import Job
from .schemas import JobSetRow, explain
from .timeutil import parse_iso

COLUMNS = ("job", "model", "submit_time", "min_nodes", "max_nodes", "total_samples",
           "scale_up_seconds", "scale_down_seconds", "nodes", "samples_per_second", "priority", "owner")
REQUIRED = ("job", "submit_time", "min_nodes", "max_nodes", "total_samples", "nodes",
            "samples_per_second")


def load_jobset(path: str | Path) -> list[Job]:
    path = Path(path)
    try:
        fh = path.open(newline="")
    except OSError as e:
        raise InputError(path, None, f"cannot read: {e.strerror}")
    with fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise InputError(path, 1, "empty file, expected a header line")
        header = [h.strip() for h in header]
        unknown = [h for h in header if h not in COLUMNS]
        if unknown:
            raise InputError(path, 1, f"unknown column(s) {', '.join(unknown)}; "
                                      f"known: {', '.join(COLUMNS)}")
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise InputError(path, 1, f"missing column(s) {', '.join(missing)}")
        jobs: list[Job] = []
        seen: set[str] = set()
        for lineno, fields in enumerate(reader, start=2):
            if not fields or all(not f.strip() for f in fields):
                continue
            if len(fields) != len(header):
                raise InputError(path, lineno, f"expected {len(header)} fields, found {len(fields)}")
            raw = {k: v.strip() for k, v in zip(header, fields)}
            try:
                row = JobSetRow.model_validate(raw)
                submit = parse_iso(row.submit_time)
            except ValidationError as e:
                raise InputError(path, lineno, explain(e))
            except ValueError as e:
                raise InputError(path, lineno, f"submit_time: {e}")
            if row.job in seen:
                raise InputError(path, lineno, f"job id {row.job} appears twice")
            seen.add(row.job)
            curve = row.curve()
            jobs.append(Job(
                id=row.job, min_nodes=row.min_nodes, max_nodes=row.max_nodes,
                total_samples=row.total_samples, curve=curve,
                scale_up_seconds=row.scale_up_seconds, scale_down_seconds=row.scale_down_seconds,
                priority=row.priority, submit_time=submit, name=row.model, true_curve=curve, owner=row.owner))
    return jobs
