"""PySpark jobs shipped inside the package and submitted as files (``spark-submit <path of the module>``).

``kafka_to_sink`` is the streaming job: Kafka (read_committed) -> one of three sinks whose commit carries
``(pipeline, checkpoint id, batch id, Kafka end offsets)`` in the same atomic step as the data.
"""
