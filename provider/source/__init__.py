"""The MySQL/MariaDB source: preflight, consistent snapshots and chunks, the binlog reader, watermark windows."""
