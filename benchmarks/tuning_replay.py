"""Offline replay of the tuning benchmark: ASHA + TPE against random search, over many seeds.

    .venv/bin/python benchmarks/tuning_replay.py                        # seeds 0-39
    .venv/bin/python benchmarks/tuning_replay.py --seeds 140 --jobs 2   # seeds 0-139, 2 processes
    .venv/bin/python benchmarks/tuning_replay.py --first-rung-quorum 0  # Ray's ASHA rule
    .venv/bin/python benchmarks/tuning_replay.py --startup-trials 10 --reduction-factor 3
    .venv/bin/python benchmarks/tuning_replay.py --target 0.983 --also-at 0.969 0.98  # targets
    .venv/bin/python benchmarks/tuning_replay.py --concurrent 4                       # workers
    .venv/bin/python benchmarks/tuning_replay.py --epochs 27              # per-trial budget
    .venv/bin/python benchmarks/tuning_replay.py --space benchmarks/spaces/digits_wide.yaml
    .venv/bin/python benchmarks/tuning_replay.py --oracle      # what a perfect pick costs

``benchmarks/tuning.py`` runs the real tuner on Ray, a few seconds of Ray and process start-up
per run; one run's cost depends on which of its first trials happen to be good, so eight
seeds cannot tell two settings apart. This script replays the same tuning runs in one process,
fast enough for a hundred seeds, with the tuner's own searchers, scheduler and trial code;
only time is modelled:

* **the same pieces as the tuner**: the config is ``examples/tune_digits.yaml`` parsed by
  hetflow's own config code (space, budget: 32 trials of at most 64 epochs, 2 at a time); the
  searcher and the scheduler are the objects the tuner builds
  (``hetflow.workloads.tune.runner.build_tune_config``: Tune's ``BasicVariantGenerator`` for random
  search, Ray's ``OptunaSearch`` over Optuna's TPE with the config's startup trials, hetflow's
  ``QuorumASHAScheduler`` or Tune's FIFO), wrapped and wired as ``tune.run`` does
  (``ConcurrencyLimiter``, ``SearchGenerator``, ``set_search_properties``, an ``Experiment``),
  and driven with Tune's own ``Trial`` objects in the order of Tune's controller: a result
  goes to the scheduler, then to the searcher unless the scheduler stopped the trial; a
  finished trial goes to both. So ``--first-rung-quorum 0`` is Ray's ASHA rule, and random
  search draws the configurations the real random search draws for the same seed.
* **the same trials**: each trial trains the digits MLP epoch by epoch with the trial's own
  code (``TrialSetup.trial_config``, ``build_model``, ``build_optimizer``, ``StepOrder``, and
  ``trial.py``'s epoch and evaluation), on CPU with the trial's thread count, and reports its
  validation accuracy and loss after each epoch.
* **what is modelled**: time. Two virtual workers run the trials side by side; an epoch takes
  ``EPOCH_FIXED_S + STEP_S x steps`` of virtual time and starting a trial ``TRIAL_START_S``
  (see below). Virtual time decides only which of two running trials reports first, i.e.
  the order the scheduler and the searcher see results in. What the real run has and the
  replay has not: the jitter of a loaded machine in that order, checkpoints, Ray.

A run stops at the first report with a validation accuracy at or above ``--target``
(``budget.target``); its **compute** is the trial-epochs reported over all trials up to and
including that report, as in ``benchmarks/tuning.py``. A run that never reaches the target
counts every epoch it trained and is flagged. Each seed changes the searcher's seed and the
models' initial weights (``train.seed``), as in ``benchmarks/tuning.py``. The figure is the
ratio of the mean compute over the seeds (asha+tpe / random). ``--also-at`` reads the cost of
lower targets from the same runs (a run's course does not depend on where it stops, so that
is what a run stopped there would have cost); ``--concurrent`` changes the number of virtual
workers, ``--space`` the search space (the ``space`` section of another tuning YAML) and
``--epochs`` the per-trial budget of both strategies.
``--oracle`` also trains every configuration random search draws on a seed until it reaches
the target, and prints what the fastest of them costs alone (:class:`Oracle`).

Trials are trained on demand, so a trial stopped after one epoch costs one epoch. Training is
deterministic (no random ops, a seeded stateless batch order, one thread), so a trial's curve
depends only on its training config, whatever else was trained before or in between: curves
are kept by config and would be shared by two trials that drew the same configuration (the
last lines say how many epochs were; with continuous learning rates, none in practice). The
result does not depend on ``--jobs``. About 2.3 s per seed on one core of the development
machine (both strategies; 140 seeds in 5.5 minutes).

Last line: ``RESULT replay_asha_over_random_compute=<x> replay_seeds=<n>``.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import logging
import math
import statistics
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Protocol

from hetflow.core.errors import InputError

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tuning_common, beside this file
from tuning_common import (  # noqa: E402
    EXAMPLE, SEARCH_KEYS, STRATEGIES, add_search_arguments, example_data, geomean,
    read_space, setup_line)

TARGET_METRIC = "val_accuracy"  # --target is a validation accuracy, as in benchmarks/tuning.py

# Virtual time, fitted to real runs of the tuner on the 2-core development machine: an epoch
# (training steps, evaluation, checkpoint, report) took 0.029 s + 0.0005 s per step (426
# epochs of 4 runs: a median 0.028 s at 5 steps, 0.072 s at 89), and each trial started cost
# about 0.22 s of a worker (least squares over the 64 runs of benchmarks/tuning.py). Measured
# directly later, a worker waits 0.04-0.05 s between trials; with 0.05 s here the 140-seed
# ratio is 0.400 instead of 0.413 (docs/tuning.md), so the figures keep the fitted value.
EPOCH_FIXED_S = 0.03
STEP_S = 0.0005
TRIAL_START_S = 0.2


class Curve(Protocol):
    """One trial's validation metrics, epoch by epoch (what the replay asks of a trial)."""

    steps_per_epoch: int

    def metrics(self, epoch: int) -> dict[str, float]:
        """``val_accuracy`` and ``val_loss`` after ``epoch`` epochs (1-based)."""
        ...


