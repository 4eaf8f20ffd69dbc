"""S3 and S3-compatible storage: put-if-absent is a ``PutObject`` with ``If-None-Match: *``.

The store must honour that header (AWS S3 since 2024-08, MinIO, ...): :func:`preflight` proves it with a probe
before anything is written, since a store that ignores it would let two writers both "create" one commit.

Credentials and the endpoint come from the standard ``aws`` Airflow connection (apache-airflow-providers-amazon:
``login``/``password`` or any credential source its hook supports, ``endpoint_url`` and ``region_name`` in the
extra): :meth:`S3Settings.from_connection`. A Spark driver gets the same settings through its 0600 secrets file
(:meth:`S3Settings.to_json`) and registers them (:func:`register_settings`), never through a command line.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from exactly_once_provider.errors import ServiceAccessError
from exactly_once_provider.storage import S3_SCHEMES

log = logging.getLogger(__name__)

# AWS answers 409 ConditionalRequestConflict while another conditional write of the key is in flight: retry, the
# answer is then PreconditionFailed (the other one won) or a success (it failed).
CONFLICT_RETRIES = 5


@dataclass(frozen=True)
class S3Settings:
    """How to reach an S3-compatible store: what the boto3 client and Spark's s3a both need.

    :param access_key_id: the access key (empty: boto3's default credential chain).
    :param secret_access_key: its secret.
    :param session_token: a temporary credential's token, if any.
    :param endpoint_url: an S3-compatible endpoint (MinIO); None for AWS.
    :param region_name: the region.
    :param addressing_style: ``path`` or ``virtual``; None lets boto3 choose.
    :param verify: TLS verification: False, or a CA bundle path; None for the default trust store.
    :param conn_id: the Airflow connection these came from, for messages.
    """

    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    endpoint_url: str | None = None
    region_name: str | None = None
    addressing_style: str | None = None
    verify: bool | str | None = None
    conn_id: str = "aws_default"

    @classmethod
    def from_connection(cls, aws_conn_id: str) -> S3Settings:
        """Read an ``aws`` Airflow connection the way the Amazon provider's S3Hook reads it.

        :param aws_conn_id: the connection id.
        """
        from airflow.providers.amazon.aws.hooks.s3 import S3Hook

        hook = S3Hook(aws_conn_id=aws_conn_id)
        wrapper = hook.conn_config
        credentials = hook.get_session().get_credentials()
        if credentials is None:
            raise ServiceAccessError(
                f"AWS connection {aws_conn_id!r} has no credentials: set its login (access key "
                "id) and password (secret access key), or a credential source the host has."
            )
        frozen = credentials.get_frozen_credentials()
        s3_config = getattr(wrapper.botocore_config, "s3", None) or {}
        return cls(
            frozen.access_key,
            frozen.secret_key,
            frozen.token,
            wrapper.get_service_endpoint_url("s3") or wrapper.endpoint_url,
            hook.conn_region_name,
            s3_config.get("addressing_style"),
            hook.verify,
            aws_conn_id,
        )

    def to_json(self) -> dict[str, Any]:
        """Return the settings for a secrets file (they hold the secret: never log or print them)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> S3Settings:
        return cls(**data)

    def client(self) -> Any:
        """Return a boto3 S3 client with these settings."""
        import boto3
        from botocore.config import Config

        config = Config(
            s3={"addressing_style": self.addressing_style} if self.addressing_style else None,
            connect_timeout=10,
            read_timeout=60,
            retries={"max_attempts": 3, "mode": "standard"},
        )
        return boto3.client(
            "s3",
            aws_access_key_id=self.access_key_id or None,
            aws_secret_access_key=self.secret_access_key or None,
            aws_session_token=self.session_token or None,
            endpoint_url=self.endpoint_url,
            region_name=self.region_name,
            verify=self.verify,
            config=config,
        )

    def arrow_filesystem(self) -> Any:
        """Return a pyarrow S3 filesystem with these settings (Parquet footers read with range requests)."""
        from urllib.parse import urlparse

        from pyarrow import fs

        options: dict[str, Any] = {
            "access_key": self.access_key_id,
            "secret_key": self.secret_access_key,
            "session_token": self.session_token,
            "region": self.region_name,
        }
        if self.endpoint_url:
            endpoint = urlparse(self.endpoint_url)
            options.update(endpoint_override=endpoint.netloc, scheme=endpoint.scheme)
        if self.addressing_style == "virtual":
            options["force_virtual_addressing"] = True
        if isinstance(self.verify, str):
            options["tls_ca_file_path"] = self.verify
        return fs.S3FileSystem(**{k: v for k, v in options.items() if v is not None})

    def delta_rs_options(self) -> dict[str, str]:
        """Return delta-rs (``deltalake``) storage options with these settings, secrets included (never log them).

        Conditional put (``etag``: ``If-None-Match: *`` on a log entry) makes delta-rs's own commits safe with
        several writers, as the provider's own commits are; plain HTTP is allowed only for an ``http://`` endpoint.
        """
        options = {
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_SESSION_TOKEN": self.session_token,
            "AWS_REGION": self.region_name,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "conditional_put": "etag",
        }
        if self.endpoint_url and self.endpoint_url.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
        if self.addressing_style == "virtual":
            options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "true"
        return {k: v for k, v in options.items() if v}

    def pyiceberg_properties(self) -> dict[str, str]:
        """Return pyiceberg's FileIO properties (``s3.*``) with these settings, secrets included (never log them).

        pyiceberg's S3 FileIO needs a region even for MinIO, so ``us-east-1`` stands in when none is set; it
        defaults to virtual-hosted addressing, which an S3-compatible endpoint on one host cannot serve.
        """
        props = {"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"}
        for key, value in (
            ("s3.endpoint", self.endpoint_url),
            ("s3.access-key-id", self.access_key_id),
            ("s3.secret-access-key", self.secret_access_key),
            ("s3.session-token", self.session_token),
            ("s3.region", self.region_name or "us-east-1"),
        ):
            if value:
                props[key] = value
        if self.addressing_style != "virtual":
            props["s3.force-virtual-addressing"] = "false"
        return props

    def hadoop_conf(self) -> dict[str, str]:
        """Return Spark's s3a settings (``spark.hadoop.fs.s3a.*``), secrets included: for in-process config only."""
        conf = {"fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
        if self.endpoint_url:
            conf["fs.s3a.endpoint"] = self.endpoint_url
            conf["fs.s3a.connection.ssl.enabled"] = str(self.endpoint_url.startswith("https://")).lower()
        if self.region_name:
            conf["fs.s3a.endpoint.region"] = self.region_name
        if self.addressing_style:
            conf["fs.s3a.path.style.access"] = str(self.addressing_style == "path").lower()
        if self.access_key_id:
            conf["fs.s3a.access.key"] = self.access_key_id
            conf["fs.s3a.secret.key"] = self.secret_access_key or ""
            provider = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
            if self.session_token:
                conf["fs.s3a.session.token"] = self.session_token
                provider = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
            conf["fs.s3a.aws.credentials.provider"] = provider
        return {f"spark.hadoop.{key}": value for key, value in conf.items()}


_registered: S3Settings | None = None


def register_settings(settings: S3Settings | None) -> None:
    """Make ``settings`` the S3 settings of this process (a Spark driver, from its secrets file)."""
    global _registered  # noqa: PLW0603 - one driver process, one set of storage credentials
    _registered = settings


def registered_settings() -> S3Settings | None:
    return _registered


def s3_settings(place: Any = None) -> S3Settings | None:
    """Return the S3 settings that reach ``place``, None for a local one: the one answer every reader asks.

    Each client renders them itself (:meth:`S3Settings.delta_rs_options`, :meth:`~S3Settings.hadoop_conf`,
    :meth:`~S3Settings.pyiceberg_properties`, :meth:`~S3Settings.client`, :meth:`~S3Settings.arrow_filesystem`).

    :param place: a storage (:func:`~exactly_once_provider.storage.open_storage`: an S3 storage's own settings),
        an ``s3://``/``s3a://`` location (the settings this process registered, :func:`register_settings`), the
        settings themselves, or a local path or None (no settings).
    """
    if place is None or isinstance(place, S3Settings):
        return place
    if isinstance(place, str):
        return registered_settings() if place.startswith(S3_SCHEMES) else None
    return getattr(place, "settings", None)  # an S3Storage carries its own; a local storage has none


def settings_for(aws_conn_id: str, *locations: str | None) -> S3Settings | None:
    """Return the settings of the ``aws`` connection if any of ``locations`` is on S3; None (nothing read) if not.

    :param aws_conn_id: the connection whose credentials and ``endpoint_url`` reach the bucket.
    :param locations: the places a task reads or writes (local paths, ``s3://`` URIs, None).
    """
    if not any(location and str(location).startswith(S3_SCHEMES) for location in locations):
        return None
    return S3Settings.from_connection(aws_conn_id)


def split_uri(location: str) -> tuple[str, str]:
    """Return ``(bucket, prefix)`` of an ``s3://``/``s3a://`` URI (prefix without slashes at the ends)."""
    scheme = next((s for s in S3_SCHEMES if location.startswith(s)), None)
    if scheme is None:
        raise ValueError(f"Not an S3 URI: {location!r} (expected s3://bucket/prefix).")
    bucket, _, prefix = location[len(scheme) :].partition("/")
    if not bucket:
        raise ValueError(f"S3 URI {location!r} names no bucket (expected s3://bucket/prefix).")
    return bucket, prefix.strip("/")


def _code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


class S3Storage:
    """Objects under ``s3://bucket/prefix``.

    :param location: the root, ``s3://bucket/prefix`` or ``s3a://bucket/prefix``.
    :param settings: how to reach the store.
    """

    def __init__(self, location: str, settings: S3Settings) -> None:
        self.bucket, self.prefix = split_uri(location)
        self.settings = settings
        self._client = None
        self._arrow_fs = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self.settings.client()
        return self._client

    def _key(self, key: str) -> str:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"A storage key is relative and stays below its root, got {key!r}.")
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_if_absent(self, key: str, data: bytes) -> bool:
        for attempt in range(CONFLICT_RETRIES):
            try:
                self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*")
                return True
            except Exception as exc:
                code = _code(exc)
                if code == "PreconditionFailed":
                    # boto3 retries a PUT whose answer was lost; the retry is then refused by our own first
                    # write. The same bytes under the key are that write (commits carry unique ids): ours.
                    return self.read(key) == data
                if code != "ConditionalRequestConflict" or attempt == CONFLICT_RETRIES - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def read(self, key: str) -> bytes | None:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except Exception as exc:
            if _code(exc) in ("NoSuchKey", "404"):
                return None
            raise

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except Exception as exc:
            if _code(exc) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        keys = []
        after = {"StartAfter": base + start_after} if start_after is not None else {}
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=base + prefix, **after
        ):
            keys += [item["Key"][len(base) :] for item in page.get("Contents", [])]
        return sorted(keys)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def delete_prefix(self, prefix: str) -> None:
        keys = [self._key(key) for key in self.list(prefix)]
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": key} for key in keys[start : start + 1000]], "Quiet": True},
            )

    def arrow_path(self, key: str) -> tuple[Any, str]:
        if self._arrow_fs is None:  # one per storage: each new one resolves credentials and opens connections
            self._arrow_fs = self.settings.arrow_filesystem()
        return self._arrow_fs, f"{self.bucket}/{self._key(key)}"

    def uri(self, key: str = "") -> str:
        path = self._key(key) if key else self.prefix
        return f"s3://{self.bucket}/{path}" if path else f"s3://{self.bucket}"

    def spark_uri(self, key: str = "") -> str:
        return "s3a://" + self.uri(key).removeprefix("s3://")

    def __repr__(self) -> str:
        return f"S3Storage({self.uri()!r}, endpoint {self.settings.endpoint_url or 'AWS'})"
