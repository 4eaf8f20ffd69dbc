"""Preflight of a storage location: reachable, credentials accepted, bucket there, put-if-absent honoured.

Run before a job writes anything: each failure is a :class:`~exactly_once_provider.errors.ServiceAccessError`
naming what to fix. The only object it writes is a probe under ``_eo_preflight/``, deleted again whatever
happens, so a failed preflight leaves the location as it was.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING

from exactly_once_provider.errors import ServiceAccessError
from exactly_once_provider.storage import Storage, is_s3, open_storage

if TYPE_CHECKING:
    from exactly_once_provider.storage.s3 import S3Settings

log = logging.getLogger(__name__)

PROBE_PREFIX = "_eo_preflight/"
_CREDENTIAL_CODES = {
    "403",
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "Forbidden",
}
_MISSING_BUCKET_CODES = {"404", "NoSuchBucket", "NotFound"}


def preflight(storage: Storage) -> str:
    """Check that ``storage`` can hold exactly-once commits; return what was checked, for the task log.

    :param storage: the location to check (local or S3).
    """
    from exactly_once_provider.storage.s3 import S3Storage

    if isinstance(storage, S3Storage):
        _reach_bucket(storage)
    probe = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    try:
        try:
            first = storage.put_if_absent(probe, b"first")
        except OSError as exc:
            raise ServiceAccessError(
                f"Cannot write to {storage.uri()}: {exc}. Fix the path or its permissions."
            ) from exc
        except Exception as exc:  # boto3's ClientError: the store refused the write itself
            raise _s3_refusal(storage, exc, "write a probe object") from exc
        second = storage.put_if_absent(probe, b"second")
        if not first or second or storage.read(probe) != b"first":
            raise ServiceAccessError(
                f"{storage.uri()} does not honour conditional writes: a second PutObject with If-None-Match: * "
                "on an existing key was not refused. Exactly-once commits need put-if-absent; use a store that "
                "supports conditional writes (AWS S3, MinIO, ...) or a local path."
            )
    finally:
        try:
            storage.delete(probe)
        except Exception:  # noqa: BLE001 - the error above matters more than a probe left behind
            log.warning("could not delete the preflight probe %s", storage.uri(probe))
    log.info("storage %s: reachable, put-if-absent honoured", storage.uri())
    return f"{storage.uri()}: writable, a second put-if-absent refused"


def preflight_locations(locations: Iterable[str | None], s3: S3Settings | None) -> list[str]:
    """Preflight each distinct ``s3://`` location of ``locations``; return what was checked, for the task log.

    Local locations are left to the jobs that write them (a missing directory is created there).

    :param locations: a task's places (local paths, ``s3://``/``s3a://`` URIs, None).
    :param s3: the settings of the task's ``aws`` connection (None: no location is on S3).
    """
    on_s3 = list(dict.fromkeys(str(loc).replace("s3a://", "s3://", 1) for loc in locations if loc and is_s3(str(loc))))
    if on_s3 and s3 is None:
        raise ValueError(f"{on_s3[0]} is on S3: name the `aws` Airflow connection (aws_conn_id) that reaches it.")
    return [preflight(open_storage(location, s3)) for location in on_s3]


def _reach_bucket(storage) -> None:
    """HEAD the bucket: tells an unreachable endpoint, refused credentials and a missing bucket apart."""
    from botocore.exceptions import ClientError, NoCredentialsError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    try:
        storage.client.head_bucket(Bucket=storage.bucket)
    except BotoConnectionError as exc:
        endpoint = storage.settings.endpoint_url or "AWS S3"
        raise ServiceAccessError(
            f"Cannot reach the S3 endpoint {endpoint} of AWS connection {storage.settings.conn_id!r} ({exc}): "
            "check endpoint_url in the connection's extra and that the store is running."
        ) from exc
    except NoCredentialsError as exc:
        raise ServiceAccessError(
            f"AWS connection {storage.settings.conn_id!r} has no credentials: set its login "
            "(access key id) and password (secret access key)."
        ) from exc
    except ClientError as exc:
        raise _s3_refusal(storage, exc, f"reach bucket {storage.bucket}") from exc


def _s3_refusal(storage, exc: Exception, what: str) -> ServiceAccessError:
    code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
    conn = storage.settings.conn_id
    if code in _MISSING_BUCKET_CODES:
        endpoint = storage.settings.endpoint_url or "AWS S3"
        return ServiceAccessError(
            f"Bucket {storage.bucket!r} does not exist at {endpoint} (AWS connection {conn!r}): "
            f"create it, or fix the bucket in {storage.uri()}."
        )
    if code in _CREDENTIAL_CODES:
        return ServiceAccessError(
            f"The S3 store refused the credentials of AWS connection {conn!r} ({code}) when "
            f"trying to {what}: fix the connection's login (access key id) and password "
            "(secret access key), or grant them s3:GetObject, s3:PutObject, s3:ListBucket "
            f"and s3:DeleteObject on {storage.uri()}."
        )
    return ServiceAccessError(
        f"The S3 store refused to {what} in {storage.uri()} with AWS connection {conn!r}: {code or exc}."
    )
