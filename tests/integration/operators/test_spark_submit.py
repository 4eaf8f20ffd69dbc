"""The driver class archive with a real JVM: the first driver writes it as it exits, the next starts from it."""

from __future__ import annotations

import json
import sys

from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator
from tests import spark_job_support as jobs
from tests.kafka_support import new_topic


def _shared_classes(log_file) -> int:
    """Count the classes the driver JVM loaded from the dynamic archive (its top layer)."""
    return sum("source: shared objects file (top)" in line for line in log_file.read_text().splitlines())


def test_the_first_driver_writes_the_class_archive_and_the_next_starts_from_it(
    stack, airflow_connections, tmp_path, monkeypatch
):
    monkeypatch.delenv("SPARK_SUBMIT_OPTS", raising=False)  # the test session's own archive
    archives = tmp_path / "cds"
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT",
        json.dumps({"conn_type": "spark", "host": "local[*]", "extra": {"driver-class-archive-dir": str(archives)}}),
    )
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=1)
    committed = jobs.produce_interleaved(bootstrap, topic, transactions=3, per_transaction=20, partitions=1)
    table = f"eo_cds_{topic.replace('-', '_')}"
    states = []
    for run in (1, 2):
        classes = tmp_path / f"classes-{run}.log"
        op = SparkKafkaToSinkOperator(
            task_id="stream",
            checkpoint_location=str(tmp_path / "checkpoint"),
            pipeline=f"cds-{topic}",
            topics=[topic],
            sink="postgres",
            sink_table=table,
            env_vars={"PYSPARK_PYTHON": sys.executable},
            conf={
                "spark.jars": stack.spark_conf()["spark.jars"],
                "spark.ui.enabled": "false",
                "spark.driver.extraJavaOptions": f"-Xlog:class+load=info:file={classes}",
            },
        )
        states.append(op.execute({}))
        written = sorted(archives.iterdir())
        assert [path.suffix for path in written] == [".jsa"], written  # whole, no partial file left
        assert _shared_classes(classes) == 0 if run == 1 else _shared_classes(classes) > 5000
    assert states[0]["rows_this_run"] == len(committed) and states[1]["rows_this_run"] == 0
    jobs.assert_exactly(jobs.postgres_rows(stack, table), committed)
