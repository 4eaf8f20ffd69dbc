"""Sinks: what a batch commits (``base``), the Delta, PostgreSQL and files sinks, and their commit primitives."""
