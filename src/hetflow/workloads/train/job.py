"""``run_training(config) -> TrainResult``: a whole training job on Ray, with recovery.

    from hetflow.workloads.train.config import load_config
    from hetflow.workloads.train.job import run_training
    result = run_training(load_config("examples/train_digits.yaml"))
    print(result.metrics["val_accuracy"])

The job runs attempts until one finishes. Each attempt is a fresh ``group.RankGroup`` (the actor group of
``hetflow.train.run``) running the built-in ``loop.train_func``, which
resumes from the newest complete checkpoint. When a worker process dies (or its peers lose
it), the group is torn down and a new attempt starts, up to ``resources.max_failures`` times;
then the job fails with :class:`TrainingFailed`, saying where the last checkpoint is. An error
raised by the training code itself fails the job at once (a restart would repeat it).

With ``resources.elastic``, a restart whose full layout no longer fits (a node is gone) runs
with fewer data-parallel replicas instead: the global batch and its order stay the same, so
the loss curve continues as before, only slower.

At the end the final checkpoint is loaded into a single-device model in this process and
evaluated on the validation split (the metrics its model spec reports): this also
checks that the checkpoint is whole. The checkpoint directory must therefore be reachable from
this process and every worker (as DCP needs anyway on several nodes).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from hetflow.core.errors import HetflowError, Unschedulable
from hetflow.workloads.train.checkpoint import CheckpointInfo, latest_checkpoint
from hetflow.workloads.train.config import TrainConfig, with_dp
from hetflow.workloads.train.loop import RankResult, loss_records, train_func

ProgressCallback = Callable[[dict[str, Any], "TrainingJob"], None]


class TrainingFailed(HetflowError):
    """The job gave up: too many worker failures, or an error in the training code."""


@dataclass
class TrainResult:
    """What a finished job did."""

    name: str
    steps: int  # optimizer steps done (train.steps; fewer with train.step_gain > 1)
    losses: dict[int, float]  # step -> global mean training loss, every step of the job
    metrics: dict[str, float]  # validation metrics from the final checkpoint
    checkpoint: str  # the final checkpoint's directory
    restarts: int  # attempts that failed and were restarted
    failures: list[str]  # why each failed attempt failed
    samples_per_s: float | None  # last attempt, after warm-up
    startup_s: float  # run_training called -> first step done (first attempt)
    recovery_s: list[float]  # per restart: failure noticed -> first step of the next attempt
    wall_s: float
    layout: dict[str, int]  # the layout of the last attempt (dp may have shrunk)
    placement: str  # how the last attempt was placed
    ranks: list[RankResult] = field(default_factory=list)  # the last attempt's ranks

    @property
    def final_loss(self) -> float:
        return self.losses[max(self.losses)]


class TrainingJob:
    """A training job's supervisor; ``run()`` blocks until it finishes or fails.

    ``on_progress(record, job)`` is called in this process for each loss record rank 0 sends
    (``step``, ``loss``, ``time``, ``attempt``); ``job.worker_pids`` are the current attempt's
    rank processes (rank order).
    """

    def __init__(self, config: TrainConfig, on_progress: ProgressCallback | None = None,
                 data: Any | None = None, tracker: Any | None = None) -> None:
        self.config = config
        self.on_progress = on_progress
        self.data = data  # ObjectRef of prepared split arrays, or None
        self.tracker = tracker  # a hetflow.runtime.tracking.Tracker to log into, or None
        self._placements: list[dict[str, Any]] = []  # each attempt's placement (tracking)
        self.records: list[dict[str, Any]] = []
        self.worker_pids: list[int] = []
        self.attempt = 0
        self._progress: Any = None
        self._how = ""  # how the current attempt was placed
        self._seen = 0  # rank 0's reports read so far

    def run(self) -> TrainResult:
        """The job to its end; with tracking on (``config.tracking`` or a given tracker) it is
        logged as an MLflow run (:func:`log_training_start`, :func:`log_training_result`)."""
        import ray

        from hetflow.runtime.tracking import Tracker, status_of

        own = None
        if self.tracker is None and self.config.tracking.mlflow is not None:
            own = self.tracker = Tracker.start(self.config.tracking.mlflow, self.config.name,
                                               kind="train")
        if self.tracker is not None:
            log_training_start(self.tracker, self.config)
        started_ray = False
        failure: BaseException | None = None
        try:
            if not ray.is_initialized():
                ray.init(address=self.config.resources.ray_address, log_to_driver=True)
                started_ray = True
            result = self._run()
            if self.tracker is not None:
                log_training_result(self.tracker, result, self.config)
            return result
        except BaseException as exc:
            failure = exc
            raise
        finally:
            if own is not None:
                own.finish(status_of(failure))
            if self._progress is not None:
                self._progress.close()
                self._progress = None
            if started_ray:
                ray.shutdown()

    def _run(self) -> TrainResult:
        import ray

        from hetflow.workloads.train.api import progress_log
        from hetflow.workloads.train.group import TrainingCodeError, WorkerFailure

        t0 = time.time()
        config = self.config
        self._progress = progress_log()
        failures: list[str] = []
        failed_at: list[float] = []
        while True:
            group = None
            try:
                config, group = self._start(config, failures)
                self.worker_pids = group.pids
                self._track_placement(group)
                ranks = group.run(train_func, {"config": config, "data": self.data},
                                  {"checkpoint_dir": str(config.checkpoint_dir)}, self._progress,
                                  tick=self._poll)
                for result, where in zip(ranks, group.where):
                    result.node_id = where["node_id"]
                break
            except WorkerFailure as exc:
                failed_at.append(time.time())
                failures.append(str(exc))
                if len(failures) > config.resources.max_failures:
                    raise TrainingFailed(self._gave_up(failures)) from None
            except TrainingCodeError as exc:
                raise TrainingFailed(f"job {config.name}: {exc}; fix the cause and run again "
                                     "(completed checkpoints are kept and resumed)") from None
            finally:
                if group is not None:
                    group.shutdown()
                self.worker_pids = []
            self.attempt += 1
        self._poll()
        return self._result(config, ranks, failures, failed_at, t0)

    def _start(self, config: TrainConfig, failures: list[str]) -> tuple[TrainConfig, Any]:
        """Start the attempt's group; with ``elastic``, shrink dp until it fits after a failure."""
        from hetflow.workloads.train.group import RankGroup

        candidates = [config]
        if failures and config.resources.elastic:
            candidates += smaller_layouts(config)
        for i, candidate in enumerate(candidates):
            group = RankGroup(candidate.layout.parallel, candidate.resources, candidate.name,
                              self.attempt)
            try:
                group.start()
                self._how = group.how
                return candidate, group
            except Unschedulable:
                group.shutdown()
                if i == len(candidates) - 1:
                    raise
            except BaseException:
                group.shutdown()
                raise
        raise AssertionError("unreachable")

    def _arrays(self) -> Any | None:
        """The prepared split's arrays in this process (mapped from the object store)."""
        if self.data is None:
            return None
        import ray

        return ray.get(self.data) if isinstance(self.data, ray.ObjectRef) else self.data

    def _poll(self) -> None:
        new = self._progress.since(self._seen)
        self._seen += len(new)
        records = loss_records(new)
        for record in records:
            self.records.append(record)
            if self.on_progress is not None:
                self.on_progress(record, self)
        if self.tracker is not None and records:  # queued: the tracker's thread logs them
            self.tracker.log_metric_rows([(r["step"], {"train_loss": r["loss"]}) for r in records])

    def _track_placement(self, group: Any) -> None:
        """Each attempt's placement: a tag (the planner's explanation) and ``placement.json``
        (every attempt: which node, process and devices each rank got)."""
        if self.tracker is None:
            return
        self._placements.append({"attempt": self.attempt, "how": group.how,
                                 "ranks": [{"rank": r, **w} for r, w in enumerate(group.where)]})
        self.tracker.set_tags({"hetflow.placement": group.how, "hetflow.attempt": self.attempt})
        self.tracker.log_dict({"attempts": self._placements}, "placement.json")

    def _gave_up(self, failures: list[str]) -> str:
        info = latest_checkpoint(self.config.checkpoint_dir)
        where = (f"the last complete checkpoint is step {info.step} in {info.path}"
                 if info else f"no checkpoint was completed in {self.config.checkpoint_dir}")
        return (f"job {self.config.name} failed {len(failures)} times, more than "
                f"resources.max_failures={self.config.resources.max_failures} allows "
                f"(last: {failures[-1]}); {where}. Run the same config again to resume from it, "
                "or raise resources.max_failures")

    def _result(self, config: TrainConfig, ranks: list[RankResult], failures: list[str],
                failed_at: list[float], t0: float) -> TrainResult:
        rank0 = ranks[0]
        info = latest_checkpoint(config.checkpoint_dir)
        # the last step: train.steps, or fewer where each step counts more (train.step_gain)
        assert info is not None and info.step == rank0.end_step and \
            float(info.meta.get("progress", info.step)) >= config.train.steps - 1e-6, "the final checkpoint is missing"
        first_steps = {}
        for record in self.records:
            first_steps.setdefault(record["attempt"], record["time"])
        recovery = [first_steps[a + 1] - failed_at[a] for a in range(len(failed_at))
                    if a + 1 in first_steps]
        layout = config.layout
        return TrainResult(
            name=config.name,
            steps=rank0.end_step,
            losses=dict(sorted(rank0.losses.items())),
            metrics=evaluate_checkpoint(config, info, data=self._arrays()),
            checkpoint=str(info.path),
            restarts=len(failures),
            failures=failures,
            samples_per_s=rank0.samples_per_s,
            startup_s=(first_steps.get(0, rank0.first_step_at or t0) - t0),
            recovery_s=recovery,
            wall_s=time.time() - t0,
            layout={"dp": layout.dp, "pp": layout.pp, "tp": layout.tp},
            placement=self._how,
            ranks=ranks,
        )


