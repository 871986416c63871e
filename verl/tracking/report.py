"""Run reports: a run's ``metrics.jsonl`` as plots (PNG files) and one self-contained HTML page, and
several runs side by side in one table and one overlay plot.

``verl report RUN_DIR`` writes ``RUN_DIR/report.html`` and ``RUN_DIR/report/*.png``; the RL trainer
writes the same at the end of every run (:func:`write_run_report`: a failure is a warning, never the
run's failure). ``verl runs DIR1 DIR2 ...`` (or ``verl report DIR1 DIR2 ...``) prints the comparison
table and writes ``runs.html`` and ``runs.png`` to ``-o OUT`` (default ``runs_report``).

Plots show only the metrics a run logged (a run without a critic or validation still gets a report);
the page lists the ones it did not. Plots are drawn on matplotlib's Agg canvas (no display, no global
pyplot state), and the page embeds them as base64, so the HTML file is the whole report.
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import html
import io
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from verl.errors import VerlError
from verl.tracking.summary import STAGE_ORDER

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
REPORT_FILE = "report.html"
PLOT_DIR = "report"


@dataclass(frozen=True)
class Panel:
    """One plot: lines of the metrics matching ``patterns`` (fnmatch) against the step."""

    name: str  # the PNG's file stem
    title: str
    patterns: tuple[str, ...]
    stacked: bool = False  # stacked bars (time per stage; see stacked_bars) instead of lines
    optional: bool = False  # a mode's own panel (asynchronous RL): not listed as missing from runs without it


PANELS = (
    Panel("reward", "Reward (train and validation)", ("critic/score/mean", "val-core/*", "val-aux/*")),
    Panel("response_length", "Response length (tokens)", ("response_length/mean", "response_length/max")),
    Panel("kl", "KL to the reference", ("actor/kl_loss", "actor/ref_kl", "actor/reward_kl_penalty")),
    Panel("entropy", "Entropy", ("actor/entropy",)),
    Panel("grad_norm", "Gradient norm", ("actor/grad_norm", "critic/grad_norm")),
    Panel("timing", "Time per stage (s)", ("timing_s/*",), stacked=True),
    Panel("async_staleness", "Asynchronous: staleness and queue (versions, batches)",
          ("async/staleness_mean", "async/staleness_max", "async/staleness_last_mean", "async/queue_depth",
           "async/in_flight"), optional=True),
    Panel("async_idle", "Asynchronous: idle fractions and samples spanning a weight swap",
          ("async/trainer_idle_frac", "async/rollout_idle_frac", "async/partial_frac"), optional=True),
    Panel("async_sync", "Asynchronous: weight sync (s) and rollout-trainer gap (KL)",
          ("async/weight_sync_s", "async/mismatch_kl"), optional=True),
)

# The table's metrics, and which of them have a "best" (the highest: rewards).
KEY_METRICS = (("critic/score/mean", True), ("val-core/*", True), ("val-aux/*", True),
               ("response_length/mean", False), ("actor/entropy", False), ("actor/kl_loss", False),
               ("actor/ref_kl", False), ("actor/reward_kl_penalty", False), ("actor/grad_norm", False),
               ("critic/vf_loss", False))


# ---------------------------------------------------------------------------------------- reading
def load_metrics(run_dir: str | Path) -> list[dict]:
    """The rows of ``run_dir/metrics.jsonl`` merged per step (validation is logged as a row of its own
    at the same step; a resumed run may log a step again: the later value wins), sorted by step."""
    path = Path(run_dir) / METRICS_FILE
    if not Path(run_dir).is_dir():
        raise VerlError(f"{run_dir}: no such folder; give a run's output folder (trainer.default_local_dir)")
    if not path.is_file():
        # Where a run's folder is below the one given (verl report outputs, not outputs/demo): name them.
        below = sorted(str(p.parent) for pattern in (f"*/{METRICS_FILE}", f"*/*/{METRICS_FILE}")
                       for p in Path(run_dir).glob(pattern))[:5]
        hint = f"; the run folders below it: {', '.join(below)}" if below else ""
        raise VerlError(f"{run_dir}: no {METRICS_FILE} in this folder; expected a run's output folder "
                        f"(trainer.default_local_dir), which holds {METRICS_FILE}{hint}")
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    by_step: dict[int, dict] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines) and not text.endswith("\n"):
                break  # the run was killed while writing its last row
            raise VerlError(f"{path}:{number}: not a JSON row ({exc.msg}); expected one JSON object per step")
        by_step.setdefault(int(row["step"]), {}).update(row)
    if not by_step:
        raise VerlError(f"{path}: no rows; expected one JSON object per step (has the run logged a step yet?)")
    return [by_step[step] for step in sorted(by_step)]


def matching_keys(rows: list[dict], pattern: str) -> list[str]:
    """The keys matching ``pattern`` that some row logged a value for (not null), sorted."""
    names = [k for k in set().union(*rows) if fnmatch.fnmatchcase(k, pattern)]
    return sorted(k for k in names if any(row.get(k) is not None for row in rows))


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of the rows that logged ``key`` (a non-finite value is logged as null: skipped)."""
    points = [(row["step"], row[key]) for row in rows if row.get(key) is not None]
    return [s for s, _ in points], [v for _, v in points]


