"""Slurm's commands as fakes on PATH (sinfo, squeue, scancel, scontrol) that record their argv:
for tests of what the harvester would ask Slurm, with no Slurm running."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

import pytest

FAKE_SLURM = """#!{python}
import json, os, sys
with open(os.environ["FAKE_SLURM_LOG"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")
print({out!r})
"""


def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               addresses: Optional[Sequence[str]] = None, gres: Optional[Sequence[Optional[str]]] = None) -> Path:
    """sinfo, squeue, scancel and scontrol on PATH that record their argv; returns the record.
    sinfo lists node1, node2 (idle, partition scavenger), at `addresses` where given, with the
    `gres` strings where given (None: no `gres` field at all)."""
    bin_dir, record = tmp_path / "bin", tmp_path / "argv.jsonl"
    bin_dir.mkdir()
    nodes = {"nodes": [{"name": f"node{i}", "state": "idle", "state_flags": [], "partitions": ["scavenger"],
                        **({"address": addresses[i - 1]} if addresses else {}),
                        **({"gres": gres[i - 1]} if gres and gres[i - 1] is not None else {})} for i in (1, 2)]}
    for name, out in (("sinfo", json.dumps(nodes)), ("squeue", json.dumps({"jobs": []})), ("scancel", ""),
                      ("scontrol", "node1")):
        (bin_dir / name).write_text(FAKE_SLURM.format(python=sys.executable, out=out))
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_LOG", str(record))
    return record


