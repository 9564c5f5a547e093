"""Hyperparameter search with Optuna whose trials are elastic jobs on the harvester's idle nodes.

Each trial is one run of examples/digits_cnn.py with its own learning rate and model width,
registered through the JSON API (app/client.py) under one name, so that the dashboard's Jobs page
lists the study as jobs "hpo-digits #N ...". While a trial trains, its rank 0's loss (the job's
`workers.loss`) goes to Optuna as the trial's intermediate value; a trial the pruner gives up on
is cancelled on the harvester, which gives its nodes to the other trials at once.

    python -m app --dispatch local --local-nodes 4 --trust-user-commands &   # or alice is staff, or mapped (--run-as)
    python examples/hpo_optuna.py --url http://127.0.0.1:8050 --user alice --trials 12 --parallel 3

Pruning: a trial whose loss is NaN or above --diverged-above (chance is ln 10 = 2.3) has
diverged and stops at once; after --warmup-reports reports, one whose best loss is worse than the
median of the finished trials at the same number of samples stops too (Optuna's MedianPruner).
Losses are reported at whole multiples of --report-every samples, so that every trial has a value
at the same steps for the median to compare.

Parameters are drawn in this process's main thread (Optuna's ask-and-tell), so that --seed gives
the same trials in the same order whatever the timing of the jobs; --parallel trials run at once,
one thread each, each polling its own job. Ctrl-C cancels the jobs of the running trials. The last
line printed is a JSON summary: {"study", "best", "trials": [{"number", "state", "job", "value",
"params"}]}. Optuna is needed here only: `pip install optuna` (pinned in requirements-dev.txt).
"""
from __future__ import annotations

import argparse
import getpass
import json
import math
import os
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:          # run as a script from anywhere: app/client.py
    sys.path.insert(0, str(_ROOT))

import optuna  # noqa: E402
from optuna.distributions import CategoricalDistribution, FloatDistribution  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from app.client import ApiError, Client  # noqa: E402

CHANCE_LOSS = math.log(10)


class AnyPruner(optuna.pruners.BasePruner):
    """Prunes a trial when any of its pruners would: a divergence test that needs no finished
    trial beside a comparison with the finished ones, which can only start once some exist."""

    def __init__(self, *pruners: optuna.pruners.BasePruner) -> None:
        self.pruners = pruners

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        return any(p.prune(study, trial) for p in self.pruners)


@dataclass(frozen=True)
class Plan:
    """What every trial's job gets: its size, length, command and how it is watched."""

    name: str
    python: str
    script: str
    min_nodes: int
    max_nodes: int
    total_samples: int
    global_batch: int
    step_seconds: float
    report_every: int
    poll_s: float


@dataclass
class Outcome:
    number: int
    state: str
    job: Optional[str]
    value: Optional[float]
    params: dict


class Stopped(Exception):
    """The study was interrupted (Ctrl-C) while this trial's job ran; the job was cancelled."""


class JobEnded(Exception):
    """A trial's job failed or was cancelled by someone else: that trial fails, the study goes on."""


