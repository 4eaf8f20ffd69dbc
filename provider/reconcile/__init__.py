"""Reconciliation: source vs sink per key range (counts + checksums), bisected down to the differing keys."""
