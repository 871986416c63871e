"""Metric logging to several backends at once: console, jsonl, tensorboard, wandb.

``metrics.jsonl`` (one JSON object per step) is always written to the run's output folder, so
every run can be plotted and compared without any optional package. A run that resumes from step N
first drops the rows after step N (all rows when it starts from step 0), so the file holds each
step once, however often the run was interrupted. ``val_generations.jsonl`` (the validation
samples of ``trainer.log_val_generations``) is rewound with it.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

from verl.errors import VerlError, naming_the_file

logger = logging.getLogger(__name__)

LOGGER_NAMES = ("console", "jsonl", "tensorboard", "wandb")
# verl's "file" logger writes each step's metrics as a JSON line: here that is metrics.jsonl, always written.
FILE_LOGGER = "file"


def _jsonable(value):
    value = float(value)
    return value if math.isfinite(value) else None


def _rewind_jsonl(path: Path, step: int) -> None:
    """Keep the rows of ``path`` of steps up to ``step`` (none for 0), rewritten atomically; a row
    cut short by a crash is dropped too."""
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True) if step > 0 else []:
        try:
            row_step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            continue
        if row_step <= step and line.endswith("\n"):
            kept.append(line)
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)


class _Jsonl:
    """``metrics.jsonl``, one row per step; and ``val_generations.jsonl``, one row per logged
    validation sample, opened at the first one."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.generations_path = path.with_name("val_generations.jsonl")
        self.file = open(path, "a", encoding="utf-8")

    def rewind(self, step: int) -> None:
        self.file.close()
        _rewind_jsonl(self.path, step)
        if self.generations_path.exists():
            _rewind_jsonl(self.generations_path, step)
        self.file = open(self.path, "a", encoding="utf-8")

    def log(self, metrics: dict, step: int) -> None:
        row = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        with naming_the_file(self.path):
            self.file.write(json.dumps(row) + "\n")
            self.file.flush()

    def log_generations(self, rows: list[dict], step: int) -> None:
        with open(self.generations_path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps({"step": step, **row}) + "\n" for row in rows)

    def close(self, failed: bool = False) -> None:
        with naming_the_file(self.path):
            self.file.close()


def _clip(text: str, width: int) -> str:
    text = repr(text)[1:-1]
    return text if len(text) <= width else text[:width - 3] + "..."


class _Console:
    """One line per step; silent while a progress bar shows the step instead."""

    def __init__(self, quiet: bool):
        self.quiet = quiet

    def log(self, metrics: dict, step: int) -> None:
        if not self.quiet:
            body = " ".join(f"{k}:{v:.4g}" for k, v in sorted(metrics.items()))
            print(f"step:{step} - {body}", flush=True)

    def log_generations(self, rows: list[dict], step: int) -> None:
        lines = [f"validation generations at step {step}:"]
        lines += [f"  score {row['score']:.3f} | prompt {_clip(row['prompt'], 60)} | response {_clip(row['response'], 60)}"
                  for row in rows]
        print("\n".join(lines), flush=True)

    def rewind(self, step: int) -> None:
        pass

    def close(self, failed: bool = False) -> None:
        pass


