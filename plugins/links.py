"""Operator extra links: the status page of the task's pipeline, and the Spark UI of the submitted job.

Airflow 3 computes a link on the worker when the task finishes (``get_link`` with the rendered operator) and
stores it in XCom; the UI reads it from there. So the pipeline name in the link is the rendered one.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

# Where the API server mounts the status page (plugins/app.py); here, so operators import no FastAPI for it.
URL_PREFIX = "/exactly-once"


def pipeline_page_url(pipeline: str) -> str:
    """Return the status page URL showing ``pipeline`` (absolute when ``[api] base_url`` is set)."""
    from airflow.configuration import conf

    base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    return f"{base}{URL_PREFIX}/?pipeline={quote(str(pipeline), safe='')}"


class PipelineStatusLink(BaseOperatorLink):
    """Open the exactly-once status page at the flow card of the task's pipeline (``status_pipeline`` when the
    operator names one, else its ``pipeline``)."""

    name = "Pipeline status"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        pipeline = getattr(operator, "status_pipeline", None) or getattr(operator, "pipeline", None)
        return pipeline_page_url(pipeline) if pipeline else ""


class SparkUILink(BaseOperatorLink):
    """Open the Spark UI of the job the task submitted.

    The operator pushes it as soon as the driver reports its UI address (in its started file, see
    :mod:`exactly_once_provider.spark_jobs.spec`), so it works while a stream runs; the driver's UI closes when
    the job ends (an ``available-now`` run), then the link points at nothing.
    """

    name = "Spark UI"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return getattr(operator, "spark_ui_url", None) or ""


def push_link(context: Any, link: BaseOperatorLink, url: str) -> bool:
    """
    Store ``url`` as ``link``'s value now (Airflow itself stores links only when the task ends).

    Returns False when there is no task instance to store it on (``execute`` called outside a task run).
    """
    ti = context.get("ti") if hasattr(context, "get") else None
    if ti is None:
        return False
    ti.xcom_push(key=link.xcom_key, value=url)
    return True
