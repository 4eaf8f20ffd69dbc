"""One storage layer for every place the product keeps state: local paths and ``s3://``/``s3a://`` URIs.

A :class:`Storage` is rooted at a location and addresses objects by keys relative to it (``/``-separated).
Its ONE atomic primitive is :meth:`Storage.put_if_absent`: the object is created whole, or nothing is written
and False is returned because the key exists. Locally it is a fsynced temporary file hard-linked to its name
(``link`` fails on an existing name); on S3 a ``PutObject`` with ``If-None-Match: *``. Every commit the product
makes on storage is built on it; a rename is never relied on for atomicity (object stores have none).
:meth:`Storage.put` overwrites (hints only, such as a pointer that readers verify), the rest reads.

:func:`open_storage` is the one place that maps a location to its storage. S3 needs settings
(:class:`~exactly_once_provider.storage.s3.S3Settings`, read from the standard ``aws`` Airflow connection by
:meth:`~exactly_once_provider.storage.s3.S3Settings.from_connection`); a Spark driver registers the ones of its
secrets file with :func:`~exactly_once_provider.storage.s3.register_settings`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from exactly_once_provider.storage.s3 import S3Settings

S3_SCHEMES = ("s3://", "s3a://")


def is_s3(location: str) -> bool:
    """Return whether ``location`` is an ``s3://`` or ``s3a://`` URI."""
    return location.startswith(S3_SCHEMES)


def comparable_location(uri: str) -> str:
    """Return a file's location without scheme and percent-encoding (``bucket/key`` on S3, ``/path`` locally): how
    the names Spark reports (``_metadata.file_path``) and a table log's or manifest's names are compared."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(uri)
    path = unquote(parsed.path)
    return (parsed.netloc + path) if parsed.scheme not in ("", "file") else "/" + path.lstrip("/")


@runtime_checkable
class Storage(Protocol):
    """Objects under one root, with put-if-absent as the only atomic write."""

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` holding ``data`` whole; return False, writing nothing, if ``key`` exists."""

    def put(self, key: str, data: bytes) -> None:
        """Create or overwrite ``key`` (a reader sees the old or the new object whole, never a mix)."""

    def read(self, key: str) -> bytes | None:
        """Return the object's bytes, or None if there is no such key."""

    def exists(self, key: str) -> bool:
        """Return whether ``key`` exists."""

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        """Return the keys starting with ``prefix``, sorted (keys, not directories: every object below).

        :param start_after: only keys after this one (S3's ``StartAfter``: the store skips the earlier keys).
        """

    def delete(self, key: str) -> None:
        """Delete ``key``; a missing key is no error."""

    def delete_prefix(self, prefix: str) -> None:
        """Delete every object whose key starts with ``prefix`` (a batch's files; not atomic)."""

    def arrow_path(self, key: str) -> tuple[Any, str]:
        """Return ``(pyarrow filesystem, path)`` of ``key``: Parquet footers and rows read without a download."""

    def uri(self, key: str = "") -> str:
        """Return the location of ``key`` as readers outside this layer name it (a path, ``s3://`` URI)."""

    def spark_uri(self, key: str = "") -> str:
        """Return the location of ``key`` as Spark names it (a path, an ``s3a://`` URI)."""


def open_storage(location: str, s3: S3Settings | None = None) -> Storage:
    """Return the storage rooted at ``location``: THE dispatch on the kind of location.

    :param location: a local path, ``file://`` URI, or ``s3://bucket/prefix`` (``s3a://`` is the same place).
    :param s3: the S3 settings (an ``s3://`` location without them uses those the process registered).
    """
    if not location:
        raise ValueError("A storage location is required: a local path or an s3://bucket/prefix URI.")
    if is_s3(location):
        from exactly_once_provider.storage.s3 import S3Storage, registered_settings

        settings = s3 or registered_settings()
        if settings is None:
            raise ValueError(
                f"{location} is on S3 but no S3 settings were given: name the `aws` Airflow connection "
                "(aws_conn_id) whose credentials and endpoint_url reach it."
            )
        return S3Storage(location, settings)
    if "://" in location and not location.startswith("file://"):
        raise ValueError(f"Unsupported storage location {location!r}: use a local path, file://, s3:// or s3a://.")
    from exactly_once_provider.storage.local import LocalStorage

    return LocalStorage(location.removeprefix("file://"))
