"""Experiment trackers (``--trackers``): TensorBoard, Weights & Biases, MLflow and CSV, fed by the reporting rank.

The loop talks to one :class:`Trackers` object and never to a tool::

    trackers = open_trackers(cfg, run_info, out, is_main)   # opens each tool, logs the config and versions
    trackers.log_epoch(global_step, row)                    # after every epoch (metrics.jsonl's row)
    trackers.log_timing(summary["timing"])                  # the step-time phases, once
    trackers.finish(summary)                                # final figures; closes every tool

On any other rank ``open_trackers`` returns an empty :class:`Trackers` whose calls do nothing. A comparison
groups its runs with :mod:`dpcompare.compare.trackers`. W&B is offline unless ``WANDB_MODE`` says otherwise.

Importing this module imports no torch and no tool. A new tracker is its row in ``--trackers``' table
(:data:`dpcompare.argtypes.TRACKERS`, which the command line and ``dpcompare doctor`` read without importing
this room) and a :class:`Tracker` subclass in :data:`OPENERS` here.
"""

from __future__ import annotations

import csv
import importlib
import io
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpcompare.argtypes import TRACKERS, install_hint
from dpcompare.errors import ConfigError
from dpcompare.files import SUMMARY, atomic_write_text
from dpcompare.versions import versions

if TYPE_CHECKING:
    from dpcompare.config import TrainConfig

#: environment variables a compare's child jobs receive (besides WANDB_RUN_GROUP and MLFLOW_TRACKING_URI)
MLFLOW_PARENT_ENV = "DPCOMPARE_MLFLOW_PARENT_RUN_ID"
MLFLOW_EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_ID"
WANDB_PROJECT = "dpcompare"  # unless WANDB_PROJECT is set
MLFLOW_EXPERIMENT = "dpcompare"  # unless MLFLOW_EXPERIMENT_NAME / MLFLOW_EXPERIMENT_ID is set


def selected(cfg: TrainConfig) -> list[str]:
    """The trackers ``cfg`` asks for (``--no-tensorboard`` removes tensorboard from ``--trackers``)."""
    names = [n.strip() for n in cfg.log.split(",") if n.strip() and n.strip() != "none"]
    return [n for n in dict.fromkeys(names) if cfg.tensorboard or n != "tensorboard"]


def require(name: str) -> Any:
    """Import the module tracker ``name`` needs; ConfigError naming the extra when it is absent or broken."""
    if name not in TRACKERS:
        raise ConfigError(f"unknown tracker {name!r} in --trackers; choose from {', '.join(TRACKERS)}")
    module = TRACKERS[name][0]
    if module is None:
        return None
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"--trackers {name}: {module} does not import ({e}); {install_hint(name)}") from None


def check(cfg: TrainConfig) -> None:
    """Every tracker ``cfg`` asks for imports (ConfigError otherwise): call it before training starts."""
    for name in selected(cfg):
        require(name)


def scalars(d: Mapping[str, Any], prefix: str = "", sep: str = "/") -> dict[str, float]:
    """The finite numbers in ``d`` and its nested dicts, keyed ``outer/inner`` (lists and text left out)."""
    out: dict[str, float] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(scalars(v, key + sep, sep))
        elif isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out[key] = float(v)
    return out


def timing_scalars(timing: Mapping[str, Any]) -> dict[str, float]:
    """``summary["timing"]`` as ``timing/step_ms_median``, ``timing/phases_ms/forward``... (no per-rank rows)."""
    return scalars({k: v for k, v in timing.items() if k != "per_rank"}, "timing/")


def final_scalars(summary: Mapping[str, Any]) -> dict[str, float]:
    """A run summary's figures worth a tracker's summary view (not its config, versions or per-rank tables)."""
    keep = {k: v for k, v in summary.items() if k not in ("config", "versions", "timing", "knobs", "comm")}
    if isinstance(keep.get("memory"), Mapping):
        keep["memory"] = {k: v for k, v in keep["memory"].items() if k != "per_rank"}
    return scalars(keep)


def _text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


# -- the tools ------------------------------------------------------------------------------------------
class Tracker:
    """One tool. Subclasses override what they record; every method may be called once per event."""

    name = ""

    def log_config(self, config: Mapping[str, Any], versions: Mapping[str, Any]) -> None:
        pass

    def log_epoch(self, step: int, row: Mapping[str, Any]) -> None:
        pass

    def log_timing(self, timing: Mapping[str, Any], step: int) -> None:
        pass

    def finish(self, summary: Mapping[str, Any], step: int) -> None:
        pass

    def close(self, failed: bool = False) -> None:
        pass


