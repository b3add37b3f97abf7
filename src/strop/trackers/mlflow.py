"""MLflow (pip install -e ".[mlflow]", which installs mlflow-skinny: the tracking client, without the server's
dependencies). Runs go to MLFLOW_TRACKING_URI, else to a SQLite store under $STROP_HOME/mlflow (`mlflow ui
--backend-store-uri sqlite:///$STROP_HOME/mlflow/mlflow.db`, with the full mlflow, shows it), in experiment
MLFLOW_EXPERIMENT_NAME (default strop); a new experiment in a SQLite store keeps its artifacts beside the store.
The run's config is its parameters, each metrics row a batch of metrics at its step, a step's sample rollouts
the artifact rollouts/step-NNNNNN.json (MLflow's table JSON: columns and data)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from strop.paths import strop_home
from strop.trackers.base import RolloutTable, RunInfo, params

BATCH_PARAMS = 100   # MLflow takes at most 100 parameters in one log_batch


def default_uri() -> str:
    return f"sqlite:///{strop_home() / 'mlflow' / 'mlflow.db'}"


def artifact_location(uri: str) -> str | None:
    """Where a new experiment's artifacts go: beside a local SQLite store (MLflow's own default is ./mlruns of
    whatever folder strop ran in), else where the tracking server says (None)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlflow-artifacts").resolve().as_uri()
    return None


class MlflowTracker:
    name = "mlflow"

    def start(self, run: RunInfo) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient  # the extra: checked installed before the run started
        uri = os.environ.get("MLFLOW_TRACKING_URI") or default_uri()
        if uri == default_uri():
            (strop_home() / "mlflow").mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or run.project
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            experiment_id = self.client.create_experiment(name, artifact_location=artifact_location(uri))
        self.run_id = self.client.create_run(experiment_id, run_name=run.name,
                                             tags={"strop.runDir": str(run.run_dir)}).info.run_id
        values = [Param(key[:250], value) for key, value in params(run.config).items()]
        for start in range(0, len(values), BATCH_PARAMS):
            self.client.log_batch(self.run_id, params=values[start:start + BATCH_PARAMS])

    def log_metrics(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric  # the extra, imported in the tracker's thread (start imported it)
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(key, float(value), now, step)
                                                    for key, value in scalars.items()])

    def log_rollouts(self, table: RolloutTable) -> None:
        # the JSON of MLflow's own log_table (columns and rows), without the pandas that log_table needs
        self.client.log_dict(self.run_id, {"columns": list(table.columns), "data": [list(r) for r in table.rows]},
                             f"rollouts/step-{table.step:06d}.json")

    def finish(self) -> None:
        self.client.set_terminated(self.run_id)