class _TensorBoard:
    def __init__(self, log_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise VerlError("trainer.logger includes 'tensorboard' but the tensorboard package is not "
                            "installed; run `pip install 'verl[tensorboard]'` or remove it from trainer.logger")
        self.log_dir = log_dir
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, metrics: dict, step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def log_generations(self, rows: list[dict], step: int) -> None:
        def cell(text: str) -> str:
            return _clip(text, 500).replace("|", "\\|")
        table = ["| prompt | response | score |", "| --- | --- | --- |"]
        table += [f"| {cell(row['prompt'])} | {cell(row['response'])} | {row['score']:.4g} |" for row in rows]
        self.writer.add_text("val/generations", "\n".join(table), step)

    def rewind(self, step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer.close()  # TensorBoard hides the events after ``step`` that earlier runs wrote
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=step + 1)

    def close(self, failed: bool = False) -> None:
        self.writer.flush()
        self.writer.close()


class _Wandb:
    def __init__(self, project: str, experiment: str, config: dict, out_dir: Path):
        try:
            import wandb
        except ImportError:
            raise VerlError("trainer.logger includes 'wandb' but the wandb package is not installed; run "
                            "`pip install 'verl[wandb]'` (WANDB_MODE=offline works without an account) or "
                            "remove it from trainer.logger")
        # WANDB_DIR, when set, says where the user keeps wandb's files; else the run's folder.
        run_dir = Path(os.environ.get("WANDB_DIR") or out_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.run = wandb.init(project=project, name=experiment, config=config, dir=str(run_dir),
                                  reinit="finish_previous")
        except (wandb.errors.UsageError, wandb.errors.AuthenticationError, wandb.errors.CommError) as e:
            detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise VerlError(f"trainer.logger includes 'wandb' but wandb could not start a run ({detail}); log in "
                            f"with `wandb login` or set WANDB_API_KEY, or set WANDB_MODE=offline to keep the run on "
                            f"disk (`wandb sync` uploads it later), or remove wandb from trainer.logger") from None

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def log_generations(self, rows: list[dict], step: int) -> None:
        import wandb

        table = wandb.Table(columns=["step", "prompt", "response", "score"],
                            data=[[step, row["prompt"], row["response"], row["score"]] for row in rows])
        self.run.log({"val/generations": table}, step=step)

    def rewind(self, step: int) -> None:
        pass  # a wandb run is a new run each time: its history starts at the resumed step

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)  # a failed run shows as failed in wandb


class Tracker:
    """Sends each step's metrics to every configured backend.

    ``backends`` are logger names (see :data:`LOGGER_NAMES`); ``metrics.jsonl`` in ``out_dir`` is
    written whichever are named. ``record=False`` checks the names but opens nothing (ranks other
    than 0 in a multi-rank job: every rank holds the same metrics, rank 0 logs them). :meth:`from_config` reads them from a ``TrainerConfig``.
    """

    @classmethod
    def from_config(cls, config, out_dir: str | os.PathLike, **kwargs) -> "Tracker":
        """The loggers of ``config.resolved_logging()`` (trainer.logger merged with the short
        ``logger=dict(type=..., project=..., name=...)``), with the whole config recorded."""
        backends, project, experiment = config.resolved_logging()
        kwargs.setdefault("progress_bar", config.trainer.progress_bar)
        return cls(backends, out_dir, project=project, experiment=experiment, config=config.to_dict(), **kwargs)

    def __init__(self, backends, out_dir: str | os.PathLike, *, project: str = "verl", experiment: str = "run",
                 config: dict | None = None, progress_bar: bool = True, record: bool = True):
        names = [backends] if isinstance(backends, str) else list(backends)
        if FILE_LOGGER in names:
            names = [n for n in names if n != FILE_LOGGER]
            if record:
                logger.warning("trainer.logger has verl's 'file' logger: the metrics go to %s (one JSON line per "
                               "step, written on every run), not to verl's VERL_FILE_LOGGER_PATH",
                               Path(out_dir) / "metrics.jsonl")
        unknown = [n for n in names if n not in LOGGER_NAMES]
        if unknown:
            raise VerlError(f"unknown logger(s) {unknown} in trainer.logger (or logger.type); "
                            f"choose from {list(LOGGER_NAMES)}")
        out_dir = Path(out_dir)
        self.backends = []
        if not record:  # the other ranks of a multi-rank job: rank 0 records what they all hold
            return
        for name in names:
            if name == "console":
                self.backends.append(_Console(quiet=progress_bar))
            elif name == "tensorboard":
                self.backends.append(_TensorBoard(out_dir / "tensorboard"))
            elif name == "wandb":
                self.backends.append(_Wandb(project, experiment, config or {}, out_dir))
        # Opened last, so a backend that fails to start leaves no open file behind.
        self.backends.append(_Jsonl(out_dir / "metrics.jsonl"))

    def log(self, metrics: dict, step: int) -> None:
        for backend in self.backends:
            backend.log(metrics, step)

    def log_generations(self, rows: list[dict], step: int) -> None:
        """Validation samples (``{"prompt", "response", "score"}``): printed, appended to
        ``val_generations.jsonl``, and a table in TensorBoard (text) and wandb."""
        for backend in self.backends:
            backend.log_generations(rows, step)

    def rewind(self, step: int) -> None:
        """A run (re)starting at ``step`` (0 = from scratch): forget what earlier attempts logged
        after it, so that every step is recorded once."""
        for backend in self.backends:
            backend.rewind(step)

    def close(self, failed: bool = False) -> None:
        """Flush and close every backend (wandb's run finishes, marked failed when ``failed``); a
        second call does nothing."""
        backends, self.backends = self.backends, []
        for backend in backends:
            backend.close(failed)


class StepsInOrder:
    """A :class:`Tracker` whose loggers see steps in order while some step's metrics are still to come
    (an asynchronous run's validation on the rollout, recorded a step or two later): the metrics of later
    steps wait behind it (wandb drops a step that goes back). Everything else passes through."""

    def __init__(self, tracker: Tracker):
        self.tracker = tracker
        self.open: set[int] = set()
        self.waiting: list[tuple[str, object, int]] = []

    def __getattr__(self, name: str):
        return getattr(self.tracker, name)

    def expect(self, step: int) -> None:
        """Metrics of ``step`` are still to come: later steps wait for them (:meth:`arrived`)."""
        self.open.add(step)

    def arrived(self, step: int) -> None:
        """``step``'s awaited metrics were logged: what waited behind it goes out, up to the next open step."""
        self.open.discard(step)
        self._flush()

    def _flush(self) -> None:
        """What waits goes out in order, up to the first step still open (it waits again behind that)."""
        waiting, self.waiting = self.waiting, []
        for kind, value, at in waiting:
            getattr(self, kind)(value, at)

    def _held(self, kind: str, value, step: int) -> bool:
        if self.open and step > min(self.open):
            self.waiting.append((kind, value, step))
            return True
        return False

    def log(self, metrics: dict, step: int) -> None:
        if not self._held("log", metrics, step):
            self.tracker.log(metrics, step)

    def log_generations(self, rows: list[dict], step: int) -> None:
        if not self._held("log_generations", rows, step):
            self.tracker.log_generations(rows, step)

    def close(self, failed: bool = False) -> None:
        """What still waits goes out (a run that fails with a validation out keeps its steps' metrics), then the
        loggers close."""
        self.open.clear()
        self._flush()
        self.tracker.close(failed)