class TensorBoardTracker(Tracker):
    """``OUT/tensorboard``: epoch metrics by epoch (as dpcompare always wrote them), config as text."""

    name = "tensorboard"

    def __init__(self, out: Path) -> None:
        # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out / "tensorboard"))

    def log_config(self, config: Mapping[str, Any], versions: Mapping[str, Any]) -> None:
        self.writer.add_text("config", "```\n" + json.dumps(dict(config), indent=1) + "\n```")
        self.writer.add_text("versions", "  \n".join(f"{k}: {v}" for k, v in versions.items()))

    def log_epoch(self, step: int, row: Mapping[str, Any]) -> None:
        epoch = int(row.get("epoch", step))
        tests = {k: v for k, v in row.items() if k.startswith("test_") and k != "test_metric"}
        tests.update({f"test_{n.replace(' ', '_')}": v for n, v in (row.get("metrics") or {}).items()})
        for k, v in {
            "train_loss": row.get("train_loss"),
            **tests,
            "samples_per_sec": row.get("samples_per_sec"),
        }.items():
            if v is not None:
                self.writer.add_scalar(k, v, epoch)

    def log_timing(self, timing: Mapping[str, Any], step: int) -> None:
        for k, v in timing_scalars(timing).items():
            self.writer.add_scalar(k, v, step)

    def close(self, failed: bool = False) -> None:
        self.writer.close()


class CsvTracker(Tracker):
    """``OUT/metrics.csv`` (a row per epoch, the columns of the first row) and ``OUT/timing.csv`` (name, value),
    each rewritten whole (atomically) when it grows."""

    name = "csv"

    def __init__(self, out: Path, history: Sequence[Mapping[str, Any]] = ()) -> None:
        self.out = out
        # a resumed run's earlier epochs, as metrics.jsonl keeps them
        self.rows: list[Mapping[str, Any]] = list(history)
        self._write_metrics()

    def log_epoch(self, step: int, row: Mapping[str, Any]) -> None:
        self.rows.append(dict(row))
        self._write_metrics()

    def _write_metrics(self) -> None:
        text = io.StringIO(newline="")
        if self.rows:
            writer = csv.DictWriter(text, fieldnames=list(self.rows[0]), extrasaction="ignore")
            writer.writeheader()
            writer.writerows(self.rows)
        atomic_write_text(self.out / "metrics.csv", text.getvalue())

    def log_timing(self, timing: Mapping[str, Any], step: int) -> None:
        text = io.StringIO(newline="")
        w = csv.writer(text)
        w.writerow(["name", "value"])
        w.writerows(timing_scalars(timing).items())
        atomic_write_text(self.out / "timing.csv", text.getvalue())


class WandbTracker(Tracker):
    """A W&B run in ``OUT/wandb``: config (with versions) at init, epoch metrics by optimizer step, timing and
    final figures in the run summary. Offline unless ``WANDB_MODE`` is set; no console capture, no system
    metrics sampling (it would compete with the training it measures)."""

    name = "wandb"

    def __init__(self, out: Path, config: Mapping[str, Any], versions: Mapping[str, Any]) -> None:
        wandb = require("wandb")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", WANDB_PROJECT), name=out.name, dir=str(out),
            group=os.environ.get("WANDB_RUN_GROUP") or None, job_type=str(config.get("strategy", "train")),
            config={**config, "versions": dict(versions)}, mode=os.environ.get("WANDB_MODE", "offline"),
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
            reinit="create_new")
        self.run.define_metric("*", step_metric="step")

    def log_epoch(self, step: int, row: Mapping[str, Any]) -> None:
        self.run.log({**scalars(row), "step": step})

    def log_timing(self, timing: Mapping[str, Any], step: int) -> None:
        self.run.summary.update(timing_scalars(timing))

    def finish(self, summary: Mapping[str, Any], step: int) -> None:
        self.run.summary.update(final_scalars(summary))

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def mlflow_store(uri: str | None, out: Path) -> str:
    """``--mlflow-uri`` as MLflow wants it. A URI (``sqlite:///x.db``, ``http://...``, ``file:...``) stays as it
    is; a path ending in .db becomes a sqlite URI; any other path is a folder that gets ``mlflow.db`` (MLflow 3
    refuses plain folder stores). None: $MLFLOW_TRACKING_URI, else the folder OUT."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or str(out)
    if "://" in uri or uri.startswith(("sqlite:", "file:", "databricks")):
        return uri
    path = Path(uri).resolve()
    return f"sqlite:///{path if path.suffix == '.db' else path / 'mlflow.db'}"


def mlflow_client(uri: str) -> Any:
    """An ``MlflowClient`` on ``uri`` (a local sqlite file's folder is created first)."""
    from mlflow.tracking import MlflowClient  # optional: the mlflow extra

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # not "Creating initial MLflow database tables..."
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=uri)


def mlflow_experiment(client: Any, uri: str) -> str:
    """The experiment id for new runs: $MLFLOW_EXPERIMENT_ID, else $MLFLOW_EXPERIMENT_NAME or "dpcompare",
    created if needed (a sqlite store keeps its artifacts next to the database, not in the working folder)."""
    if os.environ.get(MLFLOW_EXPERIMENT_ENV):
        return os.environ[MLFLOW_EXPERIMENT_ENV]
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME", MLFLOW_EXPERIMENT)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    artifacts = None
    if uri.startswith("sqlite:///"):
        artifacts = (Path(uri[len("sqlite:///"):]).resolve().parent / "mlartifacts").as_uri()
    return str(client.create_experiment(name, artifact_location=artifacts))