def run_trial(client: Client, plan: Plan, trial: optuna.Trial, stop: threading.Event) -> float:
    """Submit the trial's job, report its loss as it trains, cancel it when the pruner says so
    (optuna.TrialPruned), and return its last loss when the job is done."""
    lr, width = trial.params["lr"], trial.params["width"]
    job = client.submit(
        name=f"{plan.name} #{trial.number} lr={lr:.3g} width={width}",
        min_nodes=plan.min_nodes, max_nodes=plan.max_nodes, total_samples=plan.total_samples,
        global_batch=plan.global_batch, scale_up_seconds=0, scale_down_seconds=0,
        command=[plan.python, plan.script, "--lr", repr(lr), "--width", str(width),
                 "--step-seconds", str(plan.step_seconds), "--log-every", "1000000000"])
    job_id = job["id"]
    trial.set_user_attr("job", job_id)
    say(f"trial {trial.number}: job {job_id}, lr {lr:.3g}, width {width}")
    reported, last_loss, ended = 0, None, False
    try:
        for info in client.watch(job_id, plan.poll_s):
            if stop.is_set():
                raise Stopped(f"trial {trial.number} interrupted")
            loss = (info.get("workers") or {}).get("loss")
            if info["state"] == "running" and loss is not None:
                last_loss = loss
                # every whole report interval passed since the last poll gets this loss, so that
                # the steps line up across trials
                upto = int(info["samples_done"]) // plan.report_every
                for k in range(reported + 1, upto + 1):
                    trial.report(loss, k * plan.report_every)
                if upto > reported:
                    reported = upto
                    if trial.should_prune() and _cancel(client, job_id):
                        ended = True
                        say(f"trial {trial.number}: pruned at {reported * plan.report_every} samples "
                            f"(loss {loss:.4g}); job {job_id} cancelled")
                        raise optuna.TrialPruned(f"loss {loss:.4g} at {reported * plan.report_every} samples")
            if info["state"] in ("failed", "cancelled"):
                ended = True
                raise JobEnded(f"job {job_id} {info['state']}")
            if info["state"] == "done":
                ended = True
    finally:
        if not ended:
            _cancel(client, job_id)
    if last_loss is None:
        raise JobEnded(f"job {job_id} finished before it reported a loss; raise --total-samples")
    say(f"trial {trial.number}: done, loss {last_loss:.4g}")
    return last_loss


def _cancel(client: Client, job_id: str) -> bool:
    """Cancel a job; False when it had already ended (409), so a trial that finished in the
    meantime is told as finished, never as pruned."""
    try:
        client.cancel(job_id)
    except ApiError as e:
        if e.status == 409:
            return False
        raise
    return True


def optimize(client: Client, study: optuna.Study, plan: Plan, trials: int, parallel: int,
             space: dict[str, optuna.distributions.BaseDistribution]) -> list[Outcome]:
    """Ask for each trial here (one thread: a seed gives the same trials), run up to `parallel`
    at once, tell Optuna each result here too."""
    stop = threading.Event()
    running: dict[Future, optuna.Trial] = {}
    outcomes: list[Outcome] = []

    def tell(fut: Future, trial: optuna.Trial) -> None:
        try:
            value = fut.result()
        except optuna.TrialPruned:
            study.tell(trial, state=TrialState.PRUNED)
        except JobEnded as e:
            say(f"trial {trial.number}: failed: {e}")
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, value)
        frozen = study.trials[trial.number]
        outcomes.append(Outcome(trial.number, frozen.state.name.lower(), frozen.user_attrs.get("job"),
                                frozen.value, dict(frozen.params)))

    with ThreadPoolExecutor(parallel, thread_name_prefix="trial") as pool:
        try:
            for _ in range(trials):
                while len(running) >= parallel:
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        tell(fut, running.pop(fut))
                trial = study.ask(space)
                running[pool.submit(run_trial, client, plan, trial, stop)] = trial
            while running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    tell(fut, running.pop(fut))
        except BaseException:
            stop.set()          # each running trial cancels its job at its next poll
            raise
    return sorted(outcomes, key=lambda o: o.number)


_SAY = threading.Lock()