CurveSource = Callable[[Any], Curve]  # a trial's TrainConfig -> its curve


class TrainedCurve:
    """A trial's curve, trained on demand with the trial's own code and kept.

    ``metrics(epoch)`` trains the epochs not trained yet, so asking for epoch 3 and later for
    epoch 9 trains nine epochs in all, exactly as one uninterrupted trial would.
    """

    def __init__(self, config: Any, dataset: Any) -> None:
        import torch

        from hetflow.workloads.train.data import StepOrder
        from hetflow.workloads.train.loop import build_optimizer
        from hetflow.workloads.train.models import build_model, model_spec

        self._config = config
        self._spec = model_spec(config)
        self._dataset = dataset
        self._device = torch.device("cpu")
        self._model = build_model(config)
        self._optimizer = build_optimizer(config, self._model)
        self._order = StepOrder(len(dataset.train), config.train.batch_size, config.data.seed)
        self._scaler = (torch.amp.GradScaler("cpu") if config.train.precision == "fp16"
                        else None)
        self._metrics: list[dict[str, float]] = []
        self.steps_per_epoch = self._order.steps_per_epoch

    def metrics(self, epoch: int) -> dict[str, float]:
        from hetflow.workloads.tune.trial import train_epoch, evaluate

        while len(self._metrics) < epoch:
            train_epoch(self._model, self._optimizer, self._scaler, self._dataset, self._order,
                         len(self._metrics), self._device, self._config.train.precision,
                         self._spec)
            self._metrics.append(evaluate(self._model, self._dataset, self._device, self._spec))
        return self._metrics[epoch - 1]

    @property
    def epochs_trained(self) -> int:
        return len(self._metrics)


class TrainedCurves:
    """The replay's curve source: one :class:`TrainedCurve` per distinct training config.

    The key is the whole validated training config (sampled values, seed, data split), so
    two trials share a curve only when they would train identically.
    """

    def __init__(self) -> None:
        self._curves: dict[str, TrainedCurve] = {}
        self._datasets: dict[tuple[Any, ...], Any] = {}
        self.requests = 0

    def __call__(self, config: Any) -> TrainedCurve:
        self.requests += 1
        key = config.model_dump_json()
        if key not in self._curves:
            self._curves[key] = TrainedCurve(config, self._dataset(config))
        return self._curves[key]

    @property
    def epochs_trained(self) -> int:
        return sum(curve.epochs_trained for curve in self._curves.values())

    def _dataset(self, config: Any) -> Any:
        from hetflow.workloads.train.data import load_split

        # as run_trial loads it; the model section is in the key (the gpt's seq_len shapes it)
        key = (config.data.model_dump_json(), config.model.model_dump_json())
        if key not in self._datasets:
            self._datasets[key] = load_split(config)
        return self._datasets[key]


