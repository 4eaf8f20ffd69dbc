"""Hooks of the exactly-once provider: MySQL/MariaDB source, Kafka transactional producer."""