@dataclass(frozen=True)
class Stat:
    first: float
    final: float
    best: float | None  # the highest value, for rewards; None for metrics without a "better"
    points: int


def summarize(rows: list[dict]) -> dict:
    """``steps`` (the last step), ``wall_time_s`` (the sum of ``timing_s/step``, None if not logged) and
    ``metrics``: a :class:`Stat` per key metric the run logged."""
    stats = {}
    for pattern, has_best in KEY_METRICS:
        for key in matching_keys(rows, pattern):
            _, values = series(rows, key)
            stats[key] = Stat(values[0], values[-1], max(values) if has_best else None, len(values))
    _, step_times = series(rows, "timing_s/step")
    return {"steps": rows[-1]["step"], "wall_time_s": sum(step_times) if step_times else None, "metrics": stats}


def missing_patterns(rows: list[dict]) -> list[str]:
    return [p for panel in PANELS if not panel.optional for p in panel.patterns if not matching_keys(rows, p)]


# ---------------------------------------------------------------------------------------- plotting
def _figure(width: float = 6.4, height: float = 3.6, *, panels: int = 1):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise VerlError("run reports need matplotlib: pip install matplotlib (bash scripts/setup.sh installs it)")
    if panels > 1:
        return Figure(figsize=(width, height), dpi=100, layout="constrained")
    # One panel: fixed margins (room for 8-character tick labels); a layout engine would double the
    # time of every run's report.
    figure = Figure(figsize=(width, height), dpi=100)
    figure.subplots_adjust(left=0.13, right=0.97, bottom=0.14, top=0.91)
    return figure


def _style(ax, title: str) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_title(title)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")  # a bare Figure renders on the Agg canvas
    return buffer.getvalue()


def _stage_order(key: str) -> tuple[int, str]:
    stage = key.split("/", 1)[1]
    return (STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER), stage)


# The most bars a stacked panel draws: a long run's steps are averaged in runs of consecutive steps (matplotlib
# draws each bar as a patch, ~1.4 ms apiece: 10 s for 1,500 steps of 5 stages; and a 640-pixel plot cannot
# show more bars than this anyway).
MAX_BARS = 200


