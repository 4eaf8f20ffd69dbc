"""Operators and sensors of the exactly-once provider."""
