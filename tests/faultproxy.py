"""A fault-injecting HTTP proxy for an S3 endpoint (the moto server in tests and benchmarks).

The stores talk plain HTTP to the proxy exactly as they would to S3; the proxy
forwards each request to the real endpoint and, when a rule matches, injects a
fault instead of (or into) the answer.  boto3 is never patched: what the
client sees is what a failing network or server would give it.

Kinds of fault (:class:`Fault`):

``latency``  wait ``delay`` seconds, then forward normally
``error``    answer ``status`` (default 503) with an S3 XML error body, not forwarded
``short``    forward, send the headers (full Content-Length) and only ``after``
             bytes of the body, then close the connection
``hang``     send nothing (or, with ``after``, the headers and ``after`` bytes of the
             body) and hold the connection until :meth:`FaultProxy.release` or ``delay``
             seconds (default: 1 hour) -- a hung server
``corrupt``  forward, flipping one bit of the body at byte ``after``
``reset``    close the connection at once, answering nothing
``corrupt_sent`` forward the request with one bit of its body flipped at byte ``after`` (a
             PUT damaged on the way to a store that checks no checksum of it)
``headcut``  forward, send the status line and the first ``after`` header lines of the
             answer, then close the connection (a response cut inside its headers: Python's
             HTTP client takes it for a complete answer without those headers and body)
``reranged`` forward a ranged GET asking ``after`` bytes earlier (``bytes=a-b`` becomes
             ``bytes=(a-after)-(b-after)``): the answer, its Content-Range honest, is another
             range than the one asked for (a broken cache or proxy)

A rule matches on the HTTP ``method`` (``None``: any) and on a substring of the
request path (``path``: ``None``: any); ``times`` limits how many requests it
hits (``None``: all of them).  Rules are tried in the order they were added;
the first one that matches with hits left is used.

    with FaultProxy(moto_url) as proxy:
        proxy.add(Fault("hang", method="GET", path="/bucket/data/"))
        cfg = StoreConfig(s3_endpoint_url=proxy.url, read_timeout=1, max_attempts=2)
        ...

Also usable by ``scripts/bench/faults.py`` (import ``tests.faultproxy`` from the repository root).
"""

from __future__ import annotations

import http.client
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

KINDS = ("latency", "error", "short", "hang", "corrupt", "reset", "reranged", "corrupt_sent", "headcut")
_HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}
_CHUNK = 1 << 16


@dataclass
class Fault:
    kind: str
    method: str | None = None
    path: str | None = None
    times: int | None = None
    delay: float = 0.0
    status: int = 503
    after: int = 0
    hits: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"fault kind must be one of {KINDS}, not {self.kind!r}")

    def matches(self, method: str, path: str) -> bool:
        if self.method is not None and method != self.method:
            return False
        if self.path is not None and self.path not in path:
            return False
        return self.times is None or self.hits < self.times


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of ``upstream`` (``http://host:port``) that injects faults."""

    def __init__(self, upstream: str, port: int = 0):
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be http://host:port, not {upstream!r}")
        self.upstream = (parts.hostname, parts.port or 80)
        self._lock = threading.Lock()
        self._rules: list[Fault] = []
        self._released = threading.Event()
        self.requests = 0
        self.faults = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # -- rules ----------------------------------------------------------------------------

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self._rules.append(fault)
        return fault

    def clear(self) -> None:
        """Drop every rule and let hung requests go (they are then closed)."""
        with self._lock:
            self._rules.clear()
        self.release()

    def release(self) -> None:
        """End every hang of a request that arrived before this call (the connections are
        closed), even one still sending its first bytes; a request arriving later hangs again."""
        with self._lock:
            released, self._released = self._released, threading.Event()
        released.set()

    def _pick(self, method: str, path: str) -> tuple[Fault | None, threading.Event]:
        """The rule a request meets, and the event that ends its hang: the one current when the
        request arrived (a release after that ends it, wherever the handler is by then)."""
        with self._lock:
            self.requests += 1
            for rule in self._rules:
                if rule.matches(method, path):
                    rule.hits += 1
                    self.faults += 1
                    return rule, self._released
            return None, self._released

    # -- lifetime -------------------------------------------------------------------------

    def start(self) -> "FaultProxy":
        self._thread = threading.Thread(target=self._server.serve_forever, name="faultproxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.clear()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the handler ----------------------------------------------------------------------

    def _handler_class(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):  # noqa: D401 - quiet
                log.debug("faultproxy: " + fmt, *args)

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    parts = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(parts)
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _hang(self, fault: Fault) -> None:
                self._released_at_pick.wait(fault.delay or 3600)
                self.close_connection = True

            def _error(self, fault: Fault) -> None:
                body = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InjectedFault</Code>'
                        b"<Message>fault injected by faultproxy</Message></Error>")
                self.send_response(fault.status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _forward(self) -> None:
                fault, self._released_at_pick = proxy._pick(self.command, self.path)
                body = self._body()
                if fault is not None:
                    log.debug("faultproxy: %s %s -> %s", self.command, self.path, fault.kind)
                    if fault.kind == "latency":
                        time.sleep(fault.delay)
                    elif fault.kind == "error":
                        return self._error(fault)
                    elif fault.kind == "reset":
                        self.close_connection = True
                        try:
                            self.connection.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                        return
                    elif fault.kind == "hang" and not fault.after:
                        return self._hang(fault)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
                if fault is not None and fault.kind == "corrupt_sent" and fault.after < len(body):
                    body = bytearray(body)
                    body[fault.after] ^= 0x01
                    body = bytes(body)
                if fault is not None and fault.kind == "reranged":
                    for k, v in list(headers.items()):
                        if k.lower() == "range" and v.startswith("bytes="):
                            a, _, b = v[len("bytes="):].partition("-")
                            shifted = f"{max(0, int(a) - fault.after)}-" + (str(int(b) - fault.after) if b else "")
                            headers[k] = "bytes=" + shifted
                if body or "Content-Length" in self.headers or "chunked" in self.headers.get("Transfer-Encoding", ""):
                    headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=300)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    self.send_response_only(resp.status, resp.reason)
                    length = None
                    for k, v in resp.getheaders():
                        if k.lower() in _HOP_HEADERS:
                            continue
                        if k.lower() == "content-length":
                            length = int(v)
                        self.send_header(k, v)
                    data = b"" if self.command == "HEAD" else resp.read()
                    if length is None:
                        self.send_header("Content-Length", str(len(data)))
                    if fault is not None and fault.kind == "headcut":
                        lines, self._headers_buffer = self._headers_buffer, []
                        self.wfile.write(b"".join(lines[: 1 + fault.after]))
                        self.wfile.flush()
                        self.close_connection = True
                        return
                    self.end_headers()
                    if fault is not None and fault.kind in ("short", "hang") and data:
                        self.wfile.write(data[: fault.after])
                        self.wfile.flush()
                        if fault.kind == "hang":
                            self._hang(fault)
                        self.close_connection = True
                        return
                    if fault is not None and fault.kind == "corrupt" and fault.after < len(data):
                        data = bytearray(data)
                        data[fault.after] ^= 0x01
                        data = bytes(data)
                    self.wfile.write(data)
                finally:
                    conn.close()

            def _serve(self) -> None:
                try:
                    self._forward()
                except (ConnectionError, socket.timeout, OSError) as exc:
                    log.debug("faultproxy: %s %s: %s", self.command, self.path, exc)
                    self.close_connection = True

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve

        return Handler