def stacked_bars(rows: list[dict], keys: list[str]) -> tuple[list[float], float, dict[str, list[float]]]:
    """``(centres, width, heights)`` of a stacked bar panel of ``keys`` over the steps that logged any of them:
    one bar per step, or for more than :data:`MAX_BARS` steps one per run of ``ceil(steps / MAX_BARS)``
    consecutive steps, at the mean step of the run, each stage's height the mean over the run (seconds per
    step either way; a step that did not log a stage counts 0 for it)."""
    logged = [row for row in rows if any(row.get(k) is not None for k in keys)]
    per_bar = -(-len(logged) // MAX_BARS)
    runs = [logged[i:i + per_bar] for i in range(0, len(logged), per_bar)]
    centres = [sum(row["step"] for row in run) / len(run) for run in runs]
    heights = {key: [sum(row.get(key) or 0.0 for row in run) / len(run) for run in runs] for key in keys}
    return centres, 0.8 * per_bar, heights


def plot_panel(rows: list[dict], panel: Panel) -> bytes | None:
    """The panel's PNG, or None when the run logged none of its metrics."""
    keys = [k for p in panel.patterns for k in matching_keys(rows, p)]
    if panel.stacked:
        keys = sorted((k for k in keys if k != "timing_s/step"), key=_stage_order)
    if not keys:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    if panel.stacked:
        centres, width, heights = stacked_bars(rows, keys)
        bottom = [0.0] * len(centres)
        for key in keys:
            ax.bar(centres, heights[key], bottom=bottom, width=width, label=key.split("/", 1)[1])
            bottom = [b + h for b, h in zip(bottom, heights[key])]
    else:
        for key in keys:
            steps, values = series(rows, key)
            sparse = key.startswith("val-") or len(steps) <= 20
            ax.plot(steps, values, marker="o" if sparse else None, markersize=3, label=key)
    _style(ax, panel.title)
    return _png(fig)


def plot_overlay(runs: dict[str, list[dict]]) -> bytes | None:
    """One figure: train reward, validation reward and response length of every run, overlaid."""
    wanted = [("Train reward", ("critic/score/mean",)), ("Validation reward", ("val-core/*",)),
              ("Response length", ("response_length/mean",))]
    axes_keys = [(title, {label: [k for p in patterns for k in matching_keys(rows, p)] for label, rows in runs.items()})
                 for title, patterns in wanted]
    axes_keys = [(title, keys) for title, keys in axes_keys if any(keys.values())]
    if not axes_keys:
        return None
    fig = _figure(4.2 * len(axes_keys), 3.6, panels=len(axes_keys))
    for index, (title, keys) in enumerate(axes_keys, 1):
        ax = fig.add_subplot(1, len(axes_keys), index)
        for label, run_keys in keys.items():
            for key in run_keys:
                steps, values = series(runs[label], key)
                name = label if len(run_keys) == 1 else f"{label}: {key}"
                ax.plot(steps, values, marker="o" if len(steps) <= 20 else None, markersize=3, label=name)
        _style(ax, title)
    return _png(fig)


# ---------------------------------------------------------------------------------------- tables
def _fmt(value) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.4g}"


def run_table(summary: dict) -> list[list[str]]:
    """Header and rows of one run's table: metric, points logged, first, final, best."""
    rows = [["metric", "points", "first", "final", "best"]]
    for key, stat in summary["metrics"].items():
        rows.append([key, str(stat.points), _fmt(stat.first), _fmt(stat.final), _fmt(stat.best)])
    return rows


def runs_table(summaries: dict[str, dict]) -> list[list[str]]:
    """Header and rows of the comparison: one column per run; steps, wall time, then final (and best)
    of every key metric any run logged ("-" where a run did not)."""
    labels = list(summaries)
    rows = [["", *labels], ["steps", *(_fmt(s["steps"]) for s in summaries.values())],
            ["wall time (s)", *(_fmt(s["wall_time_s"]) for s in summaries.values())]]
    keys = list(dict.fromkeys(k for s in summaries.values() for k in s["metrics"]))
    for key in keys:
        stats = [s["metrics"].get(key) for s in summaries.values()]
        rows.append([f"{key} final", *(_fmt(st.final if st else None) for st in stats)])
        if any(st is not None and st.best is not None for st in stats):
            rows.append([f"{key} best", *(_fmt(st.best if st else None) for st in stats)])
    return rows


def format_table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                               enumerate(zip(row, widths))).rstrip() for row in rows)


# ---------------------------------------------------------------------------------------- HTML
_STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1000px}table{border-collapse:collapse}"
          "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,th:first-child"
          "{text-align:left}img{max-width:100%;margin:0.5em 0}")


def _html_table(rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows[1:])
    return f"<table><tr>{head}</tr>{body}</table>"


