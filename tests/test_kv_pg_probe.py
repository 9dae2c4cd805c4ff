"""pg_probe: where a PostgreSQL URL's one server is, and whether something there answers a
client's first packet at once -- against sockets of this test (no server needed): one that
answers, one that takes the connection and never answers (a hung server), and none."""

from __future__ import annotations

import socket
import threading
import time

from graveler.kv.pg_probe import PROBE_TIMEOUT_S, hung, server_address


def test_the_address_of_the_one_server_a_url_names():
    assert server_address({"host": "127.0.0.1", "port": "5433"})[1] == ("127.0.0.1", 5433)
    assert server_address({"host": "db.example", "hostaddr": "10.0.0.7"})[1] == ("10.0.0.7", 5432)
    assert server_address({"host": "/tmp/x"}) == (socket.AF_UNIX, "/tmp/x/.s.PGSQL.5432")
    assert server_address({"host": "/tmp/x", "port": "6000"})[1] == "/tmp/x/.s.PGSQL.6000"
    # several hosts or a service: which one would serve is libpq's to find out: no probe
    assert server_address({"host": "h1,h2", "port": ","}) is None
    assert server_address({"service": "lake"}) is None


def _listener(answer: bytes | None):
    """A TCP socket on 127.0.0.1 that answers each connection with ``answer`` once it read 8
    bytes (None: it accepts nothing -- the kernel still completes the connection, as for a
    server stopped with SIGSTOP)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    if answer is not None:
        def serve():
            while True:
                try:
                    c, _ = srv.accept()
                except OSError:
                    return
                with c:
                    c.recv(8)
                    c.sendall(answer)
        threading.Thread(target=serve, daemon=True).start()
    return srv


def test_a_server_that_answers_one_that_hangs_and_none():
    up, stuck = _listener(b"N"), _listener(None)
    try:
        assert not hung((socket.AF_UNSPEC, up.getsockname()))
        t0 = time.monotonic()
        assert hung((socket.AF_UNSPEC, stuck.getsockname()))
        assert PROBE_TIMEOUT_S - 0.05 <= time.monotonic() - t0 < PROBE_TIMEOUT_S + 0.5
        port = stuck.getsockname()[1]
    finally:
        up.close()
        stuck.close()
    t0 = time.monotonic()
    # nothing there (refused): not a hang -- libpq's own connect fails as fast and says why
    assert not hung((socket.AF_UNSPEC, ("127.0.0.1", port)))
    assert not hung((socket.AF_UNIX, "/nonexistent/.s.PGSQL.5432"))
    assert time.monotonic() - t0 < PROBE_TIMEOUT_S
