"""The run report: ``report.md`` and ``report.html`` with plots, in ``<results_dir>/<run-id>/``.

Contents: each stage (ran / skipped / off, time, one line), the exported model (source,
precision, validation accuracy), the served model's accuracy over HTTP, the load test
(offered and achieved rate, P50/P95/P99/max, errors), and the plots ``loss.png`` (training
loss per step), ``tuning.png`` (each trial's validation curve; only when the tune stage ran),
``latency.png`` (histogram of load-test latencies, P50 and P99 marked) and ``utilisation.png``
(the driver host's devices over the run, stages marked). ``result.json``
holds the same numbers for scripts. Plots use matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any


def write_report(result: Any, spec: Any) -> tuple[Path, Path]:
    """Write the report files for a finished ``WorkflowResult``; returns (md, html) paths."""
    out: Path = result.results_dir
    out.mkdir(parents=True, exist_ok=True)
    plots = {"Training loss": plot_loss(result.trained, out / "loss.png"),
             "Tuning curves": plot_tuning(result.tuned, out / "tuning.png"),
             "Latency": plot_latency(result.load, out / "latency.png"),
             "Device utilisation": plot_utilisation(getattr(result, "utilisation", None),
                                                    out / "utilisation.png")}
    plots = {k: v for k, v in plots.items() if v is not None}
    summary = summary_dict(result)
    (out / "result.json").write_text(json.dumps(summary, indent=1, default=str))
    md = out / "report.md"
    md.write_text(markdown(result, spec, plots))
    page = out / "report.html"
    page.write_text(to_html(result, spec, plots))
    return md, page


def summary_dict(result: Any) -> dict[str, Any]:
    load = result.load
    return {
        "run_id": result.run_id, "ok": result.ok, "failures": result.failures,
        "wall_s": round(result.wall_s, 2),
        "stages": [{"name": s.name, "status": s.status, "key": s.key, "wall_s": round(s.wall_s, 2),
                    "detail": s.detail} for s in result.stages],
        "train_metrics": result.trained.get("metrics"),
        "export": {k: result.exported[k] for k in ("source", "precision", "accuracy")},
        "served_accuracy": result.served_accuracy,
        "load_test": load.to_dict() if load is not None else None,
    }


def _rows(result: Any) -> list[tuple[str, str, str, str]]:
    return [(s.name, s.status, f"{s.wall_s:.1f} s", s.detail) for s in result.stages]


def _numbers(result: Any) -> list[tuple[str, str]]:
    load = result.load

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f} ms"

    return [
        ("outcome", "success" if result.ok else "FAILED: " + "; ".join(result.failures)),
        ("exported model", f"{result.exported['source']} checkpoint at "
                           f"{result.exported['precision']}"),
        ("validation accuracy (export)", f"{result.exported['accuracy']:.4f}"),
        ("served accuracy (HTTP)", f"{result.served_accuracy:.4f}"),
        ("load test", f"{load.sent} sent at {load.rate:g}/s, {load.ok} ok, "
                      f"{load.achieved_qps:.1f}/s achieved, errors {load.error_count}"),
        ("latency p50 / p95 / p99 / max", f"{ms(load.p50_ms)} / {ms(load.p95_ms)} / "
                                          f"{ms(load.p99_ms)} / {ms(load.max_ms)}"),
        ("wall time", f"{result.wall_s:.1f} s"),
    ]


def markdown(result: Any, spec: Any, plots: dict[str, Path]) -> str:
    lines = [f"# Workflow {spec.name}: run {result.run_id}", ""]
    lines += ["| | |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in _numbers(result)]
    lines += ["", "## Stages", "", "| stage | status | time | detail |",
              "| --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in _rows(result)]
    for title, path in plots.items():
        lines += ["", f"## {title}", "", f"![{title}]({path.name})"]
    lines += [""]
    return "\n".join(lines)


def to_html(result: Any, spec: Any, plots: dict[str, Path]) -> str:
    esc = html.escape
    numbers = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in _numbers(result))
    stages = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>"
                     for row in _rows(result))
    figures = "".join(f"<h2>{esc(t)}</h2><img src=\"{esc(p.name)}\" alt=\"{esc(t)}\">"
                      for t, p in plots.items())
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{esc(spec.name)} "
            f"{esc(result.run_id)}</title><style>body{{font-family:sans-serif;max-width:60em;"
            f"margin:auto}}td,th{{padding:2px 8px;text-align:left}}img{{max-width:100%}}</style>"
            f"</head><body><h1>Workflow {esc(spec.name)}: run {esc(result.run_id)}</h1>"
            f"<table>{numbers}</table><h2>Stages</h2><table><tr><th>stage</th><th>status</th>"
            f"<th>time</th><th>detail</th></tr>{stages}</table>{figures}"
            f"</body></html>\n")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_loss(trained: dict[str, Any], path: Path) -> Path | None:
    losses = trained.get("losses") or {}
    if not losses:
        return None
    plt = _pyplot()
    steps = sorted(int(s) for s in losses)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [losses[str(s)] for s in steps])
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(f"training loss (final validation accuracy "
                 f"{trained['metrics'].get('val_accuracy', float('nan')):.3f})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_tuning(tuned: dict[str, Any] | None, path: Path) -> Path | None:
    if not tuned or not tuned.get("curves"):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for trial, curve in tuned["curves"].items():
        values = [v for v in curve if v is not None]
        if values:
            ax.plot(range(1, len(values) + 1), values, marker=".", alpha=0.7)
    ax.set_xlabel("epoch")
    ax.set_ylabel(tuned["metric"])
    best = tuned["best_value"]
    ax.set_title(f"{len(tuned['curves'])} trials, best "
                 f"{'-' if best is None else format(best, '.3f')}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_latency(load: Any, path: Path) -> Path | None:
    if load is None or not load.latencies_ms:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(load.latencies_ms, bins=40)
    for value, label in ((load.p50_ms, "p50"), (load.p99_ms, "p99")):
        if value is not None:
            ax.axvline(value, color="k", linestyle="--", linewidth=1)
            ax.text(value, ax.get_ylim()[1] * 0.9, f" {label} {value:.1f}", fontsize=8)
    ax.set_xlabel("latency (ms, from the scheduled send)")
    ax.set_ylabel("requests")
    ax.set_title(f"{load.ok} requests at {load.rate:g}/s offered")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_utilisation(samples: list[dict[str, Any]] | None, path: Path) -> Path | None:
    """Busy fraction of each of the driver host's devices over the run, stages marked."""
    points = [s for s in samples or [] if s.get("utilisation") is not None]
    if not points:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for device in sorted({s["device"] for s in points}):
        mine = [s for s in points if s["device"] == device]
        ax.plot([s["t_s"] for s in mine], [100 * s["utilisation"] for s in mine], label=device)
    starts: dict[str, float] = {}
    for s in points:
        starts.setdefault(s["stage"], s["t_s"])
    for stage, t in starts.items():
        ax.axvline(t, color="grey", linestyle=":", linewidth=1)
        ax.text(t, 102, f" {stage}", fontsize=7, rotation=90, va="bottom")
    ax.set_ylim(0, 100)
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("utilisation (%)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


__all__ = ["markdown", "plot_latency", "plot_loss", "plot_tuning", "plot_utilisation",
           "summary_dict", "to_html", "write_report"]