@dataclass(frozen=True)
class Report:
    """One epoch a trial reported, and what the scheduler decided on it."""

    trial: int  # order in which the searcher suggested the trial, from 0
    epoch: int
    value: float  # the config's search metric
    target_value: float  # the metric the target is on (val_accuracy)
    decision: str  # Tune's CONTINUE / STOP; "TARGET" for the report that ended the run


@dataclass
class Outcome:
    """One strategy's replayed run on one seed."""

    strategy: str
    seed: int
    reached: bool
    compute: int  # trial-epochs up to and including the first report at or above the target
    virtual_s: float  # virtual time of that report (or of the run's end)
    trials: int  # trials started by then
    best: float  # best validation accuracy reported
    reports: list[Report] = field(default_factory=list)
    trial_values: list[str] = field(default_factory=list)  # each trial's sampled values

    def compute_at(self, threshold: float) -> tuple[int, bool]:
        """Trial-epochs up to the first report at or above ``threshold`` (a val_accuracy no
        higher than the run's target), and whether one was; all reports if none was."""
        hit = next((i for i, r in enumerate(self.reports) if r.target_value >= threshold),
                   None)
        return (len(self.reports), False) if hit is None else (hit + 1, True)

    def trace(self) -> list[str]:
        """One line per trial: its values, epochs reported and how it ended."""
        lines = []
        for index, values in enumerate(self.trial_values):
            mine = [r for r in self.reports if r.trial == index]
            last = mine[-1] if mine else None
            curve = " ".join(f"{r.target_value:.3f}" for r in mine[:9])
            lines.append(f"  trial {index:2d} {values:55s} epochs {len(mine):2d} "
                         f"{last.decision if last else 'not run':8s} {curve}"
                         f"{' ...' if len(mine) > 9 else ''}")
        return lines


def tuning_config(strategy: str, seed: int, target: float,
                  search: dict[str, Any] | None = None, concurrent: int | None = None,
                  space: dict[str, Any] | None = None, source: Path = EXAMPLE,
                  epochs: int | None = None) -> Any:
    """The example's tuning config for one strategy and seed (as benchmarks/tuning.py sets it).

    ``search`` overrides keys of the ``search`` section (``first_rung_quorum`` etc.),
    ``concurrent`` the trials at a time (virtual workers), ``space`` the whole search space and
    ``epochs`` the most epochs per trial (both strategies; ASHA's max_t); the config validates
    them (InputError naming the key, in ``source``).
    """
    from hetflow.workloads.tune.config import tuning_config_from_dict

    data = example_data(strategy, seed, search, space)
    data["budget"] = {**data["budget"], "target": target, "time": None}
    if concurrent is not None:
        data["budget"]["concurrent"] = concurrent
    if epochs is not None:
        data["budget"]["epochs"] = epochs
    return tuning_config_from_dict(data, source=str(source))


def _not_run(config: dict[str, Any]) -> None:
    """The Experiment's trainable: the replay trains trials itself, Tune never calls this."""
    raise AssertionError("the replay does not run Tune trials")


def tune_components(config: Any, storage: Path) -> tuple[Any, Any]:
    """The tuner's searcher and scheduler for ``config``, wired as ``tune.run`` wires them.

    Returns ``(search_alg, scheduler)``: a Tune ``SearchAlgorithm`` whose ``next_trial()``
    hands out Tune ``Trial`` objects (None while ``budget.concurrent`` trials are live or the
    budget is used), and the ``TrialScheduler``. ``storage`` is where Tune's Experiment may
    write its marker file.
    """
    from ray.tune.experiment import Experiment
    from ray.tune.search import ConcurrencyLimiter, SearchGenerator, Searcher

    from hetflow.workloads.tune.runner import build_tune_config

    search, budget = config.search, config.budget
    tune_config = build_tune_config(config, budget.concurrent)
    search_alg = tune_config.search_alg
    if isinstance(search_alg, Searcher):
        if tune_config.max_concurrent_trials:
            search_alg = ConcurrencyLimiter(search_alg,
                                            max_concurrent=tune_config.max_concurrent_trials)
        search_alg = SearchGenerator(search_alg)
    param_space = config.search_space.to_tune()
    search_alg.set_search_properties(search.metric, search.mode, param_space)
    scheduler = tune_config.scheduler
    scheduler.set_search_properties(search.metric, search.mode)
    experiment = Experiment(config.name, _not_run, config=param_space,
                            num_samples=budget.trials, storage_path=str(storage))
    search_alg.add_configurations([experiment])
    return search_alg, scheduler


