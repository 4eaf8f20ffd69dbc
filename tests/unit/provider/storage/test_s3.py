"""S3 storage without a store: URIs and keys, the settings for Spark, and what preflight makes of a store's answers.

What the store does (conditional writes refused, listing, credentials) is tested against MinIO in
tests/integration/provider/storage/test_s3.py; here a stand-in client answers as a store could.
"""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from exactly_once_provider.errors import ServiceAccessError
from exactly_once_provider.storage import open_storage
from exactly_once_provider.storage import preflight as preflight_module
from exactly_once_provider.storage.preflight import preflight, preflight_locations
from exactly_once_provider.storage.s3 import (
    S3Settings,
    S3Storage,
    register_settings,
    s3_settings,
    settings_for,
    split_uri,
)

SETTINGS = S3Settings("AKIA-test", "secret-test", None, "http://127.0.0.1:1", "us-east-1", "path", None, "aws_x")


def test_uris_split_into_bucket_and_prefix():
    assert split_uri("s3://bucket/a/b/") == ("bucket", "a/b")
    assert split_uri("s3a://bucket") == ("bucket", "")
    with pytest.raises(ValueError, match="names no bucket"):
        split_uri("s3:///x")
    storage = S3Storage("s3a://bucket/lake/t1", SETTINGS)
    assert storage.uri("_manifests/0.json") == "s3://bucket/lake/t1/_manifests/0.json"
    assert storage.spark_uri("data") == "s3a://bucket/lake/t1/data"
    assert S3Storage("s3://bucket", SETTINGS).uri() == "s3://bucket"
    with pytest.raises(ValueError, match="stays below its root"):
        storage.put("../t2/x", b"")


def test_a_driver_registers_the_settings_of_its_secrets_file():
    register_settings(S3Settings.from_json(SETTINGS.to_json()))
    try:
        storage = open_storage("s3://bucket/p")
        assert isinstance(storage, S3Storage) and storage.settings == SETTINGS
    finally:
        register_settings(None)


def test_spark_gets_s3a_settings_and_repr_hides_the_secret():
    conf = SETTINGS.hadoop_conf()
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:1"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.secret.key"] == "secret-test"
    assert conf["spark.hadoop.fs.s3a.aws.credentials.provider"].endswith("SimpleAWSCredentialsProvider")
    assert "secret-test" not in repr(SETTINGS) and "AKIA-test" not in repr(SETTINGS)
    temporary = S3Settings("k", "s", "token", None, "eu-west-1")
    assert temporary.hadoop_conf()["spark.hadoop.fs.s3a.aws.credentials.provider"].endswith(
        "TemporaryAWSCredentialsProvider"
    )


class _IgnoresConditions:
    """A store that accepts every PutObject, If-None-Match or not (what preflight must catch)."""

    def __init__(self):
        self.objects: dict[str, bytes] = {}

    def head_bucket(self, Bucket):
        return {}

    def put_object(self, Bucket, Key, Body, **_conditions):
        self.objects[Key] = Body

    def get_object(self, Bucket, Key):
        import io

        return {"Body": io.BytesIO(self.objects[Key])}

    def delete_object(self, Bucket, Key):
        self.objects.pop(Key, None)


def _storage_with(client) -> S3Storage:
    storage = S3Storage("s3://bucket/lake", SETTINGS)
    storage._client = client
    return storage


def test_preflight_refuses_a_store_that_ignores_conditional_writes_and_removes_its_probe():
    client = _IgnoresConditions()
    with pytest.raises(ServiceAccessError, match="does not honour conditional writes"):
        preflight(_storage_with(client))
    assert client.objects == {}


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("AccessDenied", "refused the credentials of AWS connection 'aws_x'"),
        ("NoSuchBucket", "Bucket 'bucket' does not exist at http://127.0.0.1:1"),
    ],
)
def test_preflight_names_what_to_fix_when_the_probe_write_is_refused(code, message):
    client = _IgnoresConditions()

    def refuse(**_kwargs):
        raise ClientError({"Error": {"Code": code}}, "PutObject")

    client.put_object = refuse
    with pytest.raises(ServiceAccessError, match=message):
        preflight(_storage_with(client))


