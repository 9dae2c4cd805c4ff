"""Shared pytest fixtures.  One section per area; append new sections below."""

from __future__ import annotations

import logging
import os
import uuid

import pytest

# =====================================================================================
# S3: a real moto server over HTTP on 127.0.0.1 (graveler.objstore tests)
#
# boto3 is never patched in-process: the stores talk HTTP to ThreadedMotoServer,
# exactly as they would to S3 or MinIO.  The session fixture points the AWS
# credential chain at dummy values (and away from ~/.aws) for the whole session.
# =====================================================================================

S3_TEST_REGION = "us-east-1"
_S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": S3_TEST_REGION,
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
_S3_ENV_UNSET = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL",
                 "AWS_ENDPOINT_URL_S3", "LAKEFUSE_S3_ENDPOINT")


@pytest.fixture(scope="session")
def s3_endpoint():
    """URL of a moto S3 server running in a thread for the whole session."""
    from moto.server import ThreadedMotoServer

    mp = pytest.MonkeyPatch()
    for name, value in _S3_ENV.items():
        mp.setenv(name, value)
    for name in _S3_ENV_UNSET:
        mp.delenv(name, raising=False)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        mp.undo()


@pytest.fixture(scope="session")
def s3_config(s3_endpoint):
    """A StoreConfig for the moto server: small multipart sizes, few retries."""
    from graveler.objstore import StoreConfig

    mib = 1 << 20
    return StoreConfig(
        s3_endpoint_url=s3_endpoint,
        region=S3_TEST_REGION,
        max_attempts=3,
        connect_timeout=5,
        read_timeout=30,
        multipart_threshold=5 * mib,
        multipart_chunksize=5 * mib,
    )


@pytest.fixture(scope="session")
def s3_client(s3_endpoint):
    """A raw boto3 client on the moto server, for test setup and checks."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name=S3_TEST_REGION)
    yield client
    client.close()


@pytest.fixture
def s3_bucket(s3_client) -> str:
    """A new, empty bucket for one test."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=name)
    return name


# =====================================================================================
# Spark: one local[2] SparkSession for the whole session (graveler.spark tests)
#
# Real Spark in local mode, workers on this interpreter.  It depends on the moto
# server so that the AWS test environment is in place before the JVM (and the Python
# workers it forks) start: executors then reach S3 exactly as the driver does.
# =====================================================================================


@pytest.fixture(scope="session")
def spark(s3_endpoint):
    from graveler.spark.session import SparkConfig, get_session

    session = get_session(SparkConfig(master="local[2]", app_name="lakefuse-tests", shuffle_partitions=4))
    try:
        yield session
    finally:
        session.stop()


# =====================================================================================
# KV backends: graveler's unit, contract and model tests run on every backend.
#
# A test in one of KV_MODULES runs once per backend of tests.graveler_testutil.KV_BACKENDS
# (ids [lmdb], [memory] and [postgres]); helpers there (make_graveler, make_repo, backend_kv) build
# repositories on the backend under test.  A test that looks at LMDB's files says so
# with @pytest.mark.lmdb_only and runs on LMDB alone.  Mount and CLI tests (remounts,
# several processes, kill -9) use the persistent backends only.
# =====================================================================================

KV_MODULES = {"test_graveler_ops", "test_graveler_model", "test_graveler_view", "test_repository_api",
              "test_refs", "test_staging", "test_kv_contract", "test_fences"}


def pytest_configure(config):
    config.addinivalue_line("markers", "lmdb_only: the test reads LMDB's own files; it runs on LMDB alone")
    config.addinivalue_line("markers", "expect_log(why): the test logs WARNING/ERROR lines on purpose")


def pytest_generate_tests(metafunc):
    from tests.graveler_testutil import KV_BACKENDS

    if metafunc.module.__name__.rsplit(".", 1)[-1] in KV_MODULES and "kv_backend" not in metafunc.fixturenames:
        metafunc.fixturenames.append("kv_backend")
    if any(m.args and "kv_backend" in m.args[0] for m in metafunc.definition.iter_markers("parametrize")):
        return  # the test names its backends itself (e.g. the mount's on lmdb and postgres)
    if "kv_backend" in metafunc.fixturenames:
        lmdb_only = metafunc.definition.get_closest_marker("lmdb_only") is not None
        metafunc.parametrize("kv_backend", ["lmdb"] if lmdb_only else list(KV_BACKENDS), indirect=True)


@pytest.fixture
def kv_backend(request):
    """The KV backend this test runs on; graveler_testutil's helpers follow it."""
    from tests import graveler_testutil

    if request.param == "postgres":
        request.getfixturevalue("postgres_url")  # skips when there is no PostgreSQL to run
    graveler_testutil.current_backend = request.param
    try:
        yield request.param
    finally:
        graveler_testutil.current_backend = "lmdb"
        if request.param == "postgres":
            from graveler.kv.postgres import close_pg_backends

            close_pg_backends()


# =====================================================================================
# PostgreSQL: a throwaway cluster for the whole session (the postgres KV backend)
#
# Debian's binaries (/usr/lib/postgresql/*/bin, installed by scripts/setup.sh) run a
# cluster in a temp dir, owned by the postgres OS user under root, on a unix socket in
# that dir (no TCP port). The fixture yields the URL of database lakefuse_test and also
# leaves it in graveler_testutil.pg_url; each test's backend_kv() gets a schema of its
# own in it. Without the binaries every postgres variant is skipped, saying why.
# =====================================================================================


@pytest.fixture(scope="session")
def postgres_cluster():
    from tests import pg_testutil

    reason = pg_testutil.unavailable_reason()
    if reason:
        pytest.skip(reason)
    cluster = pg_testutil.PgCluster()
    try:
        yield cluster
    finally:
        from graveler.kv.postgres import close_pg_backends

        close_pg_backends()
        cluster.destroy()


@pytest.fixture(scope="session")
def postgres_url(postgres_cluster):
    """libpq URL of the session's test database (postgresql://postgres@/lakefuse_test?host=SOCKETDIR)."""
    from tests import graveler_testutil

    graveler_testutil.pg_url = postgres_cluster.url
    return postgres_cluster.url


# =====================================================================================
# Honest logs: a WARNING or ERROR line logged in the test process by graveler or lakefuse
# fails the test, unless the test expects it: it uses ``caplog`` (and asserts on it), or
# says so with @pytest.mark.expect_log("why").  A warning nobody expects is either a bug
# or a message that misleads users.
# =====================================================================================

_WATCHED_LOGGERS = ("graveler", "lakefuse")


class _Unexpected(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.split(".")[0] in _WATCHED_LOGGERS:
            self.records.append(record)


@pytest.fixture(autouse=True)
def _no_unexpected_warning_logs(request):
    handler = _Unexpected()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
    if "caplog" in request.fixturenames or request.node.get_closest_marker("expect_log") is not None:
        return
    if handler.records:
        lines = "\n".join(f"  {r.levelname} {r.name}: {r.getMessage()}" for r in handler.records[:10])
        pytest.fail(f"unexpected WARNING/ERROR log lines (use caplog, or mark the test expect_log):\n{lines}",
                    pytrace=False)
