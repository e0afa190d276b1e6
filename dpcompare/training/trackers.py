"""Experiment trackers (``--log``): TensorBoard, Weights & Biases, MLflow and CSV, fed by the reporting rank.

The loop talks to one :class:`Trackers` object and never to a tool::

    trackers = open_trackers(cfg, run_info, out, is_main)   # opens each tool, logs the config and versions
    trackers.log_epoch(global_step, row)                    # after every epoch (metrics.jsonl's row)
    trackers.log_timing(summary["timing"])                  # the step-time phases, once
    trackers.finish(summary)                                # final figures; closes every tool

On any other rank ``open_trackers`` returns an empty :class:`Trackers` whose calls do nothing.

A ``compare`` groups its runs: :func:`start_comparison` (in the comparing process, before the first run)
returns a :class:`Comparison` whose ``env`` every child job needs; each run then joins the W&B group
(``WANDB_RUN_GROUP``) and becomes a child of the comparison's MLflow parent run. ``Comparison.finish``
attaches the verdicts at the end. W&B is offline unless ``WANDB_MODE`` says otherwise.
"""

from __future__ import annotations

import csv
import importlib
import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dpcompare.config import TRACKERS, TrainConfig
from dpcompare.errors import ConfigError

#: environment variables a compare's child jobs receive (besides WANDB_RUN_GROUP and MLFLOW_TRACKING_URI)
MLFLOW_PARENT_ENV = "DPCOMPARE_MLFLOW_PARENT_RUN_ID"
MLFLOW_EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_ID"
WANDB_PROJECT = "dpcompare"  # unless WANDB_PROJECT is set
MLFLOW_EXPERIMENT = "dpcompare"  # unless MLFLOW_EXPERIMENT_NAME / MLFLOW_EXPERIMENT_ID is set


def selected(cfg: TrainConfig) -> list[str]:
    """The trackers ``cfg`` asks for (``--no-tensorboard`` removes tensorboard from ``--log``)."""
    names = [n.strip() for n in cfg.log.split(",") if n.strip() and n.strip() != "none"]
    return [n for n in dict.fromkeys(names) if cfg.tensorboard or n != "tensorboard"]


def require(name: str) -> Any:
    """Import the module tracker ``name`` needs; ConfigError naming the extra when it is absent or broken."""
    if name not in TRACKERS:
        raise ConfigError(f"unknown tracker {name!r} in --log; choose from {', '.join(TRACKERS)}")
    module, extra, _ = TRACKERS[name]
    if module is None:
        return None
    try:
        return importlib.import_module(module)
    except ImportError as e:
        hint = f"pip install 'dpcompare[{extra}]'" if extra else f"pip install {module}"
        raise ConfigError(f"--log {name}: {module} does not import ({e}); {hint}") from None


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
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out / "tensorboard"))

    def log_config(self, config: Mapping[str, Any], versions: Mapping[str, Any]) -> None:
        self.writer.add_text("config", "```\n" + json.dumps(dict(config), indent=1) + "\n```")
        self.writer.add_text("versions", "  \n".join(f"{k}: {v}" for k, v in versions.items()))

    def log_epoch(self, step: int, row: Mapping[str, Any]) -> None:
        epoch = int(row.get("epoch", step))
        tests = {k: v for k, v in row.items() if k.startswith("test_") and k != "test_metric"}
        tests.update({f"test_{n.replace(' ', '_')}": v for n, v in (row.get("metrics") or {}).items()})
        for k, v in {"train_loss": row.get("train_loss"), **tests, "samples_per_sec": row.get("samples_per_sec")}.items():
            if v is not None:
                self.writer.add_scalar(k, v, epoch)

    def log_timing(self, timing: Mapping[str, Any], step: int) -> None:
        for k, v in timing_scalars(timing).items():
            self.writer.add_scalar(k, v, step)

    def close(self, failed: bool = False) -> None:
        self.writer.close()


