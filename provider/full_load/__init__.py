"""Consistent full load of a MySQL/MariaDB table into a lakehouse table, chunked, resumable, atomic."""
