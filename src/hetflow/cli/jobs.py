"""``hetflow submit | status | cancel | logs``: jobs on a cluster run by the hetflow controller.

    hetflow submit examples/jobs/digits-train.yaml            # prints the job id at once
    hetflow submit job.yaml --address 10.0.0.1:6379 --policy hetflow
    hetflow status                    # the queue, running jobs and their devices, why others wait
    hetflow status digits-3 --json    # one job's record, for scripts
    hetflow cancel digits-3
    hetflow logs digits-3 --tail 20   # the last 20 lines; -f keeps printing until the job ends
    hetflow submit job.yaml --wait    # print its output until it ends; exit 0/1/4 by its outcome

Without ``--address`` the local running cluster is used (``ray start --head`` or ``hetflow node
start`` started it). The first submit starts the controller (a detached Ray actor; see
docs/controller.md); ``--policy``/``--round-s`` apply when it starts, or change it when given
later. Each attempt also shows in Ray's own tooling, as the Ray job ``hetflow-<job id>-<attempt>``
(``ray job list``, ``ray job logs``, the dashboard; docs/controller.md). Exit codes
(docs/cli.md): 0 success, 2 bad input (bad job file, no cluster, unknown job), 3 a job that can
never fit this cluster (the message says why); ``submit --wait``: the job's outcome, 0 succeeded,
1 failed, 4 cancelled.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from hetflow.core.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--address", help="Ray cluster (host:port or ray://host:10001); "
                                          "default: the local running cluster")

    p = sub.add_parser("submit", parents=[common], help="queue a job on the cluster; prints its id",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", metavar="JOB.yaml", help="job file (docs/controller.md)")
    p.add_argument("--policy", help="cluster policy (fifo, srtf, las, max_min_fairness, hetflow, "
                                    "bestfit); default hetflow when the controller starts")
    p.add_argument("--round-s", type=float, help="round length of preemptive policies, seconds")
    p.add_argument("--json", action="store_true", help="print the job's record as JSON")
    p.add_argument("--wait", action="store_true",
                   help="stay until the job ends, printing its output (as `ray job submit`), and exit with "
                        "its outcome: 0 succeeded, 1 failed, 4 cancelled")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would be queued and, with a running cluster, whether and where it "
                        "could run; queue nothing, start no controller")
    p.set_defaults(func=run_submit)

    p = sub.add_parser("status", parents=[common], help="queue, running jobs and their devices, "
                       "why each waiting job waits", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", nargs="?", metavar="JOB", help="one job (default: all)")
    p.add_argument("--json", action="store_true", help="print the records as JSON")
    p.set_defaults(func=run_status)

    p = sub.add_parser("cancel", parents=[common], help="cancel a job (a running one is stopped)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", metavar="JOB")
    p.set_defaults(func=run_cancel)

    p = sub.add_parser("logs", parents=[common], help="a job's output (every attempt)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", metavar="JOB")
    p.add_argument("--tail", type=int, default=None, metavar="N",
                   help="only the last N lines (default: all that is kept, up to the last 64 KiB)")
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing the output as it comes, until the job ends (every attempt)")
    p.set_defaults(func=run_logs)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.policy:
        from hetflow.scheduling.policies.registry import make_policy

        make_policy(args.policy)  # InputError with the known names
        out["policy"] = args.policy
    if args.round_s is not None:
        out["round_s"] = args.round_s
    return out


def run_submit(args: argparse.Namespace) -> int:
    from hetflow.control import client
    from hetflow.control.jobspec import load_job

    spec = load_job(args.job)  # a bad file fails before any connection
    settings = _settings(args)
    if args.dry_run:
        return dry_run_submit(spec, args.address, settings, args.json)
    with client.connect(args.address):
        if settings:
            client.configure(settings)
        record = client.submit(spec, settings or None)
        if not args.json:
            print(record["job_id"], flush=True)
            print(f"  {record['status']}: {record['reason']}", file=sys.stderr, flush=True)
        if args.wait:
            record = _wait(record["job_id"], quiet=args.json)
    if args.json:
        print(json.dumps(record, indent=2))
    return client.EXIT_BY_STATUS.get(record["status"], 1) if args.wait else 0


def _wait(job_id: str, quiet: bool) -> dict[str, Any]:
    """Follow the job to its end (its output on stdout unless ``quiet``); its final record."""
    from hetflow.control import client

    write = (lambda text: None) if quiet else _writer()
    try:
        record = client.follow(job_id, write)
    except KeyboardInterrupt:
        print(f"hetflow: stopped waiting; {job_id} keeps running (`hetflow cancel {job_id}` stops it)",
              file=sys.stderr)
        raise
    print(f"{job_id}: {record['status']} - {record['reason']}", file=sys.stderr, flush=True)
    return record


def _writer() -> Any:
    def write(text: str) -> None:
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
    return write


def describe_job(spec: Any) -> list[tuple[str, str]]:
    """What a job would ask for and run, as ``key: value`` lines (``submit --dry-run``)."""
    import shlex

    if spec.kind == "train":
        config = spec.train_config()
        layout = config.layout
        what = (f"training {config.name}: dp {layout.dp} x pp {layout.pp} x tp {layout.tp} ranks, "
                f"{config.train.steps} steps, checkpoints in {config.checkpoint_dir}")
    elif spec.kind == "launch":
        job = spec.launch
        what = f"{job.nproc} rank(s) of `{job.script or '-m ' + str(job.module)}` (hetflow launch)"
    elif spec.kind == "python":
        py = spec.python
        what = "`" + shlex.join(["python", py.script] + list(py.args) if py.script else
                                 ["python", "-c", "<call>", str(py.entrypoint)] + list(py.args)) + "`"
    else:
        what = f"`hetflow tune {spec.tune} --address auto`"
    if spec.cpu_only:
        memory = f", {spec.memory}" if spec.memory else ""
        ask = f"{spec.job_cpus:g} CPUs{memory} on one node, no accelerator"
    else:
        d = spec.devices
        kinds = " ".join(x for x in (d.vendor, d.model) if x) or "any"
        ask = (f"{spec.num_devices} device(s) ({kinds}" + (f", {d.memory} each" if d.memory else "")
               + f"), {spec.cpus_per_device:g} CPU(s) per device")
        if spec.is_elastic:
            ask += (f"; elastic: runs on {' or '.join(map(str, spec.sizes))} devices "
                    f"(scaling {d.scaling or 'eff:0.85'}), resized through its checkpoint")
        if spec.goodput is not None:  # goodput-adaptive: each size's batch and step's worth
            choices = {n: spec.goodput_batch(n) for n in spec.sizes}
            ask += "; global batch " + ", ".join(
                f"{c.batch_size} on {n} (a step worth {c.gain:.2f} of {spec.goodput.batch_size})"
                for n, c in choices.items() if c is not None)
    work = "open-ended" if spec.total_work == float("inf") else (
        f"{spec.total_work:g} {'seconds' if spec.work.seconds is not None else 'steps'}")
    if spec.goodput is not None and spec.work.seconds is None:
        train = spec.train_config().train
        work = (f"{spec.total_work * train.step_gain:g} steps of the reference batch {spec.goodput.batch_size}"
                f" ({spec.total_work:.1f} of its batch {train.batch_size} at {spec.num_devices} devices)")
    return [("job", f"{spec.name} ({spec.kind}); its id would be {spec.name}-N"), ("runs", what),
            ("asks for", ask), ("work", work),
            ("preemptible", "yes" if spec.is_preemptible else "no"),
            ("attempts", f"at most {spec.max_attempts} failures")]


def dry_run_submit(spec: Any, address: str | None, settings: dict[str, Any], as_json: bool) -> int:
    """What ``submit`` would queue; with a cluster running (``--address``, RAY_ADDRESS or the one
    ``ray start`` recorded), the controller's own admission check on it - which device types could
    run the job, or exit 3 with why none can. No controller is started and nothing is queued."""
    from hetflow.cli.dryrun import show
    from hetflow.runtime.session import check_reachable, effective_address

    lines = describe_job(spec)
    data: dict[str, Any] = {"job": spec.model_dump(mode="json"), "cluster": None, "could_run_on": None}
    target, source = effective_address(address or "auto")
    if target in (None, "auto"):
        lines.append(("cluster", "none given or recorded: not checked (submit needs a running cluster; "
                                 "`ray start --head` or `hetflow node start` starts one)"))
        return show(lines, data, as_json)
    check_reachable(address, default="auto")
    from hetflow.control import client
    from hetflow.control.controller import settings_from
    from hetflow.control.hosts import host_view
    from hetflow.control.scheduler import LiveScheduler

    with client.connect(address):
        import ray
        from ray.util import placement_group_table

        from hetflow.runtime.binding import live_snapshot

        config = settings_from(None, settings)
        view = host_view(live_snapshot(config.inter_node_gbps), ray.nodes(), placement_group_table())
        rates = LiveScheduler(config).admit(spec, view.snapshot)  # Unschedulable (exit 3): never fits
    lines.append(("cluster", f"{target} (from {source}): {len(view.snapshot.nodes)} node(s)"))
    lines.append(("could run on", ", ".join(f"{t} ({r:g} work/s)" for t, r in sorted(rates.items()))))
    lines.append(("policy", f"{config.policy} decides when and where (a running controller keeps its own)"))
    data.update(cluster={"address": target, "source": source, "nodes": [n.name for n in view.snapshot.nodes]},
                could_run_on=rates, policy=config.policy)
    return show(lines, data, as_json)


def run_status(args: argparse.Namespace) -> int:
    from hetflow.control import client

    with client.connect(args.address):
        records = client.status(args.job)
    if args.json:
        print(json.dumps(records if args.job is None else records[0], indent=2))
    elif args.job is not None:
        print(format_job(records[0]))
    else:
        print(format_table(records))
    return 0


def run_cancel(args: argparse.Namespace) -> int:
    from hetflow.control import client

    with client.connect(args.address):
        record = client.cancel(args.job)
    print(f"{record['job_id']}: {record['status']} - {record['reason']}")
    return 0


def run_logs(args: argparse.Namespace) -> int:
    from hetflow.control import client

    if args.tail is not None and args.tail < 0:
        raise InputError(f"--tail {args.tail}: give a number of lines >= 0")
    with client.connect(args.address):
        if args.follow:  # the tail, then on from exactly where it ended
            shown = client.logs_at(args.job, lines=args.tail)
            _writer()(shown["text"])
            client.follow(args.job, _writer(), after=shown)
            return 0
        text = client.logs(args.job, lines=args.tail)
    sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    return 0


def format_table(records: list[dict[str, Any]]) -> str:
    """One line per job: id, status, devices, progress, reason (newest jobs last)."""
    if not records:
        return "no jobs yet; `hetflow submit JOB.yaml` queues one"
    rows = [("JOB", "STATUS", "DEVICES", "STEP", "REASON")]
    for r in records:
        step = "" if r.get("progress_step") is None else str(r["progress_step"])
        devices = r.get("devices") or "-"
        if r.get("sizes") and r.get("resizes"):  # an elastic job resized through its checkpoint
            devices += f" (resized {r['resizes']}x)"
        rows.append((r["job_id"], r["status"], devices, step, r["reason"]))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4] for row in rows)


def format_job(r: dict[str, Any]) -> str:
    """One job in detail: its state, devices, attempts and history."""
    lines = [f"{r['job_id']}  {r['status']}  ({r['spec'].get('kind')} job, submitted "
             f"{time.strftime('%H:%M:%S', time.localtime(r['submitted_at']))})",
             f"  now: {r['reason']}"]
    if r.get("devices"):
        lines.append(f"  devices: {r['devices']}")
    if r.get("sizes"):
        now = f"{r['size']} now" if r.get("size") is not None else "not started"
        lines.append(f"  size: {now}, sizes {' '.join(map(str, r['sizes']))} (elastic), "
                     f"{r.get('resizes', 0)} resize(s)")
    if r.get("progress_step") is not None:
        lines.append(f"  step: {r['progress_step']}")
    for run in r.get("runs", []):
        # "where" (a CPU job's CPUs and node) is in runs recorded since CPU jobs exist
        devices = run.get("where") or " ".join(f"{n}:{d}" for n, d in run["devices"])
        steps = (f", steps {run.get('start_step')} -> {run.get('end_step')}"
                 if run.get("end_step") is not None else "")
        kind = "" if run.get("where") else f"{run['device_type']} "
        lines.append(f"  attempt {run['token']}: {kind}{devices}: "
                     f"{run.get('outcome') or 'running'}{steps}")
    lines.append("  history:")
    for when, event in r.get("history", [])[-10:]:
        lines.append(f"    {time.strftime('%H:%M:%S', time.localtime(when))}  {event}")
    return "\n".join(lines)