def epoch_seconds(curve: Curve) -> float:
    """Virtual duration of one epoch of a trial."""
    return EPOCH_FIXED_S + STEP_S * curve.steps_per_epoch


def replay(config: Any, curve_for: CurveSource, target: float, storage: Path,
           strategy: str = "", seed: int = 0) -> Outcome:
    """Replay one tuning run of ``config`` with ``budget.concurrent`` virtual workers.

    Each trial's metrics come from ``curve_for(its TrainConfig)``. Stops at the first report
    whose val_accuracy is at least ``target``, or when the searcher has no trial left and
    every trial has ended.
    """
    from ray.tune.schedulers import TrialScheduler

    from hetflow.workloads.tune.trial import TrialSetup

    search_alg, scheduler = tune_components(config, storage)
    setup = TrialSetup(base=config.base.model_dump(mode="json"), space=config.search_space,
                       epochs=config.budget.epochs, threads=config.trial.threads)
    epochs, metric = config.budget.epochs, config.search.metric
    events: list[tuple[float, int, int]] = []  # (virtual time of the report, tie-break, trial)
    tie_break = itertools.count()
    running: dict[int, tuple[Any, Curve, int]] = {}  # trial -> (Tune Trial, curve, epochs)
    reports: list[Report] = []
    trial_values: list[str] = []
    started = 0

    def start_next(now: float) -> None:
        nonlocal started
        trial = search_alg.next_trial()
        if trial is None:  # concurrency limit, or the trial budget is used
            return
        scheduler.on_trial_add(None, trial)
        curve = curve_for(setup.trial_config(trial.config))
        running[started] = (trial, curve, 0)
        trial_values.append(config.search_space.describe(trial.config))
        heapq.heappush(events, (now + TRIAL_START_S + epoch_seconds(curve), next(tie_break),
                                started))
        started += 1

    def outcome(reached: bool, now: float) -> Outcome:
        return Outcome(strategy, seed, reached, len(reports), now, started,
                       max((r.target_value for r in reports), default=math.nan), reports,
                       trial_values)

    for _ in range(config.budget.concurrent):
        start_next(0.0)
    now = 0.0
    while events:
        now, _, index = heapq.heappop(events)
        trial, curve, done = running[index]
        epoch = done + 1
        metrics = curve.metrics(epoch)
        result = {"training_iteration": epoch, "epoch": epoch, "trial_id": trial.trial_id,
                  **metrics}
        if metrics[TARGET_METRIC] >= target:  # the tuner's TargetReached ends the whole run
            reports.append(Report(index, epoch, metrics[metric], metrics[TARGET_METRIC],
                                  "TARGET"))
            return outcome(True, now)
        decision = scheduler.on_trial_result(None, trial, result)
        reports.append(Report(index, epoch, metrics[metric], metrics[TARGET_METRIC], decision))
        if decision != TrialScheduler.STOP:  # Tune's controller: only results that go on
            search_alg.on_trial_result(trial.trial_id, result)
        if decision == TrialScheduler.STOP or epoch >= epochs:
            scheduler.on_trial_complete(None, trial, result)
            search_alg.on_trial_complete(trial.trial_id, result=result)
            del running[index]
            start_next(now)
        else:
            running[index] = (trial, curve, epoch)
            heapq.heappush(events, (now + epoch_seconds(curve), next(tie_break), index))
    return outcome(False, now)


@dataclass(frozen=True)
class Oracle:
    """The fastest of the configurations random search draws on a seed, trained alone: what a
    search that knew in advance which of them to train would pay."""

    epochs: int | None  # epochs it needs to reach the target; None: none of them reaches it
    values: str  # its sampled values ("" when none reaches the target)
    configurations: int  # how many configurations were looked at (the trial budget)


class _Flat:
    """A curve that never improves: lets a replay draw every configuration without training."""

    steps_per_epoch = 1

    def metrics(self, epoch: int) -> dict[str, float]:
        return {"val_accuracy": 0.0, "val_loss": 1.0}


