"""Kafka: the exactly-once writer, the offsets ledger, watermark windows in it, topic reads and lag."""
