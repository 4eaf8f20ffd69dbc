"""PySpark jobs shipped inside the package and submitted as files by the operators' one base,
:class:`~exactly_once_provider.operators.spark_submit.PackagedSparkJobOperator` (``spark-submit <module file>
--spec <job spec>``).

``kafka_to_sink`` is the streaming job: Kafka (read_committed) -> one of three sinks whose commit carries
``(pipeline, checkpoint id, batch id, Kafka end offsets)`` in the same atomic step as the data.
``settlement_report`` sums one settled window. ``spec`` is what every job receives and answers with; ``driver``
and ``session`` are what every job's driver does first.
"""