def oracle(config: Any, curve_for: CurveSource, target: float, storage: Path) -> Oracle:
    """:class:`Oracle` for a random-search ``config``: every configuration its whole trial
    budget draws (random draws do not depend on results), each trained until it reaches
    ``target``, or the last epoch, or the best one found so far (no need to train further)."""
    drawn: list[Any] = []

    def capture(train_config: Any) -> Curve:
        drawn.append(train_config)
        return _Flat()

    run = replay(config, capture, math.inf, storage)
    best: tuple[int, str] | None = None
    for values, train_config in zip(run.trial_values, drawn):
        curve = curve_for(train_config)
        limit = config.budget.epochs if best is None else best[0] - 1
        for epoch in range(1, limit + 1):
            if curve.metrics(epoch)[TARGET_METRIC] >= target:
                best = (epoch, values)
                break
    return Oracle(best[0] if best else None, best[1] if best else "", len(drawn))


@dataclass
class SeedResult:
    """Both strategies on one seed, and what replaying them cost."""

    outcomes: list[Outcome]
    epochs_trained: int  # distinct trial-epochs actually trained (shared ones once)
    seconds: float
    oracle: Oracle | None = None


def replay_seed(seed: int, target: float, search: dict[str, Any],
                concurrent: int | None = None, space: dict[str, Any] | None = None,
                with_oracle: bool = False, epochs: int | None = None) -> SeedResult:
    """Random search and ASHA + TPE on one seed, sharing trained curves (and the
    :class:`Oracle` of random search's configurations, with ``with_oracle``)."""
    started = time.perf_counter()
    curves = TrainedCurves()
    outcomes = []
    best = None
    with tempfile.TemporaryDirectory(prefix="hetflow-tuning-replay-") as tmp:
        for strategy in STRATEGIES:
            config = tuning_config(strategy, seed, target, search, concurrent, space,
                                   epochs=epochs)
            outcomes.append(replay(config, curves, target, Path(tmp), strategy, seed))
        if with_oracle:
            config = tuning_config("random", seed, target, search, concurrent, space,
                                   epochs=epochs)
            best = oracle(config, curves, target, Path(tmp))
    return SeedResult(outcomes, curves.epochs_trained, time.perf_counter() - started, best)


def _quiet_worker(threads: int) -> None:
    """Process set-up: the trial's torch thread count, and no library chatter."""
    import torch

    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for name in ("ray.tune", "ray.train"):
        logging.getLogger(name).setLevel(logging.ERROR)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=40, help="how many seeds (default 40)")
    add_search_arguments(parser)
    parser.add_argument("--jobs", type=int, default=1,
                        help="processes replaying seeds side by side (the result is the same)")
    parser.add_argument("--concurrent", type=int,
                        help="trials at a time, i.e. virtual workers (default: the example's)")
    parser.add_argument("--also-at", type=float, nargs="+", default=[], metavar="ACCURACY",
                        help="lower validation accuracies to report the ratio at as well, "
                        "from the same runs (the runs do not depend on where they stop)")
    parser.add_argument("--oracle", action="store_true",
                        help="also train every configuration random search draws, to find "
                        "what the fastest of them alone costs (a perfect pick among them; slower)")
    parser.add_argument("--trace", action="store_true",
                        help="print every trial: its values, epochs and first accuracies")
    args = parser.parse_args()
    if args.seeds < 1 or args.jobs < 1:
        parser.error("--seeds and --jobs must be at least 1")
    if any(t > args.target for t in args.also_at):
        parser.error(f"--also-at takes accuracies no higher than --target ({args.target}): "
                     "a run stops at its target")
    search = {key: getattr(args, key) for key in SEARCH_KEYS if getattr(args, key) is not None}
    try:  # the config's own checks, before any seed runs
        space = None if args.space is None else read_space(args.space)
        config = tuning_config("asha+tpe", args.first_seed, args.target, search,
                               args.concurrent, space, args.space or EXAMPLE, args.epochs)
    except InputError as exc:
        parser.error(str(exc))
    threads = config.trial.threads
    _quiet_worker(threads)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    started = time.perf_counter()
    results: list[SeedResult] = []
    if args.jobs == 1:
        runs = (replay_seed(s, args.target, search, args.concurrent, space, args.oracle,
                            args.epochs) for s in seeds)
        _print_seeds(runs, results, args.trace)
    else:
        with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn"),
                                 initializer=_quiet_worker, initargs=(threads,)) as pool:
            runs = pool.map(replay_seed, seeds, itertools.repeat(args.target),
                            itertools.repeat(search), itertools.repeat(args.concurrent),
                            itertools.repeat(space), itertools.repeat(args.oracle),
                            itertools.repeat(args.epochs))
            _print_seeds(runs, results, args.trace)
    return _report(results, config, args, time.perf_counter() - started)


