"""``hetflow top``: a live view of a Ray cluster's devices and jobs, with bottleneck hints.

    hetflow top                          # connect to the local cluster, refresh every 2 s
    hetflow top --address HEAD:6379      # another cluster
    hetflow top --once                   # print one frame and exit (for scripts and logs)
    hetflow top --once --json            # the same data as JSON

The first call starts hetflow's metrics agents (one per node, see
``hetflow.runtime.metrics``) where they are not running yet; they keep running after ``top``
exits, so Prometheus keeps its series. ``--no-start`` only reads; ``--stop-agents`` removes them.
Devices show the measured utilisation, memory, power and NVLink/xGMI traffic and the job that
holds them; jobs show what they reported through ``report_job_metrics`` (samples/s, step
time, achieved vs catalog peak TFLOP/s). Hints name a job whose tensor-parallel group spans a
slow link, or whose devices sit idle. A sample older than ``--stale`` seconds shows as ``?``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from hetflow.core.errors import InputError

GIB = 1 << 30


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("top", help="live view of devices and jobs on a Ray cluster, with bottleneck hints",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", help="Ray address (default: the local cluster, as `ray.init('auto')`)")
    p.add_argument("--interval", type=float, default=2.0, metavar="S",
                   help="seconds between refreshes (and the agents' sampling period when they are started)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--json", action="store_true", help="with --once: print the frame's data as JSON")
    p.add_argument("--no-start", action="store_true", help="do not start missing metrics agents")
    p.add_argument("--stop-agents", action="store_true",
                   help="stop hetflow's metrics agents and cluster exporter, then exit")
    p.add_argument("--stale", type=float, default=None, metavar="S",
                   help="treat samples older than this as missing (default: max(30, 3 x interval))")
    p.set_defaults(func=run)


# ---------------------------------------------------------------------------- formatting


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _gib(x: int | None) -> str:
    return "-" if x is None else f"{x / GIB:.1f}"


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e9:.2f}"


def _num(x: float | None, fmt: str = "{:,.1f}") -> str:
    return "-" if x is None or not math.isfinite(x) else fmt.format(x)


def _where(devices) -> str:
    per_node: dict[str, list[int]] = {}
    for ref in devices:
        per_node.setdefault(ref.node, []).append(ref.device)
    return " + ".join(f"{n} [{' '.join(map(str, sorted(ix)))}]" for n, ix in per_node.items())


def device_rows(view) -> list[dict[str, Any]]:
    """One row per device of every hetflow node, then per sampled device of other Ray nodes."""
    from hetflow.runtime.measures import fresh_sample

    holder: dict[tuple[str, int], list[str]] = {}
    for job, refs in view.job_devices.items():
        for ref in refs:
            holder.setdefault((ref.node, ref.device), []).append(job)
    rows = []
    for node in view.snapshot.nodes:
        for device in node.devices:
            sample = fresh_sample(view.samples, node.name, device.index, device.vendor,
                                  view.timestamp, view.stale_after_s)
            rows.append(_row(node.name, device.index, device.model or device.name, sample,
                             holder.get((node.name, device.index), [])))
    known = {n.name for n in view.snapshot.nodes}
    for name, sample in sorted(view.samples.items()):
        if name in known or view.timestamp - sample.timestamp > view.stale_after_s:
            continue
        for d in sample.devices:
            rows.append(_row(name, d.device, d.name, d, []))
    return rows


def _row(node: str, index: int, model: str | None, sample, jobs: list[str]) -> dict[str, Any]:
    return {
        "node": node, "device": index, "model": model,
        "sampled": sample is not None,
        "utilisation": sample.utilisation if sample else None,
        "memory_used_bytes": sample.memory_used_bytes if sample else None,
        "memory_total_bytes": sample.memory_total_bytes if sample else None,
        "power_watts": sample.power_watts if sample else None,
        "link_fabric": sample.link_fabric if sample else None,
        "link_rx_bytes_per_s": sample.link_rx_bytes_per_s if sample else None,
        "link_tx_bytes_per_s": sample.link_tx_bytes_per_s if sample else None,
        "jobs": jobs,
    }


def job_rows(view) -> list[dict[str, Any]]:
    rows = []
    for job, devices in view.job_devices.items():
        record = view.jobs.get(job)
        rows.append({
            "job": job, "devices": len(devices), "where": _where(devices),
            "samples_per_s": record.samples_per_s if record else None,
            "step_time_s": record.step_time_s if record else None,
            "achieved_tflops": record.achieved_tflops if record else None,
            "peak_tflops": record.peak_tflops if record else None,
            "effective_ratio": record.effective_ratio if record else None,
            "reported_s_ago": view.timestamp - record.timestamp if record else None,
        })
    return rows


def _ask_front_doors(method: str, timeout_s: float) -> dict[str, Any]:
    """Every serving application's front door asked ``method`` at once: app -> its answer.
    One that does not answer within ``timeout_s`` (a busy node: a new driver's first call to an
    actor can take seconds) is named on stderr rather than silently left out."""
    import ray

    from hetflow.workloads.serve.web import front_name

    prefix = front_name("")
    calls: dict[Any, str] = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name, namespace = entry.get("name", ""), entry.get("namespace")
        if namespace != "serve" or not name.startswith(prefix):
            continue
        try:
            calls[getattr(ray.get_actor(name, namespace="serve"), method).remote()] = name[len(prefix):]
        except Exception:  # noqa: BLE001 - a front door stopping, or of an older hetflow
            continue
    done, pending = ray.wait(list(calls), num_returns=len(calls), timeout=timeout_s) if calls else ([], [])
    out: dict[str, Any] = {}
    for ref in done:
        try:
            out[calls[ref]] = ray.get(ref)
        except Exception:  # noqa: BLE001 - it stopped while asked, or has no such method
            continue
    for ref in pending:
        print(f"hetflow top: the front door of {calls[ref]!r} did not answer in {timeout_s:.0f} s; "
              "its upstreams and LLM pools are not shown", file=sys.stderr)
    return out


def upstream_rows(timeout_s: float = 20.0) -> list[dict[str, Any]]:
    """Every serving application's upstream providers, from its front door's HAProxy counters:
    requests, errors, mean response ms of the last 1,024, up (health checks passing)."""
    rows = [{"app": app, "upstream": u, **st}
            for app, stats in _ask_front_doors("upstream_stats", timeout_s).items()
            for u, st in sorted(stats.items())]
    return sorted(rows, key=lambda r: (r["app"], r["upstream"]))


def llm_rows(timeout_s: float = 20.0) -> list[dict[str, Any]]:
    """Every ``engine: vllm`` model's pools, from its engines' own metrics: replicas answering,
    requests running and waiting, KV-cache use, tokens/s, mean TTFT and TPOT (ms)."""
    rows = []
    for app, models in _ask_front_doors("llm_stats", timeout_s).items():
        for model, pools in sorted(models.items()):
            for pool, st in sorted(pools.items()):
                rows.append({
                    "app": app, "model": model, "pool": int(pool),
                    "replicas": int(st["replicas"]), "answering": int(st["answering"]),
                    "running": int(st["running"]), "waiting": int(st["waiting"]),
                    "kv_cache": st["kv_cache"], "tokens_per_s": st["tokens_per_s"],
                    "weight": st.get("weight"),
                    "capacity_tokens_per_s": st.get("capacity_tokens_per_s"),
                    "generation_tokens": int(st["generation_tokens"]),
                    "ttft_ms": 1000 * st["ttft_sum"] / st["ttft_count"] if st["ttft_count"] else None,
                    "tpot_ms": 1000 * st["tpot_sum"] / st["tpot_count"] if st["tpot_count"] else None,
                })
    return rows


def view_to_dict(view, upstreams: list[dict[str, Any]] | None = None,
                 llm: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The frame as JSON-ready data (``--once --json``)."""
    import dataclasses

    return {
        "timestamp": view.timestamp,
        "cluster": dataclasses.asdict(view.cluster),
        "devices": device_rows(view),
        "jobs": job_rows(view),
        "upstreams": upstreams or [],
        "llm_pools": llm or [],
        "hints": [dataclasses.asdict(h) for h in view.hints],
    }