def log_training_start(tracker: Any, config: TrainConfig) -> None:
    """A training run's parameters (the config's sections, flattened: ``train.lr``,
    ``layout.dp``, ...) and, with artifacts on, the config itself (``config.yaml``)."""
    data = config.model_dump(mode="json", exclude={"tracking"})
    tracker.log_params(data)
    if tracker.target.artifacts:
        tracker.log_dict(data, "config.yaml")


def log_training_result(tracker: Any, result: TrainResult, config: TrainConfig) -> None:
    """The end of a training run: validation metrics, throughput, restarts at the last step;
    every rank's node, device and process (``placement.json``, ``ranks``); the final checkpoint
    (artifacts ``checkpoint/``)."""
    numbers = {**result.metrics, "samples_per_s": result.samples_per_s,
               "startup_s": result.startup_s, "wall_s": result.wall_s,
               "restarts": result.restarts, "final_train_loss": result.final_loss}
    tracker.log_metrics(numbers, step=result.steps)
    ranks = [{"rank": r.rank, "host": r.host, "node_id": r.node_id, "pid": r.pid,
              "device": r.device, "backend": r.backend, "runtime": r.runtime,
              "visible_devices": r.visible_devices} for r in result.ranks]
    tracker.log_dict({"how": result.placement, "layout": result.layout, "ranks": ranks},
                     "ranks.json")
    tracker.set_tags({"hetflow.placement": result.placement,
                      "hetflow.layout": "x".join(f"{k}{v}" for k, v in result.layout.items())})
    tracker.log_artifacts(result.checkpoint, "checkpoint")


