"""The Job Profiling Advisor on synthetic jobs whose true curves are known: the fit recovers
them from noisy samples, a job with no samples gets its prior, the cap holds, and probes are
asked for when (and only when) learning a size is worth its cost."""
from __future__ import annotations

import math

import numpy as np
import pytest

from core.jpa import JPA, JPAConfig
from core.model import Curve, Job, PauseSample, RateSample
from core.scaling import fit, stats_of, usl

NOISE = 0.03


def job(jid: str = "J1", lo: int = 1, hi: int = 64, name: str = "", given: Curve | None = None) -> Job:
    return Job(jid, lo, hi, 1e9, Curve((lo,), (0.0,)), name=name, given_curve=given)


def feed(jpa: JPA, jid: str, truth, sizes, per_size: int, rng: np.random.Generator, t0: float = 0.0) -> float:
    t = t0
    for n in sizes:
        for _ in range(per_size):
            t += 30.0
            jpa.observe(RateSample(t, jid, n, truth(n) * math.exp(NOISE * rng.standard_normal()), 30.0))
    return t


def synthetic(rng: np.random.Generator, model: str):
    lam = float(rng.uniform(200, 8000))
    sigma = float(rng.uniform(0.0, 0.15))
    kappa = float(rng.uniform(0.0, 0.02)) if model == "usl" else 0.0
    return (lambda n: float(usl(n, lam, sigma, kappa))), (lam, sigma, kappa)


@pytest.mark.parametrize("model", ["usl", "amdahl"])
def test_fit_recovers_known_curves_within_5pct_where_sampled_and_the_band_elsewhere(model):
    rng = np.random.default_rng(7 if model == "usl" else 8)
    worst_sampled, outside, checked, widths = 0.0, [], 0, []
    for k in range(40):
        truth, params = synthetic(rng, model)
        sizes = [(1, 2, 4, 8), (2, 8, 16), (4, 8, 16, 32), (1, 16)][k % 4]
        points = {n: stats_of([truth(n) * math.exp(NOISE * rng.standard_normal()) for _ in range(4)])
                  for n in sizes}
        f = fit(points, 64, noise=NOISE, model=model)
        for n in sizes:
            worst_sampled = max(worst_sampled, abs(f.mean[n] / truth(n) - 1.0))
        cap = min(64, 2 * max(sizes))
        for n in range(1, cap + 1):
            if n in sizes:
                continue
            lo, hi = f.band(n, z=2.0)
            checked += 1
            widths.append(hi / lo)
            if not lo <= truth(n) <= hi:
                outside.append((k, n, params, max(lo / truth(n), truth(n) / hi) - 1.0))
    assert worst_sampled <= 0.05, f"fit strays {worst_sampled:.1%} from the truth at a sampled size"
    # the stated band is the 2-sd credible band: nominally 95 % of the truth falls inside, and
    # what falls outside falls just outside; it is narrow enough to be of use
    assert len(outside) <= 0.05 * checked, f"{len(outside)} of {checked} sizes outside the band: {outside[:3]}"
    assert max((o[3] for o in outside), default=0.0) < 0.05, outside
    assert float(np.median(widths)) < 1.3, f"median band hi/lo {np.median(widths):.2f}: too wide to say much"


def test_a_job_with_no_samples_gets_its_prior():
    jpa = JPA(JPAConfig(prior_rate=500.0))
    jpa.register(job())
    b = jpa.belief("J1")
    assert b.max_nodes == 64                       # nothing measured anywhere: the prior stands
    assert b.curve(1) == pytest.approx(500.0 * math.exp(0.5 * 2.0 ** 2), rel=0.05)
    view = jpa.view("J1")
    assert view["measured"] == [] and view["confidence"] == "prior"
    lo, hi = view["fit"]["lo"][0], view["fit"]["hi"][0]
    assert lo < 500.0 < hi and hi / lo > 20        # a wide band: the prior knows little


def test_a_given_curve_is_a_prior_that_measurements_refine():
    given = Curve((1, 8, 32), (1000.0, 8000.0, 32000.0))     # the user claims linear scaling
    truth = lambda n: float(usl(n, 1000.0, 0.1, 0.01))       # it peaks near 9 nodes
    jpa = JPA()
    jpa.register(job(given=given))
    before = jpa.belief("J1").curve
    assert before(32) == pytest.approx(32000.0, rel=0.1)     # believed before any sample
    feed(jpa, "J1", truth, (8, 16, 32), 6, np.random.default_rng(1))
    after = jpa.belief("J1").curve
    for n in (8, 16, 32):
        assert after(n) == pytest.approx(truth(n), rel=0.05), n
    assert jpa.view("J1")["fit"]["peak"] < 16


def test_a_single_sample_never_yields_an_extrapolation_beyond_the_cap():
    for n in (1, 3, 4, 10, 40):
        jpa = JPA()
        jpa.register(job())
        jpa.observe(RateSample(30.0, "J1", n, 1000.0 * n, 30.0))
        b = jpa.belief("J1")
        cap = min(64, 2 * n)
        assert jpa.cap("J1") == cap and b.max_nodes == cap, n
        assert b.curve.nodes[-1] == cap               # the allocator sees no size past the cap


def test_rescale_costs_are_learned_from_measured_pauses():
    jpa = JPA(JPAConfig(trust_given_costs=False, up_seconds=18.0, down_seconds=12.0))
    jpa.register(job())
    before = jpa.belief("J1")
    assert (before.scale_up_seconds, before.scale_down_seconds) == (18.0, 12.0)
    for t in range(9):
        jpa.observe(PauseSample(float(t), "J1", "up", 0.2))
        jpa.observe(PauseSample(float(t), "J1", "down", 0.1))
    b = jpa.belief("J1")
    assert b.scale_up_seconds == pytest.approx(0.2, rel=0.05)
    assert b.scale_down_seconds == pytest.approx(0.1, rel=0.05)