def render(view, upstreams: list[dict[str, Any]] | None = None,
           llm: list[dict[str, Any]] | None = None):
    """The frame as a rich renderable: a summary line, the device table, the job table, hints."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    c = view.cluster
    stamp = time.strftime("%H:%M:%S", time.localtime(view.timestamp))
    summary = Text(
        f"hetflow top  {stamp}  {len(view.snapshot.nodes)} nodes, {c.accelerators} accelerators, "
        f"{_num(c.devices_held, '{:g}')} held ({_pct(c.allocated_utilisation)} allocated), "
        f"{_pct(c.effective_utilisation)} busy, {c.free_devices} free, "
        f"fragmentation {_pct(c.fragmentation)}, queue {c.queue_length}",
        style="bold",
    )
    devices = Table(title="devices", title_justify="left", expand=False)
    for col, justify in (("node", "left"), ("dev", "right"), ("model", "left"), ("util", "right"),
                         ("memory GiB", "right"), ("power W", "right"),
                         ("link rx/tx GB/s", "right"), ("job", "left")):
        devices.add_column(col, justify=justify, no_wrap=True)
    for r in device_rows(view):
        if not r["sampled"]:
            cells = ["?", "?", "?", "?"]
        else:
            link = (f"{_rate(r['link_rx_bytes_per_s'])}/{_rate(r['link_tx_bytes_per_s'])} {r['link_fabric']}"
                    if r["link_fabric"] else "-")
            cells = [_pct(r["utilisation"]),
                     f"{_gib(r['memory_used_bytes'])}/{_gib(r['memory_total_bytes'])}",
                     _num(r["power_watts"], "{:.0f}"), link]
        devices.add_row(r["node"], str(r["device"]), r["model"] or "-", *cells, ", ".join(r["jobs"]) or "")
    parts: list[Any] = [summary, devices]
    rows = job_rows(view)
    if rows:
        jobs = Table(title="jobs", title_justify="left", expand=False)
        for col, justify in (("job", "left"), ("devices", "right"), ("where", "left"),
                             ("samples/s", "right"), ("step s", "right"),
                             ("TFLOP/s achieved/peak", "right"), ("effective", "right")):
            jobs.add_column(col, justify=justify, no_wrap=True)
        for r in rows:
            jobs.add_row(r["job"], str(r["devices"]), r["where"], _num(r["samples_per_s"]),
                         _num(r["step_time_s"], "{:.3f}"),
                         f"{_num(r['achieved_tflops'])}/{_num(r['peak_tflops'])}",
                         "-" if r["effective_ratio"] is None else f"{r['effective_ratio']:.1%}")
        parts.append(jobs)
    if upstreams:
        table = Table(title="upstreams", title_justify="left", expand=False)
        for col, justify in (("app", "left"), ("upstream", "left"), ("state", "left"),
                             ("requests", "right"), ("errors", "right"), ("mean ms", "right"),
                             ("fallback", "left")):
            table.add_column(col, justify=justify, no_wrap=True)
        for r in upstreams:
            table.add_row(r["app"], r["upstream"], r["status"] or ("UP" if r["up"] else "DOWN"),
                          f"{r['requests']:,}", f"{r['errors']:,}", str(r["response_ms"]),
                          r.get("fallback") or "-")
        parts.append(table)
    if llm:
        table = Table(title="llm pools", title_justify="left", expand=False)
        for col in ("app", "model", "pool", "up", "running", "waiting", "kv cache", "tok/s",
                    "weight", "ttft ms", "tpot ms"):
            table.add_column(col, justify="left" if col in ("app", "model") else "right", no_wrap=True)
        for r in llm:
            table.add_row(r["app"], r["model"], str(r["pool"]), f"{r['answering']}/{r['replicas']}",
                          str(r["running"]), str(r["waiting"]), f"{r['kv_cache']:.0%}",
                          f"{r['tokens_per_s']:.1f}", _num(r.get("weight"), "{:.0f}"),
                          _num(r["ttft_ms"], "{:.1f}"),
                          _num(r["tpot_ms"], "{:.2f}"))
        parts.append(table)
    for hint in view.hints:
        parts.append(Text(f"hint: {hint.message}", style="yellow"))
    return Group(*parts)


# ---------------------------------------------------------------------------- running


def _connect(address: str | None) -> bool:
    """Connect to Ray unless this process already is; True when this call connected."""
    from hetflow.runtime.session import check_reachable, ray_loopback_mode

    ray_loopback_mode(address, default="auto")
    check_reachable(address, default="auto")  # (skipped when this process already joined Ray)
    import ray

    if ray.is_initialized():
        return False
    try:
        ray.init(address=address or "auto", log_to_driver=False, logging_level="ERROR")
    except ConnectionError as err:  # same meaning (and exit code 2) as submit/status without a cluster
        raise InputError(
            f"no running Ray cluster found ({str(err).splitlines()[0]}); start one with "
            "`ray start --head` / `hetflow node start`, or pass --address HEAD:6379"
        ) from None
    return True


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise InputError("--interval must be > 0 seconds")
    if args.json and not args.once:
        raise InputError("--json goes with --once (a live view is not JSON)")
    stale = args.stale if args.stale is not None else max(30.0, 3 * args.interval)
    connected = _connect(args.address)
    from hetflow.runtime import metrics
    try:
        if args.stop_agents:
            print(f"stopped {metrics.stop_metrics()} hetflow metrics actors", file=sys.stderr)
            return 0
        if not args.no_start:
            metrics.start_metrics(interval_s=args.interval)
        if args.once:
            view = metrics.collect_view(stale_after_s=stale)
            upstreams, llm = upstream_rows(), llm_rows()
            if args.json:
                print(json.dumps(view_to_dict(view, upstreams, llm), indent=2, default=str))
            else:
                from rich.console import Console

                Console().print(render(view, upstreams, llm))
            return 0
        return _live(args.interval, stale)
    finally:
        if connected:
            import ray

            ray.shutdown()


def _live(interval: float, stale: float) -> int:
    from rich.console import Console
    from rich.live import Live

    from hetflow.runtime.metrics import collect_view

    console = Console()
    try:
        with Live(render(collect_view(stale), upstream_rows(), llm_rows()), console=console, auto_refresh=False,
                  screen=False) as live:
            while True:
                time.sleep(interval)
                live.update(render(collect_view(stale), upstream_rows(), llm_rows()), refresh=True)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 0
