"""What a runtime job's coordinator status gives the profiler: committed steps over `sample_s`
of one generation are a throughput sample at that node count, and each regroup's pause (stop
sent to first step at the new size) a rescale-cost sample. Policy only, read on every call of
`WorkerDispatcher.samples`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from ..model import PauseSample, RateSample
from ..runtime import ranks


@dataclass
class Meter:
    paused_gen: int = 0                                 # last generation whose pause was measured
    window: Optional[tuple[int, float, int]] = None     # (generation, monotonic start, committed step)

    def measure(self, job_id: str, global_batch: int, st: dict, now: float, t: float,
                sample_s: float) -> list[Union[RateSample, PauseSample]]:
        """Samples since the last call; sizes are nodes (the unit of curves), whatever the
        ranks per node. A regroup forced by a failure is no rescale cost."""
        out: list[Union[RateSample, PauseSample]] = []
        rescale = st.get("last_rescale")
        if rescale and rescale["gen"] > self.paused_gen and rescale.get("first_step_at") is not None:
            self.paused_gen = rescale["gen"]
            size, before = len(ranks.nodes_of(rescale["members"])), rescale.get("prev_nodes") or 0
            pause = rescale.get("switch_s")
            if before > 0 and size != before and pause is not None and rescale.get("reason") != "failure":
                out.append(PauseSample(now, job_id, "up" if size > before else "down", float(pause)))
        gen, nodes, step = st["generation"], st["nodes"], st["committed_step"]
        if st["regrouping"] or nodes <= 0 or st["finished"] or st["failed"]:
            self.window = None
        elif self.window is None or self.window[0] != gen:
            self.window = (gen, t, step)
        elif t - self.window[1] >= sample_s and step > self.window[2]:
            _, t0, s0 = self.window
            out.append(RateSample(now, job_id, nodes, (step - s0) * global_batch / (t - t0), t - t0))
            self.window = (gen, t, step)
        return out
