"""A PostgreSQL KV over TLS: ``sslmode`` in the URL is libpq's, and the connection is encrypted.

A cluster of its own listens on 127.0.0.1 with a self-signed certificate (openssl), and
accepts only TLS connections (``hostssl`` in pg_hba.conf); the session's cluster speaks on
a unix socket, where TLS does not apply."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess

import pytest

from graveler import Graveler, GravelerConfig
from graveler.errors import InvalidArgument
from tests import pg_testutil

pytestmark = pytest.mark.usefixtures("postgres_url")  # skips like the other PostgreSQL tests


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TlsCluster(pg_testutil.PgCluster):
    """The test cluster, also listening on 127.0.0.1:``port``, for TLS connections only."""

    def __init__(self) -> None:
        self.port = _free_port()
        super().__init__()

    def server_options(self) -> str:
        crt, key = self.data / "server.crt", self.data / "server.key"
        if not crt.exists():
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                            "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(crt)],
                           check=True, capture_output=True, timeout=60)
            os.chmod(key, 0o600)
            if self._as:
                pw = pwd.getpwnam("postgres")
                for f in (crt, key):
                    os.chown(f, pw.pw_uid, pw.pw_gid)
            hba = self.data / "pg_hba.conf"
            hba.write_text(hba.read_text() + "hostssl all all 127.0.0.1/32 trust\n")
        return (super().server_options().replace("listen_addresses=''", "listen_addresses=127.0.0.1")
                + " -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key")


@pytest.fixture(scope="module")
def tls_cluster():
    c = TlsCluster()
    yield c
    from graveler.kv.postgres import close_pg_backends

    close_pg_backends()
    c.destroy()


def test_sslmode_require_is_encrypted_and_works(tls_cluster, tmp_path):
    import psycopg

    url = f"postgresql://postgres@127.0.0.1:{tls_cluster.port}/{pg_testutil.TEST_DB}?sslmode=require"
    g = Graveler(GravelerConfig.from_home(tmp_path / "home", kv_url=url))
    repo = g.create_repository("tls", (tmp_path / "ns").as_uri())
    src = tmp_path / "f"
    src.write_bytes(b"over tls")
    repo.upload("main", "f", str(src))
    assert repo.commit("main", "c").message == "c"
    g.close()
    with psycopg.connect(url) as c:
        assert c.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()[0] is True


def test_sslmode_disable_is_refused_by_a_tls_only_server(tls_cluster, tmp_path):
    url = f"postgresql://postgres@127.0.0.1:{tls_cluster.port}/{pg_testutil.TEST_DB}?sslmode=disable"
    with pytest.raises(InvalidArgument) as e:  # a login the server refuses: no retry can help (exit 2)
        Graveler(GravelerConfig.from_home(tmp_path / "home", kv_url=url)).list_repositories()
    assert "refused the login" in str(e.value) and "no pg_hba.conf entry" in str(e.value) and "\n" not in str(e.value)