def test_delta_rs_options_carry_the_connection_and_conditional_put():
    from exactly_once_provider.storage.s3 import S3Settings

    minio = S3Settings("AK", "SK", None, "http://127.0.0.1:19000", "us-east-1", "path")
    assert minio.delta_rs_options() == {
        "AWS_ACCESS_KEY_ID": "AK",
        "AWS_SECRET_ACCESS_KEY": "SK",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:19000",
        "conditional_put": "etag",
        "AWS_ALLOW_HTTP": "true",
    }
    aws = S3Settings(region_name="eu-west-1", addressing_style="virtual").delta_rs_options()
    assert aws == {"AWS_REGION": "eu-west-1", "conditional_put": "etag", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true"}


class _LostAnswer(_IgnoresConditions):
    """A store whose answer to the first PutObject is lost: boto3's retry then meets the object it created."""

    def put_object(self, Bucket, Key, Body, **conditions):
        from botocore.exceptions import ClientError

        if Key in self.objects and conditions.get("IfNoneMatch") == "*":
            raise ClientError({"Error": {"Code": "PreconditionFailed"}}, "PutObject")
        self.objects[Key] = Body


def test_put_if_absent_meeting_its_own_earlier_attempt_reports_the_write_as_its_own():
    client = _LostAnswer()
    storage = _storage_with(client)
    client.objects["lake/_delta_log/00000000000000000001.json"] = b"mine"  # the attempt whose answer was lost
    assert storage.put_if_absent("_delta_log/00000000000000000001.json", b"mine")
    assert not storage.put_if_absent("_delta_log/00000000000000000001.json", b"another writer's")


def test_the_connection_is_read_only_for_a_location_on_s3(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_AWS_NOWHERE", raising=False)  # reading it would fail
    assert settings_for("aws_nowhere", "/lake/t", None, "file:///lake/c") is None
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_LAKE",
        '{"conn_type": "aws", "login": "AKIA-lake", "password": "lake-s3cret", '
        '"extra": {"endpoint_url": "http://127.0.0.1:9"}}',
    )
    found = settings_for("aws_lake", "/lake/t", "s3a://lake/c")
    assert (found.access_key_id, found.endpoint_url, found.conn_id) == ("AKIA-lake", "http://127.0.0.1:9", "aws_lake")


def test_preflight_of_a_task_s_locations_checks_each_s3_place_once_and_leaves_local_ones(monkeypatch):
    checked = []
    monkeypatch.setattr(preflight_module, "preflight", lambda storage: checked.append(storage.uri()) or "ok")
    assert preflight_locations(["/lake/t", None, "s3://lake/t", "s3a://lake/t", "s3://lake/c"], SETTINGS) == [
        "ok",
        "ok",
    ]
    assert checked == ["s3://lake/t", "s3://lake/c"]
    assert preflight_locations(["/lake/t", "file:///lake/c"], None) == []
    with pytest.raises(ValueError, match=r"s3://lake/t is on S3: name the `aws` Airflow connection \(aws_conn_id\)"):
        preflight_locations(["s3://lake/t"], None)


def test_one_function_answers_which_s3_settings_reach_a_place(tmp_path):
    register_settings(SETTINGS)
    try:
        assert s3_settings(S3Storage("s3://bucket/t", SETTINGS)) is SETTINGS  # a storage's own
        assert s3_settings("s3a://bucket/t") is SETTINGS  # a location: the process's (a driver's secrets file)
        assert s3_settings(SETTINGS) is SETTINGS
        assert s3_settings(open_storage(str(tmp_path))) is None  # local: none
        assert s3_settings(str(tmp_path)) is None and s3_settings(None) is None
    finally:
        register_settings(None)
    assert s3_settings("s3://bucket/t") is None  # nothing registered


@pytest.mark.parametrize(
    "settings",
    [
        SETTINGS,
        S3Settings("AKIA-test", "secret-test", "token-test", None, None, "virtual", None, "aws_y"),
        S3Settings(None, None, None, "https://s3.example", "eu-west-1", None, "/ca.pem", "aws_z"),
    ],
    ids=["minio", "aws-session", "default-chain"],
)
def test_pyiceberg_gets_its_file_io_properties_from_the_settings(settings):
    props = settings.pyiceberg_properties()
    assert props["py-io-impl"] == "pyiceberg.io.pyarrow.PyArrowFileIO"
    assert props["s3.region"] == (settings.region_name or "us-east-1")  # pyiceberg needs one, MinIO too
    assert props.get("s3.endpoint") == settings.endpoint_url
    assert props.get("s3.access-key-id") == settings.access_key_id
    assert props.get("s3.session-token") == settings.session_token
    assert ("s3.force-virtual-addressing" in props) == (settings.addressing_style != "virtual")
