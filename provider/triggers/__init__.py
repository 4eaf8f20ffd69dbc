"""Deferrable triggers (they run in the triggerer, so they live in the installed package)."""
