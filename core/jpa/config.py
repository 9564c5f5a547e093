"""The advisor's settings in one checked dataclass: the replay, the live harvester and the web
options build it, and every part of the JPA reads it."""
from __future__ import annotations

from dataclasses import dataclass

from ..scaling import MODELS


@dataclass
class JPAConfig:
    model: str = "usl"
    cap_factor: float = 2.0       # never beyond this x the largest size with evidence...
    cap_sd: float = 0.3           # ...unless the fit's band stays this narrow (sd of log) there
    noise: float = 0.03           # sd of the log throughput of one sample of `sample_s` seconds
    sample_s: float = 30.0        # the measuring window `noise` refers to
    model_error: float = 0.03     # how far a real curve may stray from the model
    prior_rate: float = 1000.0    # 1-node samples/s assumed before any job has been measured
    prior_tau: float = 2.0        # sd of that log rate
    given_sd: float = 0.15        # trust in a user-given curve point (sd of log)
    probe_s: float = 60.0         # how long a probe is expected to run before the next decision
    probe_gap_s: float = 60.0     # at least this long between two probes of one job
    probe_timeout_s: float = 600.0
    probe_margin: float = 1.0     # probe when expected gain > margin x expected cost
    min_sizes: int = 0            # profile at least this many sizes whatever it costs (0: by value only)
    up_seconds: float = 18.0      # rescale-cost priors when nothing was given
    down_seconds: float = 12.0
    trust_given_costs: bool = True
    concentration: float = 1.0    # weight, in jobs, of the flat prior among measured jobs' shapes
    groups: bool = True           # jobs of one name and owner inform each other's priors first

    @classmethod
    def live(cls, sizes: int = 3) -> "JPAConfig":
        """On real workers: samples are 5 s of steps (noisier than the replay's 30 s windows),
        rescale costs are measured (a regroup takes ~0.1 s, so probes are cheap), and each new
        job is measured at `sizes` sizes early on, for its curve."""
        return cls(sample_s=5.0, noise=0.05, min_sizes=sizes, probe_gap_s=10.0, probe_s=10.0)

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"unknown scalability model {self.model!r}; choose one of {', '.join(MODELS)}")
        if self.cap_factor < 1 or self.noise <= 0 or self.prior_rate <= 0 or self.sample_s <= 0:
            raise ValueError("cap_factor >= 1, noise > 0, sample_s > 0 and prior_rate > 0 are required")
        if self.min_sizes < 0 or self.probe_s <= 0 or self.probe_timeout_s <= 0 or self.probe_margin <= 0:
            raise ValueError("min_sizes >= 0 and positive probe_s, probe_timeout_s, probe_margin are required")
