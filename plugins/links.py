"""Operator extra links: the status page of the task's pipeline, and the Spark UI of the submitted job.

Airflow 3 computes a link on the worker when the task finishes (``get_link`` with the rendered operator) and
stores it in XCom; the UI reads it from there. So the pipeline name in the link is the rendered one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

# Where the API server mounts the status page (plugins/app.py); here, so operators import no FastAPI for it.
URL_PREFIX = "/exactly-once"


# The packaged job logs "Spark UI at http://host:4040" (spark_jobs/kafka_to_sink.py); a driver whose log4j level
# is INFO also logs "Bound SparkUI to 0.0.0.0, and started at http://host:4040" (SparkUI.scala).
_SPARK_UI = re.compile(r"(?:Spark UI at|SparkUI.*started at) (https?://\S+)")


def pipeline_page_url(pipeline: str) -> str:
    """Return the status page URL showing ``pipeline`` (absolute when ``[api] base_url`` is set)."""
    from airflow.configuration import conf

    base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    return f"{base}{URL_PREFIX}/?pipeline={quote(str(pipeline), safe='')}"


class PipelineStatusLink(BaseOperatorLink):
    """Open the exactly-once status page filtered to the task's pipeline."""

    name = "Pipeline status"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        pipeline = getattr(operator, "pipeline", None)
        return pipeline_page_url(pipeline) if pipeline else ""


class SparkUILink(BaseOperatorLink):
    """Open the Spark UI of the job the task submitted.

    The operator pushes it as soon as the driver logs its UI address, so it works while a stream runs; the
    driver's UI closes when the job ends (an ``available-now`` run), then the link points at nothing.
    """

    name = "Spark UI"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return getattr(operator, "spark_ui_url", None) or ""


@contextmanager
def watch_spark_ui(hook: Any, found: Callable[[str], None]) -> Iterator[None]:
    """
    Tap the spark-submit output of ``hook`` (a ``SparkSubmitHook``) while it submits; call ``found(url)`` once
    with the driver's Spark UI address as soon as the driver logs it.

    The hook reads the output in ``_process_spark_submit_log(lines)``; the tap passes every line on to it. A
    hook without that method (another provider version) is left alone: the job runs, the link stays empty.

    :param hook: the submit hook, before ``submit()``.
    :param found: called with the UI address (e.g. to store it and push the link while the job runs).
    """
    process = getattr(hook, "_process_spark_submit_log", None)
    if process is None:
        yield
        return

    def scan(lines: Iterable[Any]) -> Iterator[Any]:
        seen = False
        for line in lines:
            if not seen and (match := _SPARK_UI.search(str(line))):
                seen = True
                found(match.group(1))
            yield line

    hook._process_spark_submit_log = lambda lines: process(scan(lines))
    try:
        yield
    finally:
        hook._process_spark_submit_log = process


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
