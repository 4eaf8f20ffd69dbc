"""A driver's storage settings: from its secrets file to its SparkSession builder, in the driver's own process."""

from __future__ import annotations

from exactly_once_provider.spark_jobs.session import register_storage, with_storage_conf
from exactly_once_provider.storage.s3 import S3Settings, register_settings, registered_settings


class _Builder:
    def __init__(self):
        self.settings: dict[str, str] = {}

    def config(self, key, value):
        self.settings[key] = value
        return self


def test_the_secrets_files_s3_settings_reach_the_builder_as_s3a_settings():
    settings = S3Settings("AKIA-x", "secret-x", None, "http://127.0.0.1:9000", "us-east-1", "path")
    try:
        register_storage({"kafka": {}, "s3": settings.to_json()})
        assert registered_settings() == settings
        conf = with_storage_conf(_Builder()).settings
        assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
        assert conf["spark.hadoop.fs.s3a.secret.key"] == "secret-x"
        register_storage({"kafka": {}})  # a job without S3 locations: nothing registered, nothing set
        assert registered_settings() is None and with_storage_conf(_Builder()).settings == {}
    finally:
        register_settings(None)
