"""The chaos test of issue 56: jobs survive hosts that die the hard way. `python -m bench.faults
--quick` on four hosts in network namespaces (ssh): while a runtime job and a torchrun job train
on 2 hosts each, one host of each (in turn) loses its link and has its sshd and every process in
it SIGKILLed, stays dead 50 s, and comes back. Both jobs finish their exact total samples and
never fail; no dead host is offered once noticed; each host is offered again within 30 s of its
recovery; no healthy host is declared lost; each job trains again on its other host while the
dead one is still dead, and grows back onto it once it returns. How soon (the 10 s / 15 s / 45 s
goals) is the bench's figure, in docs/evaluation/faults.md, not asserted here: a loaded machine
stretches every time alike."""
from __future__ import annotations

from tests.support.procs import last_json, run_module


def test_jobs_survive_hosts_that_die_and_use_them_again_when_they_recover():
    out = last_json(run_module("bench.faults", "--quick", "--json", timeout=900))
    assert out["violations"] == [], out["violations"]
    assert out["hosts"] >= 3 and len(out["losses"]) == 2, out["losses"]
    for name, job in out["jobs"].items():
        assert job["state"] == "done" and job["samples_done"] == job["total_samples"], (name, job)
    for loss in out["losses"]:
        assert loss["detect_s"] is not None and loss["train_s"] is not None, loss
        assert loss["back_s"] is not None and loss["back_s"] <= 30.0, loss
        assert loss["regrow_s"] is not None, loss
