"""The one typed spec a packaged Spark job receives, and the small files it answers with.

An operator writes a :class:`JobSpec` as JSON next to a 0600 secrets file and passes only the spec's path on
spark-submit's command line. The driver (on this machine in local/client mode, on a worker in cluster mode;
the directory is then on a shared disk, like the package zip) reads it, writes ``started_file`` as soon as its
SparkSession runs (the Spark UI address, where it runs) and ``result_file`` when it ends: the job's result, or
the error that stopped it. The operator never parses the driver's log for either.

Nothing here imports Airflow: the driver imports this module before it has set up its environment.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# What the driver reports for an error: bad input is the user's to fix (the operator raises ValueError),
# anything else is a runtime failure (AirflowException).
VALUE_ERROR, RUNTIME_ERROR = "value", "runtime"


@dataclass(frozen=True)
class JobSpec:
    """What a packaged job runs and where its secrets and its report files are.

    :param job: the job's name, e.g. ``full_load``; the entry point refuses a spec of another job.
    :param params: the job's own request as JSON (e.g. a :class:`~exactly_once_provider.full_load.job.FullLoadRequest`),
        validated once, by the operator that built it.
    :param secrets_file: the 0600 file with the connections the driver needs (never on a command line).
    :param result_file: where the driver writes its result (or its error) as JSON.
    :param started_file: where the driver writes its Spark UI address and working directory once it runs.
    :param app_name: the Spark application name.
    """

    job: str
    params: dict[str, Any]
    secrets_file: str
    result_file: str
    started_file: str
    app_name: str = "eo-job"
    extra: dict[str, Any] = field(default_factory=dict)

    def write(self, path: str | Path) -> str:
        """Write the spec as JSON to ``path``; return the path."""
        Path(path).write_text(json.dumps(asdict(self), sort_keys=True))
        return str(path)

    @classmethod
    def read(cls, path: str | Path, job: str) -> JobSpec:
        """Read a spec written by :meth:`write`; refuse one written for another job.

        :param path: the spec file.
        :param job: the job that reads it.
        """
        spec = cls(**json.loads(Path(path).read_text()))
        if spec.job != job:
            raise ValueError(f"{path} is a spec of job {spec.job!r}, not {job!r}.")
        return spec


def write_json_atomically(path: str | Path, payload: Any) -> None:
    """Write ``payload`` to ``path`` through a rename, so a reader never sees half a file."""
    target = Path(path)
    partial = target.with_name(f".{target.name}.partial")
    partial.write_text(json.dumps(payload, default=str))
    os.replace(partial, target)


def read_json(path: str | Path) -> Any | None:
    """Return the JSON in ``path``, or None when the driver has not written it."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None


def report_started(spec: JobSpec, spark_ui_url: str | None) -> None:
    """Tell the operator the driver runs: its Spark UI (the task's extra link) and where it runs."""
    write_json_atomically(
        spec.started_file,
        {"spark_ui": spark_ui_url, "host": socket.gethostname(), "cwd": os.getcwd(), "pid": os.getpid()},
    )


def report_result(spec: JobSpec, result: Any) -> None:
    """Write the job's result for the operator."""
    write_json_atomically(spec.result_file, {"result": result})


def report_error(spec: JobSpec, err: BaseException) -> None:
    """Write the error that stopped the job; the operator raises it with the same meaning."""
    kind = VALUE_ERROR if isinstance(err, ValueError) else RUNTIME_ERROR
    write_json_atomically(spec.result_file, {"error": {"kind": kind, "type": type(err).__name__, "message": str(err)}})