def smaller_layouts(config: TrainConfig) -> list[TrainConfig]:
    """The same job with fewer data-parallel replicas, largest first, where the global batch
    still splits evenly (over replicas, and over microbatches with a pipeline)."""
    shrunk = (with_dp(config, dp) for dp in range(config.layout.dp - 1, 0, -1))
    return [c for c in shrunk if c is not None]


def evaluate_checkpoint(config: TrainConfig, info: CheckpointInfo,
                        max_samples: int | None = None,
                        data: Any | None = None) -> dict[str, float]:
    """Validation metrics of a checkpoint, on one CPU device in this process (over the first
    ``max_samples`` validation samples when given; on ``data``'s split arrays when given)."""
    from hetflow.workloads.train.checkpoint import load_model_weights
    from hetflow.workloads.train.data import dataset_from_arrays, load_split
    from hetflow.workloads.train.models import build_model, model_spec

    model = build_model(config)
    load_model_weights(info, model)
    model.eval()
    dataset = (dataset_from_arrays(config.dataset, data) if data is not None else
               load_split(config))
    val = dataset.val
    count_limit = len(val) if max_samples is None else min(len(val), max_samples)
    return model_spec(config).evaluate(model, val.inputs[:count_limit], val.targets[:count_limit],
                                       batch=256)


def run_training(config: TrainConfig, on_progress: ProgressCallback | None = None,
                 data: Any | None = None, tracker: Any | None = None) -> TrainResult:
    """Run ``config`` on Ray (joining ``resources.ray_address``, or a local Ray) to the end.

    ``data``: an ObjectRef of the split's arrays (keys ``SPLIT_KEYS`` of
    :mod:`hetflow.workloads.train.data`) already in Ray's object store - e.g. a workflow's
    prepare stage. Every rank then maps those arrays instead of loading ``config.dataset``
    itself. They must be the split ``config.data`` describes (the final evaluation uses it too).

    ``tracker``: log into this MLflow run (a workflow's stage run); without it, a config with
    ``tracking.mlflow`` gets a run of its own.
    """
    from hetflow.runtime.session import ray_loopback_mode

    ray_loopback_mode(config.resources.ray_address)
    return TrainingJob(config, on_progress, data, tracker).run()


__all__ = ["TrainResult", "TrainingFailed", "TrainingJob", "evaluate_checkpoint",
           "log_training_result", "log_training_start", "run_training", "smaller_layouts"]
