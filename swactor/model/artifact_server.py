"""Artifact server: serve one GGUF over HTTP with Range support, so nodes need no shared disk.

Theory of operation: a stdlib :class:`ThreadingHTTPServer` runs in a daemon thread and
serves exactly one file at ``/<file name>``. ``HEAD`` gives ``Content-Length``,
``Accept-Ranges: bytes`` and a strong ``ETag`` that is the file's SHA-256 (computed once at
start), which stage nodes use as the content-address of their local cache. ``GET`` with a
single ``Range: bytes=a-b`` (or ``a-``, or ``-n``) answers ``206`` with exactly that slice,
streamed with ``pread`` in 1 MiB pieces; an unsatisfiable range answers ``416``; a ``GET``
without ``Range`` answers ``200`` with the whole file. ``bytes_served`` counts body bytes
sent, so tests can prove a stage downloaded only its ranges. The orchestrator's
``--serve-model PATH`` flag wraps this class.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")
_CHUNK = 1 << 20


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
        self, path: str | os.PathLike[str], *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.path = Path(path)
        self.size = self.path.stat().st_size
        self.sha256 = file_sha256(self.path)
        self.bytes_served = 0
        self.requests: list[tuple[str, str | None]] = []
        self._lock = threading.Lock()
        self._fd = os.open(self.path, os.O_RDONLY)
        self._httpd = ThreadingHTTPServer((host, port), self._handler_class())
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

    def _count(self, method: str, range_header: str | None, sent: int) -> None:
        with self._lock:
            self.requests.append((method, range_header))
            self.bytes_served += sent

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                return

            def _common(self) -> bool:
                if self.path.split("?")[0] != f"/{server.path.name}":
                    self.send_error(404, "no such artifact")
                    return False
                return True

            def do_HEAD(self) -> None:  # noqa: N802
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

            def do_GET(self) -> None:  # noqa: N802
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
                sent = 0
                try:
                    while sent < length:
                        chunk = os.pread(server._fd, min(_CHUNK, length - sent), start + sent)
                        if not chunk:
                            break
                        self.wfile.write(chunk)
                        sent += len(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                server._count("GET", range_header, sent)

        return Handler


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """``(first, last)`` inclusive for one satisfiable byte range, else ``None``."""
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