class CsvTracker(Tracker):
    """``OUT/metrics.csv`` (a row per epoch, the columns of the first row) and ``OUT/timing.csv`` (name, value)."""

    name = "csv"

    def __init__(self, out: Path, history: Sequence[Mapping[str, Any]] = ()) -> None:
        self.out = out
        self.file = open(out / "metrics.csv", "w", newline="")  # noqa: SIM115 (closed in close())
        self.writer: csv.DictWriter[str] | None = None
        for row in history:  # a resumed run's earlier epochs, as metrics.jsonl keeps them
            self.log_epoch(int(row.get("step", 0)), row)

    def log_epoch(self, step: int, row: Mapping[str, Any]) -> None:
        if self.writer is None:
            self.writer = csv.DictWriter(self.file, fieldnames=list(row), extrasaction="ignore")
            self.writer.writeheader()
        self.writer.writerow(dict(row))
        self.file.flush()

    def log_timing(self, timing: Mapping[str, Any], step: int) -> None:
        with open(self.out / "timing.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["name", "value"])
            w.writerows(timing_scalars(timing).items())

    def close(self, failed: bool = False) -> None:
        self.file.close()


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
    import logging

    from mlflow.tracking import MlflowClient

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
        from mlflow.entities import Param, RunTag

        params = [Param(k, _text(v)[:6000]) for k, v in config.items()]
        tags = [RunTag(f"versions.{k}", str(v)) for k, v in versions.items()]
        for i in range(0, max(len(params), 1), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100], tags=tags if i == 0 else [])

    def _metrics(self, values: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def log_epoch(self, step: int, row: Mapping[str, Any]) -> None:
        self.step = step
        self._metrics(scalars(row), step)

    def log_timing(self, timing: Mapping[str, Any], step: int) -> None:
        self._metrics(timing_scalars(timing), step)

    def finish(self, summary: Mapping[str, Any], step: int) -> None:
        self._metrics({f"final/{k}": v for k, v in final_scalars(summary).items()}, step)
        self.client.log_dict(self.run_id, dict(summary), "summary.json")

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


def open_trackers(cfg: TrainConfig, run_info: Mapping[str, Any], out: Path, is_main: bool,
                  history: Sequence[Mapping[str, Any]] = ()) -> Trackers:
    """Open the trackers ``cfg`` asks for on the reporting rank and log the config and versions there.

    ``run_info`` is the run's config (``cfg.to_dict()`` with world size and effective lr); ``history`` the
    epochs a resumed run already has (the CSV file starts with them). Other ranks get an empty Trackers.
    """
    if not is_main:
        return Trackers()
    from dpcompare.versions import versions

    names = selected(cfg)
    for name in names:  # all or nothing: a missing tool stops the run before any tool opened
        require(name)
    vers = versions()
    opened = Trackers()
    try:
        for name in names:
            if name == "tensorboard":
                opened.trackers.append(TensorBoardTracker(out))
                opened.trackers[-1].log_config(run_info, vers)
            elif name == "csv":
                opened.trackers.append(CsvTracker(out, history))
            elif name == "wandb":
                opened.trackers.append(WandbTracker(out, run_info, vers))
            elif name == "mlflow":
                opened.trackers.append(MlflowTracker(out, cfg.mlflow_uri, run_info, vers))
    except BaseException:
        opened.close(failed=True)
        raise
    return opened


# -- a comparison's group -------------------------------------------------------------------------------
class Comparison:
    """A ``compare``'s group in the trackers: ``env`` goes to every child job; :meth:`finish` adds the verdicts.

    W&B: the runs share the group ``name`` (``WANDB_RUN_GROUP``) and a last run of job type ``comparison``
    carries the verdicts (summary and table). MLflow: a parent run named ``name`` in the store, the runs its
    children, the verdicts its tags, metrics and ``verdicts.json`` artifact.
    """

    def __init__(self, name: str, out: Path, kinds: Sequence[str], mlflow_uri: str | None = None) -> None:
        self.name, self.out, self.kinds = name, out, [k for k in kinds if k in ("wandb", "mlflow")]
        self.env: dict[str, str] = {}
        self.mlflow: tuple[Any, str] | None = None
        if "wandb" in self.kinds:
            require("wandb")
            self.env["WANDB_RUN_GROUP"] = name
        if "mlflow" in self.kinds:
            require("mlflow")
            uri = mlflow_store(mlflow_uri, out)
            client = mlflow_client(uri)
            experiment = mlflow_experiment(client, uri)
            run = client.create_run(experiment, run_name=name, tags={"dpcompare.kind": "comparison"})
            self.mlflow = (client, run.info.run_id)
            self.env.update({"MLFLOW_TRACKING_URI": uri, MLFLOW_EXPERIMENT_ENV: experiment,
                             MLFLOW_PARENT_ENV: run.info.run_id})

    def finish(self, verdicts: Sequence[Mapping[str, Any]], failed: bool = False) -> None:
        """Attach ``verdicts`` (results.json's) to the group and close it."""
        if "wandb" in self.kinds:
            self._wandb_verdicts(verdicts, failed)
        if self.mlflow is not None:
            client, run_id = self.mlflow
            self.mlflow = None
            values = _verdict_scalars(verdicts)
            tags = {f"verdict.{k}": str(v.get("text") or v.get("outcome")) for k, v in _keyed(verdicts).items()}
            from mlflow.entities import Metric, RunTag

            now = int(time.time() * 1000)
            client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in values.items()],
                             tags=[RunTag(k, t[:5000]) for k, t in tags.items()])
            client.log_dict(run_id, {"comparison": self.name, "verdicts": list(verdicts)}, "verdicts.json")
            client.set_terminated(run_id, "FAILED" if failed else "FINISHED")

    def _wandb_verdicts(self, verdicts: Sequence[Mapping[str, Any]], failed: bool) -> None:
        wandb = require("wandb")
        self.out.mkdir(parents=True, exist_ok=True)
        run = wandb.init(project=os.environ.get("WANDB_PROJECT", WANDB_PROJECT), name=f"{self.name}-verdicts",
                         group=self.name, job_type="comparison", dir=str(self.out),
                         config={"comparison": self.name}, mode=os.environ.get("WANDB_MODE", "offline"),
                         settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
                         reinit="create_new")
        columns = ["np", "metric", "baseline", "other", "outcome", "ratio", "ci_low", "ci_high", "text"]
        table = wandb.Table(columns=columns, data=[[v.get(c) for c in columns] for v in verdicts])
        run.log({"verdicts": table})
        run.summary.update(_verdict_scalars(verdicts))
        run.summary.update({f"verdict/{k}": str(v.get("text") or v.get("outcome"))
                            for k, v in _keyed(verdicts).items()})
        run.finish(exit_code=1 if failed else 0)


def _keyed(verdicts: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """``throughput.horovod_vs_ddp.np2`` → verdict."""
    return {f"{v.get('metric', 'throughput')}.{v.get('other')}_vs_{v.get('baseline')}.np{v.get('np')}": v
            for v in verdicts}


def _verdict_scalars(verdicts: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, v in _keyed(verdicts).items():
        out.update(scalars({k: v.get(k) for k in ("ratio", "ci_low", "ci_high", "blocks")}, key.replace(".", "/") + "/"))
    return out


def start_comparison(name: str, out: Path, kinds: str | Sequence[str], mlflow_uri: str | None = None) -> Comparison:
    """Open a compare's group (``kinds``: ``--log``'s value or list; only wandb and mlflow group runs).

    Call it in the comparing process before the first run and pass ``.env`` to every child job; the
    children's own ``--log`` decides what they log."""
    names = [k.strip() for k in kinds.split(",")] if isinstance(kinds, str) else list(kinds)
    return Comparison(name, out, names, mlflow_uri)


def finish_comparison(comparison: Comparison, verdicts: Sequence[Mapping[str, Any]]) -> None:
    comparison.finish(verdicts)
