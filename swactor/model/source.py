"""Byte sources for a GGUF file: local path, HTTP(S) with Range requests, content-addressed cache.

Theory of operation: the range reader needs exactly two things from wherever a GGUF lives,
its total ``size()`` and ``read(offset, length)`` of one byte range. Every source implements
that pair (:class:`ByteSource`) and counts the bytes it actually pulled from its backing
store in ``bytes_read``, so a stage can report how much of the file it touched.

* :class:`LocalFileSource` — ``os.pread`` on a path; a short read is ``Truncated``.
* :class:`HttpRangeSource` — one ``GET`` with ``Range: bytes=a-b`` per read. A server that
  answers ``200`` (ignoring the range) is refused rather than letting a stage download the
  whole file; the size and the identity (strong ``ETag``, ``Last-Modified``) come from one
  ``HEAD``. What the server sends is bounded before it costs anything: a size over
  ``MAX_REMOTE_FILE`` is refused, a body is read to at most the requested length plus one
  byte (more is an error), an error answer's body is never read, and every request times
  out. Small reads (``SMALL_READ`` bytes or fewer: a header's prefix) are kept per
  process by URL, validators and range (``SMALL_READS_KEPT`` bytes at most), so a process
  that opens one URL several times (the orchestrator reads the planning facts and the
  tokenizer) downloads its header once.
* :class:`CachedSource` — wraps another source; each range is stored once as
  ``<cache>/<digest>/<offset>-<length>`` (written to a temporary name, then renamed), so a
  second run with the same digest reads nothing from the inner source. The digest is the
  file's identity: given by the plan, or the server's ``ETag`` when it is a hex digest
  (our artifact server sends the file's SHA-256); for a server whose ``ETag`` is not one,
  the key is the SHA-256 of the URL, size, ``ETag`` and ``Last-Modified``
  (:meth:`HttpRangeSource.cache_key`): the server's own validators, not a content digest.

Digest check (:func:`verify_sha256`): a plan's ``sha256`` names the whole file. A local
file is streamed once through SHA-256 (1 MiB reads, hashlib releases the GIL: ~0.1-0.3 s
for SmolLM2's ~100 MB on one core), and the result is remembered by the file's
(device, inode, size, mtime) so that a node verifies a file once, not once per run; the
stage's own range reads then come from the page cache. A URL is checked by the artifact
server's strong ``ETag`` (its SHA-256); its ranges are not hashed, since a stage fetches
only its own layers and a whole-file digest cannot be checked from part of the file.
A mismatch is ``DigestMismatch`` naming both digests.

Failures are :class:`~swactor.model.errors.WeightsError` with ``DownloadFailed``,
``Truncated``, ``SourceInvalid``, ``CacheCorrupt`` or ``DigestMismatch``; no payload
bytes enter a message.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Protocol

from swactor.model.errors import WeightsError, WeightsFault

_DIGEST_RE = re.compile(r"^[0-9a-fA-F]{16,128}$")
_SHA256_RE = re.compile(r"^[0-9a-fA-F]{64}$")
MAX_REMOTE_FILE = 1 << 40
"""The largest file a URL may claim to be (1 TiB)."""
SMALL_READ = 4 << 20
SMALL_READS_KEPT = 16 << 20


def is_url(location: str | os.PathLike[str]) -> bool:
    """True for an http:// or https:// location."""
    return os.fspath(location).startswith(("http://", "https://"))


_small_reads: dict[tuple[object, ...], bytes] = {}
_small_reads_lock = threading.Lock()


def forget_small_reads() -> None:
    """Drop the process's kept small reads (a benchmark measuring each reader's bytes)."""
    with _small_reads_lock:
        _small_reads.clear()


class ByteSource(Protocol):
    """Random access to the bytes of one GGUF file."""

    name: str
    bytes_read: int

    def size(self) -> int: ...

    def read(self, offset: int, length: int) -> bytes: ...


