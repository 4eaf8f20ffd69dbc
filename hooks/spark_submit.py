"""The Spark provider's SparkSubmitHook, starting spark-submit with an environment free of Airflow's settings.

spark-submit's environment reaches the driver (inherited in local and client mode, forwarded by the standalone
client in cluster mode), so it must carry no ``AIRFLOW*`` variable: connections (``AIRFLOW_CONN_*``) are
secrets, and under a real Airflow 3 the task process sets ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`` to a blocked
URL that fails the driver's ``import airflow``. The hook's own ``env_vars`` cannot do it: it adds to this
process's environment and is refused in standalone cluster mode.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook


def clean_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Return this process's environment without Airflow's settings and connections, plus ``extra``.

    The driver runs this interpreter (``PYSPARK_DRIVER_PYTHON``), which has the package and its dependencies;
    pyspark puts spark-submit next to it, a directory a worker's PATH may lack when Airflow runs from a
    virtualenv it did not activate.

    :param extra: variables to add (no secrets: Spark may show its environment).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW") or k == "AIRFLOW_HOME"}
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    bin_dir = Path(sys.executable).parent
    if (bin_dir / "spark-submit").exists():
        env["PATH"] = os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])
    env.update(extra or {})
    return env


class CleanEnvironmentSparkSubmitHook(SparkSubmitHook):
    """SparkSubmitHook whose ``submit()`` starts spark-submit with a given environment, in its own session.

    Its own session: nothing spark-submit starts shares the task's process group. Killing spark-submit (the
    hook's ``on_kill``) is enough in local and client mode: the Python driver dies with its JVM
    (:func:`exactly_once_provider.spark_jobs.driver.exit_with_the_jvm`).

    :param submit_env: spark-submit's whole environment; default :func:`clean_environment` (a hook built only
        to kill a driver, by ``on_kill`` before anything was submitted, needs none).
    """

    hook_name = "Spark Submit (clean environment)"

    def __init__(self, *, submit_env: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.submit_env = submit_env if submit_env is not None else clean_environment()

    def submit(self, application: str = "", **kwargs: Any) -> str | None:
        kwargs.setdefault("env", self.submit_env)
        kwargs.setdefault("start_new_session", True)
        return super().submit(application, **kwargs)
