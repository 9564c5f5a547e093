"""Slurm's commands as fakes on PATH (sinfo, squeue, scancel, scontrol) that record their argv:
for tests of what the harvester would ask Slurm, with no Slurm running. They print what Slurm
24.11 prints for the text formats the harvester asks for (core/slurm/parse.py)."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional, Sequence

import pytest

FAKE_SLURM = """#!{python}
import json, os, sys
with open(os.environ["FAKE_SLURM_LOG"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")
print({version!r} if "--version" in sys.argv else {out!r})
"""
VERSION = "slurm 24.11.5"


def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               addresses: Optional[Sequence[str]] = None, gres: Optional[Sequence[Optional[str]]] = None,
               version: str = VERSION, sinfo: Optional[str] = None) -> Path:
    """sinfo, squeue, scancel and scontrol on PATH that record their argv; returns the record.
    sinfo lists node1, node2 (idle, partition scavenger), at `addresses` where given, with the
    `gres` strings where given (None: `(null)`); `sinfo --version` prints `version`, and `sinfo`
    prints `sinfo` instead where given."""
    bin_dir, record = tmp_path / "bin", tmp_path / "argv.jsonl"
    bin_dir.mkdir()
    lines = [f"node{i}|idle|scavenger|{addresses[i - 1] if addresses else '(null)'}|"
             f"{gres[i - 1] if gres and gres[i - 1] is not None else '(null)'}|" for i in (1, 2)]
    for name, out in (("sinfo", "\n".join(lines) if sinfo is None else sinfo), ("squeue", ""), ("scancel", ""), ("scontrol", "node1")):
        (bin_dir / name).write_text(FAKE_SLURM.format(python=sys.executable, out=out, version=version))
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_LOG", str(record))
    return record




def slurm_source(settings):
    """The pilot source on Slurm (core/slurm/provider.py) with these settings."""
    from core.pilots.source import PilotSource
    from core.slurm.provider import SlurmScheduler
    return PilotSource(settings, SlurmScheduler(settings))