def test_measured_shrinks_tell_how_long_an_unmeasured_grow_takes():
    jpa = JPA(JPAConfig(trust_given_costs=False, up_seconds=18.0, down_seconds=12.0))
    for jid in ("J1", "J2"):
        jpa.register(job(jid))
    jpa.observe(PauseSample(1.0, "J1", "down", 0.07))
    jpa.observe(PauseSample(2.0, "J1", "down", 0.08))
    b = jpa.belief("J1")
    assert b.scale_down_seconds < 0.5 and b.scale_up_seconds < 0.5    # not the 18 s prior
    assert jpa.belief("J2").scale_up_seconds < 1.0                     # a job never measured: as the others


def test_group_members_inform_a_new_job_of_the_same_name():
    rng = np.random.default_rng(3)
    truth = lambda n: float(usl(n, 3000.0, 0.004, 0.0))
    jpa = JPA()
    for i in range(4):
        jid = f"A{i}"
        jpa.register(job(jid, name="resnet"))
        feed(jpa, jid, truth, (4, 16, 64), 3, rng)
    jpa.register(job("new", name="resnet"))
    jpa.register(job("other", name="bert"))
    mine, theirs = jpa.belief("new").curve, jpa.belief("other").curve
    assert mine(64) == pytest.approx(truth(64), rel=0.1)     # before any sample of its own
    assert jpa.view("new")["uncertainty_pct"] < jpa.view("other")["uncertainty_pct"]
    assert theirs(1) == pytest.approx(truth(1), rel=0.5)     # the population's rate, loosely


def running(jpa: JPA, jid: str, size: int, t: float) -> None:
    jpa.ran(jid, size, t)


def test_probe_when_learning_pays_and_not_when_the_job_is_almost_done():
    rng = np.random.default_rng(5)
    truth = lambda n: float(usl(n, 1000.0, 0.02, 0.004))
    jpa = JPA()
    jpa.register(job())
    running(jpa, "J1", 16, 0.0)
    t = feed(jpa, "J1", truth, (16,), 2, rng)
    # one size known, a long job ahead: some other size is worth a look
    wanted = jpa.wanted_probes(t, {"J1": 1e10}, measured={"J1"}, room=64)
    assert "J1" in wanted and wanted["J1"].size != 16 and wanted["J1"].learn
    assert "probe at" in wanted["J1"].why
    # asked again before it runs there: the same probe, not a new one
    assert jpa.wanted_probes(t + 1, {"J1": 1e10}, room=64)["J1"].size == wanted["J1"].size
    jpa2 = JPA()
    jpa2.register(job())
    running(jpa2, "J1", 16, 0.0)
    t = feed(jpa2, "J1", truth, (16,), 2, rng)
    assert jpa2.wanted_probes(t, {"J1": 16 * 1000.0}, measured={"J1"}, room=64) == {}   # ~1 s of work left


def test_a_probe_never_grows_into_nodes_that_are_not_free():
    rng = np.random.default_rng(6)
    truth = lambda n: float(usl(n, 1000.0, 0.0, 0.0))
    jpa = JPA()
    jpa.register(job())
    running(jpa, "J1", 8, 0.0)
    t = feed(jpa, "J1", truth, (8,), 2, rng)
    wanted = jpa.wanted_probes(t, {"J1": 1e10}, measured={"J1"}, room=0)
    assert all(p.size <= 8 for p in wanted.values())


def test_after_a_probe_the_job_goes_back_when_the_old_size_was_better():
    rng = np.random.default_rng(9)
    truth = lambda n: float(usl(n, 1000.0, 0.0, 0.0))
    jpa = JPA(JPAConfig(probe_gap_s=0.0))
    jpa.register(job())
    running(jpa, "J1", 16, 0.0)
    t = feed(jpa, "J1", truth, (16,), 1, rng)
    wanted = jpa.wanted_probes(t, {"J1": 1e11}, measured={"J1"}, room=0)
    assert "J1" in wanted
    probe = wanted["J1"].size
    assert probe < 16
    why = jpa.ran("J1", probe, t)
    assert why and "probe at" in why
    t = feed(jpa, "J1", truth, (probe,), 1, rng, t)
    back = jpa.wanted_probes(t, {"J1": 1e11}, measured={"J1"}, room=16 - probe)
    assert back["J1"].size == 16 and back["J1"].back


def test_a_job_capped_below_where_it_would_grow_climbs_in_measured_steps():
    rng = np.random.default_rng(11)
    truth = lambda n: float(usl(n, 1000.0, 0.0, 0.0))
    jpa = JPA(JPAConfig(probe_margin=1e9, cap_sd=0.0))    # no probes to learn, the plain 2x cap: the climb
    jpa.register(job())
    running(jpa, "J1", 2, 0.0)
    t = feed(jpa, "J1", truth, (2,), 1, rng)
    seen = []
    for _ in range(6):
        wanted = jpa.wanted_probes(t, {"J1": 1e12}, measured={"J1"}, room=64 - jpa._profiles["J1"].size, tfwd=10.0)
        if "J1" not in wanted:
            break
        step = wanted["J1"].size
        assert step <= jpa.cap("J1"), "a climb step beyond the cap"
        seen.append(step)
        jpa.ran("J1", step, t)
        t = feed(jpa, "J1", truth, (step,), 1, rng, t)
    assert seen == [4, 8, 16, 32, 64], seen
