"""A comparison's runs as one group in the experiment trackers (``compare --trackers wandb,mlflow``).

:func:`open_group` (in the comparing process, before the first run) returns a :class:`TrackerGroup` whose
``env`` every child job gets; each run then joins the W&B group (``WANDB_RUN_GROUP``) and becomes a child of
the comparison's MLflow parent run. :meth:`TrackerGroup.finish` attaches the verdicts at the end. The tools
themselves, and how a run logs to them, are :mod:`dpcompare.training.trackers`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dpcompare.training.trackers import (
    MLFLOW_EXPERIMENT_ENV,
    MLFLOW_PARENT_ENV,
    WANDB_PROJECT,
    mlflow_client,
    mlflow_experiment,
    mlflow_store,
    require,
    scalars,
)


class TrackerGroup:
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
            # lazy: an optional tracker
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
        out.update(
            scalars({k: v.get(k) for k in ("ratio", "ci_low", "ci_high", "blocks")}, key.replace(".", "/") + "/")
        )
    return out


def open_group(name: str, out: Path, kinds: str | Sequence[str], mlflow_uri: str | None = None) -> TrackerGroup:
    """Open a compare's group (``kinds``: ``--trackers``'s value or list; only wandb and mlflow group runs).

    Call it in the comparing process before the first run and pass ``.env`` to every child job; the
    children's own ``--trackers`` decides what they log."""
    names = [k.strip() for k in kinds.split(",")] if isinstance(kinds, str) else list(kinds)
    return TrackerGroup(name, out, names, mlflow_uri)
