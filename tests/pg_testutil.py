"""A throwaway PostgreSQL cluster for the tests: Debian's binaries, a temp dir, a unix socket.

PostgreSQL refuses to run as root, so under root the cluster belongs to the ``postgres``
OS user (``runuser -u postgres --``); as any other user it runs as that user. No TCP
port is opened (``listen_addresses=''``): the socket lives in the cluster's directory,
so clusters of concurrent sessions never meet. ``fsync=off``: the cluster is thrown
away, durability across a machine crash is not what these tests prove. A benchmark that
times durable commits asks for ``PgCluster(durable=True)`` (fsync, full page writes and
synchronous commit on, as a production server runs).
"""

from __future__ import annotations

import glob
import hashlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import quote

PW_ROLE = "lakefuse_pw"  # a role that must log in with a password (the wrong-password test)
PW_SECRET = "s3cret-Pw"
TEST_DB = "lakefuse_test"


def pg_bindir() -> Path | None:
    """The newest Debian PostgreSQL bin directory with initdb, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def unavailable_reason() -> str | None:
    if pg_bindir() is None:
        return "PostgreSQL binaries not found (/usr/lib/postgresql/*/bin/initdb); scripts/setup.sh installs them"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' OS user to own a test cluster"
    return None


class PgCluster:
    """initdb + pg_ctl start/stop in a temp dir; :attr:`url` reaches database ``TEST_DB``."""

    def __init__(self, durable: bool = False) -> None:
        self.durable = durable
        self.bindir = pg_bindir()
        self.dir = Path(tempfile.mkdtemp(prefix="lakefuse-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        os.chmod(self.dir, 0o755)
        try:
            self._create()
        except BaseException:
            self.destroy()  # a cluster that started and then failed is never left running
            raise

    def _create(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                  "--locale=C", "--no-sync")
        hba = self.data / "pg_hba.conf"
        hba.write_text(f"local all {PW_ROLE} scram-sha-256\nlocal all all trust\n")
        self.start()
        port = f"&port={self.port}" if self.port else ""
        self.url = f"postgresql://postgres@/{TEST_DB}?host={quote(str(self.dir), safe='/')}{port}"
        import psycopg

        with psycopg.connect(self.url.replace(f"/{TEST_DB}?", "/postgres?"), autocommit=True) as c:
            c.execute(f"CREATE DATABASE {TEST_DB}")
            c.execute(f"CREATE ROLE {PW_ROLE} LOGIN SUPERUSER PASSWORD '{PW_SECRET}'")

    def _run(self, tool: str, *args: str) -> None:
        r = subprocess.run([*self._as, str(self.bindir / tool), *args], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{tool} failed ({r.returncode}): {r.stderr.strip()}\n{log}")

    port: int | None = None  # None: libpq's default (5432), on the cluster's own socket only

    def server_options(self) -> str:
        """``postgres`` options of :meth:`start` (a subclass adds TCP, TLS ...)."""
        safety = ("-c fsync=on -c full_page_writes=on -c synchronous_commit=on -c shared_buffers=128MB"
                  if self.durable else "-c fsync=off -c full_page_writes=off -c shared_buffers=32MB")
        return (f"-k {self.dir} -c listen_addresses='' {safety} -c max_connections=300"
                + (f" -p {self.port}" if self.port else ""))

    def start(self) -> None:
        opts = self.server_options()
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", opts, "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except RuntimeError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def url_with_password(self, password: str) -> str:
        return self.url.replace("postgresql://postgres@", f"postgresql://{PW_ROLE}:{quote(password)}@")


_schemas: set[tuple[str, str]] = set()


def schema_url(base_url: str, key: str) -> str:
    """``base_url`` in a schema of its own for ``key`` (a test's directory): a fresh, empty namespace."""
    name = "t_" + hashlib.sha1(key.encode()).hexdigest()[:20]
    if (base_url, name) not in _schemas:
        import psycopg

        with psycopg.connect(base_url, autocommit=True) as c:
            c.execute(f"CREATE SCHEMA IF NOT EXISTS {name}")
        _schemas.add((base_url, name))
    return f"{base_url}&options=-csearch_path%3D{name}"
