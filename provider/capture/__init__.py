"""Binlog capture: whole source transactions -> change records -> one Kafka transaction each batch."""
