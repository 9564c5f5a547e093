"""Every component id of the dashboard, in one place, so pages and callbacks never disagree."""

# shell
URL = "url"
NAV_USER = "nav-user"
TICK = "tick"                 # dcc.Interval driving live updates (in the shell, shared by pages)
STATUS_BAR = "status-bar"
SOURCE_BADGE = "source-badge"  # live: the node source's state (ok / stale / dry run), in the status bar
STORE_BADGE = "store-badge"    # store writes failing (kept in memory, retried), in the status bar

# cluster page
GRID = "grid"
GRID_KEY = "grid-key"         # what the browser's grid shows: {boot, seq, nodes}
KPI = "kpi"                   # container of KPI cards
KPI_IDLE, KPI_HARVESTED, KPI_HARVEST_PCT = "kpi-idle", "kpi-harvested", "kpi-harvest-pct"
KPI_RATE, KPI_JOBS = "kpi-rate", "kpi-jobs"
HELD_BACK = "held-back"       # idle nodes unused while jobs wait for a --max-jobs slot (empty otherwise)
LEGEND = "legend"
LEGEND_PROBING = "legend-probing"     # the legend's entry for nodes of a job at an untried size
TL_NODES, TL_RATE, TL_KEY = "timeline-nodes", "timeline-rate", "timeline-key"

# jobs page
JOBS_TABLE = "jobs-table"
JOBS_STATE = "jobs-filter-state"
JOBS_CURVE = "jobs-filter-curve"      # the profiler's confidence in each job's curve
JOBS_SEARCH = "jobs-filter-search"
JOBS_COUNT = "jobs-count"
FORM = "job-form"
FORM_SUBMIT = "job-form-submit"
FORM_RESULT = "job-form-result"


def field_input(name: str) -> str:
    return f"job-form-{name}"


def field_error(name: str) -> str:
    return f"job-form-{name}-error"


# job page
JOB_ID = "job-id"
JOB_HEAD, JOB_WHY, JOB_CURVE, JOB_NODES, JOB_PROGRESS = (
    "job-head", "job-why", "job-curve", "job-nodes", "job-progress")
JOB_LOSS = "job-loss"         # the loss the job's rank 0 reports, over its steps (real workers only)
JOB_HOLDS = "job-holds"       # what it holds now: "3 nodes × 4 GPUs = 12 ranks"
JOB_PROFILE = "job-profile"   # what the profiler learned: costs, model, peak, confidence
JOB_PATTERN = "job-pattern"             # a torchrun job's progress pattern not matched yet
JOB_LAST_OUTPUT = "job-last-output"     # rank 0's last line of output
JOB_FAILURE_TAIL = "job-failure-tail"   # the log lines under a failed job's why-line
JOB_PROBES = "job-probes"     # the job's probes: time, nodes, why
JOB_PROBES_BOX, JOB_PROBES_TITLE = "job-probes-box", "job-probes-title"
JOB_EVENTS = "job-events"
JOB_CANCEL, JOB_CANCEL_RESULT = "job-cancel", "job-cancel-result"
JOB_CANCEL_CONFIRM = "job-cancel-confirm"     # asks before the job is cancelled
JOB_RESUBMIT, JOB_RESUBMIT_RESULT = "job-resubmit", "job-resubmit-result"   # a failed or cancelled job, continued

# allocator page
SOLVER_RUNS, SOLVE_HIST, DECISIONS, EVENT_LOG = "solver-runs", "solve-hist", "decisions", "event-log"
HORIZON = "horizon"
HORIZON_PLAIN = "horizon-plain"     # the horizon in one plain sentence, above the technical account
OBJECTIVE_HINT = "objective-hint"   # what the solver runs' objective is, in its unit

# replay page
RP_START, RP_HOURS, RP_NODES, RP_RACKS, RP_JOBSET = (
    "rp-start", "rp-hours", "rp-nodes", "rp-racks", "rp-jobset")
RP_SPEED, RP_POLICY, RP_TFWD = "rp-speed", "rp-policy", "rp-tfwd"
RP_GPUS = "rp-gpus"           # GPUs per node (counted beside the nodes, never allocated)
RP_NEW, RP_PAUSE, RP_RESUME, RP_RESTART, RP_APPLY_SPEED = (
    "rp-new", "rp-pause", "rp-resume", "rp-restart", "rp-apply-speed")
RP_RESULT, RP_STATE = "rp-result", "rp-state"
RP_SPEED_BOX = "rp-speed-box"          # the speed as a number, beside the snapping slider
RP_CONFIRM_NEW, RP_CONFIRM_RESTART = "rp-confirm-new", "rp-confirm-restart"
RP_PENDING = "rp-pending"             # a new run was asked for: the result line follows its loading


def rp_error(field: str) -> str:
    """The error line beside a Replay form field (fields as in app.replay_form.FIELDS)."""
    return f"rp-{field}-error"

# login page
LOGIN_USER, LOGIN_PASSWORD, LOGIN_SUBMIT, LOGIN_RESULT, LOGOUT = (
    "login-user", "login-password", "login-submit", "login-result", "logout")

# usage page (staff)
USAGE_BY, USAGE_WINDOW = "usage-by", "usage-window"
USAGE_SUMMARY, USAGE_TABLE, USAGE_CHART = "usage-summary", "usage-table", "usage-chart"
USAGE_CSV = "usage-csv"       # the CSV export of what the table shows