class LocalFileSource:
    """A GGUF on the local file system, read with ``pread``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.name = str(self.path)
        self.bytes_read = 0
        try:
            self._fd = os.open(self.path, os.O_RDONLY)
        except OSError as exc:
            raise WeightsError(
                WeightsFault.SourceInvalid, f"cannot open {self.name}: {exc.strerror}"
            ) from None
        self._size = os.fstat(self._fd).st_size

    def size(self) -> int:
        return self._size

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self._size:
            raise WeightsError(
                WeightsFault.Truncated,
                f"{self.name}: range [{offset}, {offset + length}) beyond end of file "
                f"({self._size} bytes)",
            )
        chunks: list[bytes] = []
        done = 0
        while done < length:
            chunk = os.pread(self._fd, min(length - done, 1 << 26), offset + done)
            if not chunk:
                raise WeightsError(
                    WeightsFault.Truncated, f"{self.name}: file ended at {offset + done}"
                )
            chunks.append(chunk)
            done += len(chunk)
        self.bytes_read += length
        return b"".join(chunks)

    def close(self) -> None:
        os.close(self._fd)

    def __del__(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            os.close(self._fd)


class HttpRangeSource:
    """A GGUF served over HTTP(S); every read is one ranged ``GET``."""

    def __init__(self, url: str, *, timeout_s: float = 60.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise WeightsError(WeightsFault.SourceInvalid, f"not an http(s) URL: {url!r}")
        self.url = url
        self.name = url
        self.bytes_read = 0
        self.timeout_s = timeout_s
        self._size: int | None = None
        self._etag: str | None = None
        self._modified: str | None = None

    def _head(self) -> None:
        request = urllib.request.Request(self.url, method="HEAD")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                length = response.headers.get("Content-Length")
                etag = response.headers.get("ETag")
                modified = response.headers.get("Last-Modified")
        except urllib.error.HTTPError as exc:
            raise WeightsError(
                WeightsFault.DownloadFailed,
                f"HEAD {self.url}: HTTP {exc.code} {str(exc.reason)[:80]}",
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise WeightsError(
                WeightsFault.DownloadFailed, f"HEAD {self.url} failed: {exc}"
            ) from None
        if length is None or not length.isdigit() or len(length) > 20:
            raise WeightsError(
                WeightsFault.DownloadFailed, f"HEAD {self.url}: no usable Content-Length"
            )
        if int(length) > MAX_REMOTE_FILE:
            raise WeightsError(
                WeightsFault.SourceInvalid,
                f"HEAD {self.url}: Content-Length {length} is over {MAX_REMOTE_FILE} bytes",
            )
        self._size = int(length)
        if etag is not None:
            self._etag = etag.strip().removeprefix("W/").strip('"')[:256]
        if modified is not None:
            self._modified = modified.strip()[:256]

    def size(self) -> int:
        if self._size is None:
            self._head()
        assert self._size is not None
        return self._size

    def etag(self) -> str | None:
        """The server's entity tag (our artifact server sends the file's SHA-256)."""
        if self._size is None:
            self._head()
        return self._etag

    def content_sha256(self) -> str | None:
        """The file's SHA-256 when the server's ``ETag`` is one (64 hex digits), else None."""
        etag = self.etag()
        return etag.lower() if etag is not None and _SHA256_RE.match(etag) else None

    def cache_key(self) -> str:
        """The model cache's key for this file (module doc): the ``ETag`` when it is a hex
        digest, else the SHA-256 of the URL, size, ``ETag`` and ``Last-Modified``."""
        etag = self.etag()
        if etag is not None and _DIGEST_RE.match(etag):
            return etag.lower()
        validators = f"{self.url}\n{self.size()}\n{etag}\n{self._modified}"
        return hashlib.sha256(validators.encode()).hexdigest()

    def read(self, offset: int, length: int) -> bytes:
        if length == 0:
            return b""
        size = self.size()
        if offset < 0 or offset + length > size:
            raise WeightsError(
                WeightsFault.Truncated,
                f"{self.url}: range [{offset}, {offset + length}) beyond end ({size} bytes)",
            )
        small = length <= SMALL_READ
        key = (self.url, size, self._etag, self._modified, offset, length)
        if small:
            with _small_reads_lock:
                known = _small_reads.get(key)
            if known is not None:
                return known
        data = self._get(offset, length)
        self.bytes_read += length
        if small:
            with _small_reads_lock:
                while _small_reads and sum(map(len, _small_reads.values())) + length > \
                        SMALL_READS_KEPT:
                    del _small_reads[next(iter(_small_reads))]
                _small_reads[key] = data
        return data

    def _get(self, offset: int, length: int) -> bytes:
        last = offset + length - 1
        request = urllib.request.Request(self.url, headers={"Range": f"bytes={offset}-{last}"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                if response.status != 206:
                    raise WeightsError(
                        WeightsFault.DownloadFailed,
                        f"GET {self.url}: server answered {response.status} to a Range "
                        "request: it does not serve byte ranges, which swactor needs "
                        "(each stage reads only its own layers)",
                    )
                expected = f"bytes {offset}-{last}/"
                content_range = response.headers.get("Content-Range", "")
                if not content_range.startswith(expected):
                    raise WeightsError(
                        WeightsFault.DownloadFailed,
                        f"GET {self.url}: Content-Range {content_range!r} does not match "
                        f"the requested range {offset}-{last}",
                    )
                data: bytes = response.read(length + 1)
        except WeightsError:
            raise
        except urllib.error.HTTPError as exc:
            raise WeightsError(
                WeightsFault.DownloadFailed,
                f"GET {self.url} bytes {offset}-{last}: HTTP {exc.code} {str(exc.reason)[:80]}",
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise WeightsError(
                WeightsFault.DownloadFailed, f"GET {self.url} bytes {offset}-{last}: {exc}"
            ) from None
        if len(data) != length:
            raise WeightsError(
                WeightsFault.Truncated,
                f"GET {self.url}: got {len(data)} bytes for a {length}-byte range",
            )
        return data


class CachedSource:
    """Content-addressed cache in front of another source, keyed by file digest and range."""

    def __init__(self, inner: ByteSource, cache_dir: str | os.PathLike[str], digest: str) -> None:
        if not _DIGEST_RE.match(digest):
            raise WeightsError(
                WeightsFault.SourceInvalid, f"file digest {digest!r} is not a hex string"
            )
        self.inner = inner
        self.name = f"cache:{digest[:16]}:{inner.name}"
        self.digest = digest.lower()
        self.root = Path(cache_dir) / self.digest
        self.bytes_read = 0
        self.cache_hit_bytes = 0
        self._size: int | None = None

    def size(self) -> int:
        if self._size is None:
            size_file = self.root / "size"
            try:
                self._size = int(size_file.read_text())
            except (OSError, ValueError):
                self._size = self.inner.size()
                self._store(size_file, str(self._size).encode())
        return self._size

    def read(self, offset: int, length: int) -> bytes:
        blob = self.root / f"{offset}-{length}"
        try:
            data = blob.read_bytes()
        except OSError:
            data = None
        if data is not None:
            if len(data) != length:
                raise WeightsError(
                    WeightsFault.CacheCorrupt,
                    f"cache blob {blob} holds {len(data)} bytes, expected {length}",
                )
            self.cache_hit_bytes += length
            return data
        before = self.inner.bytes_read
        data = self.inner.read(offset, length)
        self.bytes_read += self.inner.bytes_read - before
        self._store(blob, data)
        return data

    def _store(self, path: Path, data: bytes) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            raise WeightsError(
                WeightsFault.CacheCorrupt, f"cannot write cache entry {path}: {exc.strerror}"
            ) from None


def open_source(
    location: str | os.PathLike[str],
    *,
    digest: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> ByteSource:
    """Open a GGUF by path or URL; with ``cache_dir``, put the content-addressed cache in front.

    For a URL without ``digest`` the cache key is :meth:`HttpRangeSource.cache_key` (one
    ``HEAD``, no body).
    """
    text = os.fspath(location)
    inner: ByteSource
    if is_url(text):
        http = HttpRangeSource(text)
        inner = http
        if cache_dir is not None and digest is None:
            digest = http.cache_key()
    else:
        inner = LocalFileSource(text)
    if cache_dir is None or digest is None:
        return inner
    return CachedSource(inner, cache_dir, digest)


_HASH_CHUNK = 1 << 20
_VERIFIED_KEPT = 64
_verified: dict[tuple[int, int, int, int], str] = {}
_verified_lock = threading.Lock()


def file_digest(fd: int) -> str:
    """The SHA-256 (hex) of everything readable from `fd`, read once in 1 MiB chunks."""
    digest = hashlib.sha256()
    buffer = bytearray(_HASH_CHUNK)
    view = memoryview(buffer)
    offset = 0
    while True:
        n = os.preadv(fd, [buffer], offset)
        if n <= 0:
            return digest.hexdigest()
        digest.update(view[:n])
        offset += n


def local_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 (hex) of the local file at `path`, hashed once per (device, inode,
    size, mtime) in this process (module doc); `WeightsError` if it cannot be read."""
    text = os.fspath(path)
    try:
        fd = os.open(text, os.O_RDONLY)
    except OSError as exc:
        raise WeightsError(
            WeightsFault.SourceInvalid, f"cannot open {text}: {exc.strerror}"
        ) from None
    try:
        info = os.fstat(fd)
        key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        with _verified_lock:
            known = _verified.get(key)
        if known is not None:
            return known
        try:
            actual = file_digest(fd)
        except OSError as exc:
            raise WeightsError(
                WeightsFault.Truncated, f"{text}: read failed: {exc.strerror}"
            ) from None
        with _verified_lock:
            if len(_verified) >= _VERIFIED_KEPT:
                _verified.clear()
            _verified[key] = actual
        return actual
    finally:
        os.close(fd)


def verify_sha256(location: str | os.PathLike[str], expected: str) -> None:
    """Check that the GGUF at `location` is the file whose SHA-256 is `expected`
    (module doc); ``WeightsError(DigestMismatch)`` names both digests."""
    expected = expected.lower()
    text = os.fspath(location)
    if text.startswith(("http://", "https://")):
        etag = HttpRangeSource(text).etag()
        if etag is not None and etag.lower() != expected:
            raise WeightsError(
                WeightsFault.DigestMismatch,
                f"{text}: the server's file has sha256 {etag.lower()}, the plan expects "
                f"{expected}",
            )
        return
    actual = local_sha256(text)
    if actual != expected:
        raise WeightsError(
            WeightsFault.DigestMismatch,
            f"{text}: sha256 {actual} does not match the plan's {expected}",
        )