def _html_page(title: str, parts: list[str]) -> str:
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_STYLE}</style></head><body>\n<h1>{html.escape(title)}</h1>\n" + "\n".join(parts)
            + "\n</body></html>\n")


def _img(name: str, png: bytes) -> str:
    return f'<img alt="{html.escape(name)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


# ---------------------------------------------------------------------------------------- writing
def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write ``report.html`` and ``report/<panel>.png`` for the run in ``run_dir`` (into ``out_dir``,
    default ``run_dir``); returns the HTML file's path."""
    rows = load_metrics(run_dir)
    out = Path(out_dir or run_dir)
    (out / PLOT_DIR).mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    images = []
    for panel in PANELS:
        png = plot_panel(rows, panel)
        if png is not None:
            (out / PLOT_DIR / f"{panel.name}.png").write_bytes(png)
            images.append(_img(panel.title, png))
    wall = f", {summary['wall_time_s']:.1f}s of training steps" if summary["wall_time_s"] is not None else ""
    parts = [f"<p>{html.escape(str(Path(run_dir) / METRICS_FILE))}: {summary['steps']} steps{wall}</p>",
             _html_table(run_table(summary)), *images]
    missing = missing_patterns(rows)
    if missing:
        items = "".join(f"<li><code>{html.escape(p)}</code></li>" for p in missing)
        parts.append(f"<h2>Not logged by this run</h2><ul>{items}</ul>")
    path = out / REPORT_FILE
    path.write_text(_html_page(f"verl run report: {run_labels([run_dir])[0]}", parts), encoding="utf-8")
    return path


def write_run_report(run_dir: str | Path) -> Path | None:
    """:func:`write_report` at the end of a training run: a failure to plot is a warning, not the run's failure."""
    try:
        return write_report(run_dir)
    except Exception as exc:  # the run itself has finished and saved; a report must not undo that
        logger.warning("could not write the run report in %s: %s", run_dir, exc)
        return None


def run_labels(run_dirs: list[str | Path]) -> list[str]:
    """Each run's folder name, or the path as given where two names clash (numbered if that clashes too)."""
    names = [Path(os.path.abspath(d)).name for d in run_dirs]  # "." -> its name; a symlink keeps its own
    labels = [name if names.count(name) == 1 else str(d) for name, d in zip(names, run_dirs)]
    return [label if labels.count(label) == 1 else f"{label} #{labels[:i].count(label) + 1}"
            for i, label in enumerate(labels)]


def compare_runs(run_dirs: list[str | Path], out_dir: str | Path) -> tuple[Path, str]:
    """Write ``runs.html`` and ``runs.png`` to ``out_dir``; returns the HTML's path and the table as text.
    Every folder is read before anything is written."""
    runs = dict(zip(run_labels(run_dirs), (load_metrics(d) for d in run_dirs)))
    table = runs_table({label: summarize(rows) for label, rows in runs.items()})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = [_html_table(table)]
    png = plot_overlay(runs)
    if png is not None:
        (out / "runs.png").write_bytes(png)
        parts.append(_img("runs", png))
    path = out / "runs.html"
    path.write_text(_html_page("verl runs: " + ", ".join(runs), parts), encoding="utf-8")
    return path, format_table(table)


# ---------------------------------------------------------------------------------------- command
def main(argv: list[str] | None = None, prog: str = "verl report") -> int:
    parser = argparse.ArgumentParser(prog=prog, description="Plots and tables of runs' metrics.jsonl: one folder "
                                     "-> its report.html; several -> a side-by-side table and an overlay plot.")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a run's output folder (holds metrics.jsonl)")
    parser.add_argument("-o", "--out", help="where to write (one run: the run's folder; several: runs_report)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if len(args.run_dirs) == 1 and prog != "verl runs":
            path = write_report(args.run_dirs[0], args.out)
            print(format_table(run_table(summarize(load_metrics(args.run_dirs[0])))))
        else:
            path, table = compare_runs(args.run_dirs, args.out or "runs_report")
            print(table)
    except VerlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"Report: {path}")
    return 0
