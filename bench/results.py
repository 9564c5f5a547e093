"""How a bench that keeps a work folder hands over its result: `--save FILE`, `--json` (the last
stdout line) and the folder removed unless `--keep`."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional


def hand_over(result: dict, save: Optional[Path], as_json: bool, folder: Path, keep: bool) -> None:
    if save:
        save.write_text(json.dumps(result, indent=1) + "\n")
    if as_json:
        print(json.dumps(result))
    if not keep:
        shutil.rmtree(folder, ignore_errors=True)