def _print_seeds(runs: Any, results: list[SeedResult], trace: bool) -> None:
    for result in runs:
        results.append(result)
        for o in result.outcomes:
            flag = "" if o.reached else "  NOT REACHED (every epoch counted)"
            print(f"seed {o.seed:3d} {o.strategy:8s}: {o.compute:4d} trial-epochs "
                  f"{o.virtual_s:6.1f} virtual s  trials started {o.trials:2d}  "
                  f"best {o.best:.4f}{flag}", flush=True)
            if trace:
                print("\n".join(o.trace()))
        if result.oracle is not None:
            best = result.oracle
            print(f"seed {result.outcomes[0].seed:3d} oracle  : "
                  + (f"{best.epochs:4d} epochs, the fastest of {best.configurations} random "
                     f"configurations: {best.values}" if best.epochs is not None else
                     f"none of {best.configurations} random configurations reaches the target"),
                  flush=True)
        print(f"         ({result.seconds:.1f} s, {result.epochs_trained} epochs trained)",
              flush=True)


def _report(results: list[SeedResult], config: Any, args: argparse.Namespace,
            seconds: float) -> int:
    by = {s: [o for r in results for o in r.outcomes if o.strategy == s] for s in STRATEGIES}
    asha, rand = by["asha+tpe"], by["random"]
    ratio = statistics.mean(o.compute for o in asha) / statistics.mean(o.compute for o in rand)
    per_seed = [a.compute / r.compute for a, r in zip(asha, rand)]
    search, budget = config.search, config.budget
    reported = sum(o.compute for o in asha + rand)
    trained = sum(r.epochs_trained for r in results)
    print()
    print(setup_line(args, budget.trials, budget.epochs, budget.concurrent,
                     {key: getattr(search, key) for key in SEARCH_KEYS},
                     args.space or EXAMPLE))
    for name, runs in by.items():
        computes = [o.compute for o in runs]
        spread = statistics.stdev(computes) / math.sqrt(len(computes)) if len(runs) > 1 else 0
        print(f"{name:8s}: mean {statistics.mean(computes):6.1f} trial-epochs "
              f"(+- {spread:.1f} standard error), median {statistics.median(computes):5.1f}, "
              f"mean virtual {statistics.mean(o.virtual_s for o in runs):5.1f} s; "
              f"reached {sum(o.reached for o in runs)}/{len(runs)}")
    print(f"geometric mean of per-seed ratios asha+tpe/random: {geomean(per_seed):.3f}")
    for threshold in sorted(args.also_at):
        costs = {name: [o.compute_at(threshold) for o in runs] for name, runs in by.items()}
        means = {name: statistics.mean(c for c, _ in pairs) for name, pairs in costs.items()}
        reached = {name: sum(hit for _, hit in pairs) for name, pairs in costs.items()}
        print(f"at val accuracy >= {threshold}: random {means['random']:.1f} trial-epochs "
              f"(reached {reached['random']}/{len(rand)}), asha+tpe {means['asha+tpe']:.1f} "
              f"({reached['asha+tpe']}/{len(asha)}), ratio "
              f"{means['asha+tpe'] / means['random']:.3f}")
    oracles = [r.oracle for r in results if r.oracle is not None]
    if oracles:
        epochs = [o.epochs if o.epochs is not None else budget.epochs for o in oracles]
        floor = statistics.mean(epochs)
        mean_random = statistics.mean(o.compute for o in rand)
        print(f"oracle  : the fastest of random search's {oracles[0].configurations} "
              f"configurations, trained alone, reaches the target in {floor:.1f} epochs on "
              f"average (reached {sum(o.epochs is not None for o in oracles)}/{len(oracles)}): "
              f"{floor / mean_random:.3f} of random search's mean alone, "
              f"{budget.concurrent * floor / mean_random:.3f} if the other "
              f"{budget.concurrent - 1} worker(s) trained as many epochs beside it")
    shared = ("the oracle's included" if oracles else
              f"{reported - trained} shared between the strategies")
    print(f"replayed {reported} trial-epochs, trained {trained} ({shared}) in {seconds:.0f} s "
          f"with {args.jobs} process(es)")
    if not all(o.reached for o in asha + rand):
        print("WARNING: some runs did not reach the target; every epoch they ran was counted")
    print(f"RESULT replay_asha_over_random_compute={ratio:.3f} replay_seeds={len(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
