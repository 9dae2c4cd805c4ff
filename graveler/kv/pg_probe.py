"""Whether a PostgreSQL server answers at all, in a fraction of a second.

A server that hangs (stopped with ``SIGSTOP``, wedged, a proxy that holds the packets) costs
each KV statement its whole watch (:data:`graveler.kv.pg_wire.STATEMENT_TIMEOUT_S`) and each
new connection its connect timeout: a mount request that makes three KV calls waited 17 s, and
every later one 7 s. After such a failure the backend asks this probe before each call, for a
while: a TCP (or unix-socket) connection to the server's address and the 8-byte ``SSLRequest``
every client may open with, whose one-byte answer ('S' or 'N') the server sends at once, before
any login. No answer within :data:`PROBE_TIMEOUT_S` (:func:`hung`), and the call fails at once;
an answer, and the call goes ahead as usual (the moment the server is back, work resumes); no
server at all (refused, no socket), and the call goes ahead too -- libpq fails it as fast, and
says why. Where the URL names several hosts the probe cannot tell which would serve: no probe.
"""

from __future__ import annotations

import os
import socket
import struct

PROBE_TIMEOUT_S = 0.3
_SSL_REQUEST = struct.pack("!ii", 8, 80877103)
_DEFAULT_SOCKET_DIRS = ("/var/run/postgresql", "/tmp")


def server_address(params: dict[str, str]) -> tuple[int, object] | None:
    """(address family, address) of the one server libpq's ``params`` reach, or None (several
    hosts, a service file, or a default socket that is not there)."""
    if "service" in params or os.environ.get("PGSERVICE"):
        return None
    host = params.get("hostaddr") or params.get("host") or os.environ.get("PGHOST") or ""
    port = params.get("port") or os.environ.get("PGPORT") or "5432"
    if "," in host or "," in port or not port.isdigit():
        return None
    if not host:  # libpq's default: the compiled-in socket directory (Debian's), else /tmp
        host = next((d for d in _DEFAULT_SOCKET_DIRS if os.path.exists(f"{d}/.s.PGSQL.{port}")), "")
        if not host:
            return None
    if host.startswith("/") or host.startswith("@"):  # a unix socket's directory (@: an abstract one)
        path = f"{host}/.s.PGSQL.{port}"
        return socket.AF_UNIX, "\0" + path[1:] if path.startswith("@") else path
    return socket.AF_UNSPEC, (host, int(port))


def hung(address: tuple[int, object], timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the server at ``address`` (:func:`server_address`) is there but does not answer an
    ``SSLRequest`` within ``timeout`` seconds (its connect or its answer timed out). False when it
    answered, and when nothing is there (refused, no socket: a stopped server, which libpq tells
    as fast)."""
    family, where = address
    try:
        if family == socket.AF_UNIX:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(where)
        else:
            sock = socket.create_connection(where, timeout=timeout)
    except (TimeoutError, BlockingIOError):  # (EAGAIN: a unix socket whose queue is full -- nobody takes them)
        return True
    except OSError:
        return False
    with sock:
        try:
            sock.sendall(_SSL_REQUEST)
            sock.recv(1)
        except TimeoutError:
            return True
        except OSError:  # (reset: not a hang)
            return False
    return False


__all__ = ["PROBE_TIMEOUT_S", "hung", "server_address"]