def say(line: str) -> None:
    """One line to stdout; trials' threads take turns so that lines never interleave."""
    with _SAY:
        print(line, flush=True)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8050", help="the harvester (default %(default)s)")
    ap.add_argument("--token", default=os.environ.get("HARVEST_TOKEN"),
                    help="bearer token from POST /api/token (default: HARVEST_TOKEN)")
    ap.add_argument("--user", help="log in as this user instead of --token")
    ap.add_argument("--password", default=os.environ.get("HARVEST_PASSWORD"),
                    help="with --user (default: HARVEST_PASSWORD, else asked)")
    ap.add_argument("--name", default="hpo-digits", help="the study's name and its jobs' (default %(default)s)")
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--parallel", type=int, default=3, help="trials (jobs) at once (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    ap.add_argument("--lr-min", type=float, default=1e-3)
    ap.add_argument("--lr-max", type=float, default=30.0)
    ap.add_argument("--widths", default="8,16,32", help="model widths to try (default %(default)s)")
    ap.add_argument("--total-samples", type=int, default=32_000, help="per trial (default %(default)s)")
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--min-nodes", type=int, default=1)
    ap.add_argument("--max-nodes", type=int, default=2, help="nodes one trial may grow to (default %(default)s)")
    ap.add_argument("--step-seconds", type=float, default=0.0, help="passed to digits_cnn.py")
    ap.add_argument("--python", default=sys.executable, help="the workers' interpreter (default: this one)")
    ap.add_argument("--script", default=str(Path(__file__).with_name("digits_cnn.py")),
                    help="the training script as the nodes see it (default: next to this file)")
    ap.add_argument("--report-every", type=int, default=640, help="samples between reports to Optuna")
    ap.add_argument("--warmup-reports", type=int, default=5, help="reports before the median rule applies")
    ap.add_argument("--startup-trials", type=int, default=2,
                    help="finished trials before the median rule applies (default %(default)s)")
    ap.add_argument("--diverged-above", type=float, default=4.0,
                    help=f"a loss above this (or NaN) prunes at once (chance: {CHANCE_LOSS:.2f})")
    ap.add_argument("--poll", type=float, default=0.5, help="seconds between looks at a job")
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",") if w.strip()]
    for flag, ok in (("--trials", args.trials >= 1), ("--parallel", args.parallel >= 1),
                     ("--lr-min/--lr-max", 0 < args.lr_min < args.lr_max), ("--widths", bool(widths)),
                     ("--report-every", args.report_every >= 1), ("--poll", args.poll > 0)):
        if not ok:
            ap.error(f"{flag}: out of range")
    try:
        if args.user:
            password = args.password if args.password is not None else getpass.getpass(f"password for {args.user}: ")
            client = Client.login(args.url, args.user, password)
        elif args.token:
            client = Client(args.url, args.token)
        else:
            ap.error("give --token (or HARVEST_TOKEN) or --user")
        optuna.logging.set_verbosity(optuna.logging.WARNING)     # this script says what happens
        study = optuna.create_study(
            study_name=args.name, direction="minimize", sampler=optuna.samplers.TPESampler(seed=args.seed),
            pruner=AnyPruner(optuna.pruners.ThresholdPruner(upper=args.diverged_above),
                             optuna.pruners.MedianPruner(n_startup_trials=args.startup_trials,
                                                         n_warmup_steps=args.warmup_reports * args.report_every)))
        space = {"lr": FloatDistribution(args.lr_min, args.lr_max, log=True),
                 "width": CategoricalDistribution(widths)}
        plan = Plan(args.name, args.python, args.script, args.min_nodes, args.max_nodes, args.total_samples,
                    args.global_batch, args.step_seconds, args.report_every, args.poll)
        say(f"study {args.name}: {args.trials} trials, {args.parallel} at once; watch them on "
            f"{args.url.rstrip('/')}/jobs (search {args.name})")
        outcomes = optimize(client, study, plan, args.trials, args.parallel, space)
    except ApiError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: the running trials' jobs are cancelled", file=sys.stderr)
        return 130
    done = [o for o in outcomes if o.state == "complete"]
    best = min(done, key=lambda o: o.value if o.value is not None else math.inf) if done else None
    counts = {s: sum(o.state == s for o in outcomes) for s in ("complete", "pruned", "fail")}
    say(f"{counts['complete']} done, {counts['pruned']} pruned, {counts['fail']} failed"
        + (f"; best: trial {best.number}, loss {best.value:.4g}, {best.params}" if best else ""))
    print(json.dumps({"study": args.name, "best": best.__dict__ if best else None,
                      "trials": [o.__dict__ for o in outcomes]}), flush=True)
    return 0 if best else 1


if __name__ == "__main__":
    sys.exit(main())
