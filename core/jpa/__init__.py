"""Job Profiling Advisor (JPA): learn each job's scalability and rescale costs online.

MalleTrain's point (arXiv 2404.15668): users need not hand in a throughput curve; running the
job is the measurement. For every job the advisor keeps throughput samples per size (from the
workers' progress, or the simulated profiler), measured rescale pauses, which replace the given
or default costs, and a USL fit with an uncertainty band (core/scaling.py). A job never
measured starts from hierarchical priors (its group, then all jobs); a curve the user gave
enters as pseudo-observations at the sizes not yet measured, until a measurement contradicts it.
The allocator gets each job's curve up to an evidence cap; the advisor asks the controller to
force sizes worth learning. Pure bookkeeping and arithmetic: no clock, no I/O.

    config.py   JPAConfig, the settings
    profile.py  one job's samples, pauses and probe state
    priors.py   population and same-name group priors (empirical Bayes)
    fits.py     the job's fit under those priors, cached; a user's curve as pseudo-observations
    costs.py    rescale costs learned from measured pauses
    beliefs.py  what the allocator gets: the curve up to the evidence cap, the costs
    probes.py   value-of-information probes, the way back, climbs past the cap
    view.py     what the dashboard and the API read
    advisor.py  JPA, the facade the controller calls
"""
from .advisor import JPA
from .beliefs import Belief
from .config import JPAConfig
from .costs import PRIOR_PAUSES
from .probes import Probe, nodes
from .profile import PAUSE_KINDS
from .view import BAND_Z, confidence

__all__ = ["BAND_Z", "Belief", "JPA", "JPAConfig", "PAUSE_KINDS", "PRIOR_PAUSES", "Probe", "confidence",
           "nodes"]
