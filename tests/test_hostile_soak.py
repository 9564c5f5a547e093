"""The hostile soak in its quick mode (bench/hostile.py, issue 57): one user's catastrophic
pattern, 30 MB line, NaN output, 2,000 processes and register-then-cancel flood against a live
harvester with a normal job training and six /metrics scrapers. Not how fast (the 30-minute run's
figures are in docs/evaluation/hostile.md), only what must never happen: a 5xx, an answer that is
not strict JSON, a log read that does not answer, a flood that is not throttled."""
from __future__ import annotations

from tests.support.procs import last_json, run_module


def test_one_hostile_user_gets_no_5xx_no_bad_json_and_is_throttled():
    out = last_json(run_module("bench.soak", "--hostile", "--quick", "--json", timeout=600))
    assert out["fives"] == 0, out["status"]
    assert out["violation_count"] == 0, out["violations"]
    assert not out["transport_errors"], out["transport_errors"]
    assert set(out["hostile_started"]) >= {"pattern", "line30", "nan", "forks"}, out["hostile_started"]
    assert out["logs"]["n"] > 0
    assert out["flood"].get("429", 0) > 0, out["flood"]
    assert out["quiet_samples_per_s"] > 0 and out["hostile_samples_per_s"] > 0
