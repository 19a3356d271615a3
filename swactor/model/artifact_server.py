"""Artifact server: serve one GGUF over HTTP with Range support, so nodes need no shared disk.

Theory of operation: a stdlib :class:`ThreadingHTTPServer` runs in a daemon thread and
serves exactly one file at ``/<file name>``. ``HEAD`` gives ``Content-Length``,
``Accept-Ranges: bytes`` and a strong ``ETag`` that is the file's SHA-256 (computed once at
start), which stage nodes use as the content-address of their local cache. ``GET`` with a
single ``Range: bytes=a-b`` (or ``a-``, or ``-n``) answers ``206`` with exactly that slice,
streamed with ``pread`` in 1 MiB pieces; an unsatisfiable range answers ``416``; a ``GET``
without ``Range`` answers ``200`` with the whole file. ``bytes_served`` counts body bytes
handed to the connection, each piece before it is written (a client that has read a
body finds it counted), so tests can prove a stage downloaded only its ranges. A plan
whose weight source is an ``HttpUrl`` has each node read its ranges from such a server;
the orchestrator's command line offers the model over QUIC instead (``--offer-model``).

Limits (it listens on a network port, so every request is untrusted): at most
``max_connections`` connections are served at once (one thread each; a connection over
the cap is closed at once, unanswered); each socket operation times out after
``timeout_s`` (an idle or trickling client loses its connection and its thread); the
stdlib parser bounds the request line and each header line (64 KiB) and the header
count (100); a ``Range`` header longer than ``MAX_RANGE_HEADER`` characters, or with
several ranges, is ``416``; ``requests`` keeps only the latest ``REQUESTS_KEPT``
(method, range) pairs, each range cut to ``MAX_RANGE_HEADER`` characters.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

_RANGE_RE = re.compile(r"^bytes=(\d{0,20})-(\d{0,20})$")
_CHUNK = 1 << 20
MAX_CONNECTIONS = 32
TIMEOUT_S = 30.0
MAX_RANGE_HEADER = 64
REQUESTS_KEPT = 1024


class _CappedServer(ThreadingHTTPServer):
    """A thread per connection, at most `slots` at once; the rest are closed at once."""

    def __init__(self, address: tuple[str, int], handler: Any, slots: int) -> None:
        self._slots = threading.BoundedSemaphore(slots)
        self.refused_connections = 0
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused_connections += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file, read in 4 MiB pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(4 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class ArtifactServer:
    """Serve one file with HTTP Range support from a background thread."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_connections: int = MAX_CONNECTIONS,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self.path = Path(path)
        self.size = self.path.stat().st_size
        self.sha256 = file_sha256(self.path)
        self.bytes_served = 0
        self.timeout_s = timeout_s
        self.requests: deque[tuple[str, str | None]] = deque(maxlen=REQUESTS_KEPT)
        """The latest (method, Range header cut to `MAX_RANGE_HEADER`) pairs."""
        self._lock = threading.Lock()
        self._fd = os.open(self.path, os.O_RDONLY)
        self._httpd = _CappedServer((host, port), self._handler_class(), max_connections)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/{self.path.name}"

    def start(self) -> ArtifactServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="swactor-artifact-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        os.close(self._fd)

    def __enter__(self) -> ArtifactServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def refused_connections(self) -> int:
        """Connections closed unanswered because `max_connections` were being served."""
        return self._httpd.refused_connections

    def _count(self, method: str, range_header: str | None, sent: int) -> None:
        kept = None if range_header is None else range_header[:MAX_RANGE_HEADER]
        with self._lock:
            self.requests.append((method, kept))
            self.bytes_served += sent

    def _add_sent(self, sent: int) -> None:
        with self._lock:
            self.bytes_served += sent

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = server.timeout_s  # every socket operation (StreamRequestHandler)

            def log_message(self, format: str, *args: object) -> None:
                return

            def _common(self) -> bool:
                if self.path.split("?")[0] != f"/{server.path.name}":
                    self.send_error(404, "no such artifact")
                    return False
                return True

            def do_HEAD(self) -> None:
                if not self._common():
                    return
                self.send_response(200)
                self._headers(server.size)
                self.end_headers()
                server._count("HEAD", None, 0)

            def _headers(self, length: int) -> None:
                self.send_header("Content-Length", str(length))
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("ETag", f'"{server.sha256}"')
                self.send_header("Content-Type", "application/octet-stream")

            def do_GET(self) -> None:
                if not self._common():
                    return
                range_header = self.headers.get("Range")
                start, end = 0, server.size - 1
                status = 200
                if range_header is not None:
                    parsed = _parse_range(range_header, server.size)
                    if parsed is None:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{server.size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        server._count("GET", range_header, 0)
                        return
                    start, end = parsed
                    status = 206
                length = end - start + 1
                self.send_response(status)
                self._headers(length)
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{server.size}")
                self.end_headers()
                server._count("GET", range_header, 0)
                sent = 0
                try:
                    while sent < length:
                        chunk = os.pread(server._fd, min(_CHUNK, length - sent), start + sent)
                        if not chunk:
                            break
                        # counted before the write: a client that has read these bytes
                        # finds them in bytes_served
                        server._add_sent(len(chunk))
                        self.wfile.write(chunk)
                        sent += len(chunk)
                except (TimeoutError, BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

        return Handler


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """``(first, last)`` inclusive for one satisfiable byte range, else ``None``."""
    if len(header) > MAX_RANGE_HEADER:
        return None
    match = _RANGE_RE.match(header.strip())
    if match is None:
        return None
    first_text, last_text = match.groups()
    if first_text == "":
        if last_text == "" or int(last_text) == 0:
            return None
        suffix = min(int(last_text), size)
        return size - suffix, size - 1
    first = int(first_text)
    last = size - 1 if last_text == "" else min(int(last_text), size - 1)
    if first >= size or last < first:
        return None
    return first, last