class MlflowTracker(Tracker):
    """An MLflow run: config as params, versions as tags, epoch metrics by optimizer step, timing and final
    figures as metrics at the last step, summary.json as an artifact. A compare's child run is tagged
    with the comparison's parent run (``mlflow.parentRunId``)."""

    name = "mlflow"

    def __init__(self, out: Path, uri: str | None, config: Mapping[str, Any], versions: Mapping[str, Any]) -> None:
        require("mlflow")
        self.uri = mlflow_store(uri, out)
        self.client = mlflow_client(self.uri)
        tags = {f"versions.{k}": str(v) for k, v in versions.items()}
        if os.environ.get(MLFLOW_PARENT_ENV):
            tags["mlflow.parentRunId"] = os.environ[MLFLOW_PARENT_ENV]
        run = self.client.create_run(mlflow_experiment(self.client, self.uri), run_name=out.name, tags=tags)
        self.run_id = run.info.run_id
        self.step = 0
        self.log_config(config, {})

    def log_config(self, config: Mapping[str, Any], versions: Mapping[str, Any]) -> None:
        from mlflow.entities import Param, RunTag  # optional: the mlflow extra

        params = [Param(k, _text(v)[:6000]) for k, v in config.items()]
        tags = [RunTag(f"versions.{k}", str(v)) for k, v in versions.items()]
        for i in range(0, max(len(params), 1), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100], tags=tags if i == 0 else [])

    def _metrics(self, values: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric  # optional: the mlflow extra

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def log_epoch(self, step: int, row: Mapping[str, Any]) -> None:
        self.step = step
        self._metrics(scalars(row), step)

    def log_timing(self, timing: Mapping[str, Any], step: int) -> None:
        self._metrics(timing_scalars(timing), step)

    def finish(self, summary: Mapping[str, Any], step: int) -> None:
        self._metrics({f"final/{k}": v for k, v in final_scalars(summary).items()}, step)
        self.client.log_dict(self.run_id, dict(summary), SUMMARY)

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


# -- the loop's interface -------------------------------------------------------------------------------
class Trackers:
    """Every tracker of one run. Calls go to each in turn; after :meth:`finish` (or :meth:`close`) none."""

    def __init__(self, trackers: Iterable[Tracker] = ()) -> None:
        self.trackers = list(trackers)
        self.step = 0

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.trackers]

    def log_config(self, config: Mapping[str, Any], versions: Mapping[str, Any] | None = None) -> None:
        for t in self.trackers:
            t.log_config(config, versions or {})

    def log_epoch(self, step: int, row: Mapping[str, Any]) -> None:
        self.step = max(self.step, step)
        for t in self.trackers:
            t.log_epoch(step, row)

    def log_timing(self, timing: Mapping[str, Any]) -> None:
        for t in self.trackers:
            t.log_timing(timing, self.step)

    def finish(self, summary: Mapping[str, Any]) -> None:
        """Record the run's final figures and close every tool."""
        step = int(summary.get("steps") or self.step)
        try:
            for t in self.trackers:
                t.finish(summary, step)
        finally:
            self.close()

    def close(self, failed: bool = False) -> None:
        """Close every tool (a W&B/MLflow run marked failed when ``failed``); calling it again does nothing."""
        trackers, self.trackers = self.trackers, []
        for t in trackers:
            t.close(failed)

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        self.close(failed=kind is not None)


#: tracker name → how to open it: ``(cfg, out, run_info, versions, history)`` → a Tracker that logged the config
OPENERS: dict[str, Callable[..., Tracker]] = {
    "tensorboard": lambda cfg, out, info, vers, history: _logged(TensorBoardTracker(out), info, vers),
    "csv": lambda cfg, out, info, vers, history: CsvTracker(out, history),
    "wandb": lambda cfg, out, info, vers, history: WandbTracker(out, info, vers),
    "mlflow": lambda cfg, out, info, vers, history: MlflowTracker(out, cfg.mlflow_uri, info, vers),
}


def _logged(tracker: Tracker, run_info: Mapping[str, Any], vers: Mapping[str, Any]) -> Tracker:
    tracker.log_config(run_info, vers)
    return tracker


def open_trackers(cfg: TrainConfig, run_info: Mapping[str, Any], out: Path, is_main: bool,
                  history: Sequence[Mapping[str, Any]] = ()) -> Trackers:
    """Open the trackers ``cfg`` asks for on the reporting rank and log the config and versions there.

    ``run_info`` is the run's config (``cfg.to_dict()`` with world size and effective lr); ``history`` the
    epochs a resumed run already has (the CSV file starts with them). Other ranks get an empty Trackers.
    """
    if not is_main:
        return Trackers()
    names = selected(cfg)
    for name in names:  # all or nothing: a missing tool stops the run before any tool opened
        require(name)
    vers = versions()
    opened = Trackers()
    try:
        for name in names:
            opened.trackers.append(OPENERS[name](cfg, out, run_info, vers, history))
    except BaseException:
        opened.close(failed=True)
        raise
    return opened
