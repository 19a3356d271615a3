"""Weights for nodes that lack the file: a chunk manifest, a per-node chunk cache, and the
fetch of one stage's byte ranges from the pool member that offers the GGUF (spec §15).

Theory of operation
-------------------
Offer (orchestrator). :func:`offer_file` reads the GGUF once and computes its SHA-256 and
a *manifest*: the SHA-256 of every fixed-size chunk. The manifest is

    b"SWMF0001" | file size u64 | chunk size u32 | chunk digests (32 bytes each)

with the chunk size a power of two, 64 KiB or larger so that no file has more than
`MAX_CHUNKS` chunks (a manifest stays under 1 MiB). The plan names the source as
`GgufSource.pool_peer(offering node, sha256(manifest), sha256(file))`; the bytes travel
on the pool's QUIC links (`transport.artifact_stream`).

Fetch (node). :func:`fetch_stage` (in a thread; the QUIC requests run on the event loop)
gets the manifest and checks its SHA-256 against the plan, then reads the header through
a :class:`ChunkSource` (the range reader grows its prefix until the header parses), asks
the reader for the stage's tensors (`validate_stage`: exactly what the worker will read)
and makes sure each chunk those ranges touch is present. A missing chunk is fetched
(contiguous runs in requests of at most `MAX_RANGE`, `IN_FLIGHT` at once); each chunk is
checked against the manifest before it is written, so a tampered or corrupt range is
`WeightsError(DigestMismatch)` naming the file digest, the chunk and both chunk digests,
and nothing unverified is stored. Fetched bytes are therefore the stage's share (header
plus tensors) rounded out to chunks: for SmolLM2 with 64 KiB chunks, under 2 % more.

Cache (content key). A node keeps fetched chunks in `<cache>/<file sha256>/`: `manifest`,
`data` (a sparse file of the full size: only fetched chunks hold bytes) and `have` (one
byte per chunk, 1 once the chunk was verified and written). The worker then reads `data`
as a local file; it reads only the header and the stage's tensors, which are present. A
later run re-hashes the chunks it needs from disk (a chunk changed on disk is fetched
again) and fetches only what is missing: the same stage fetches nothing.

Local copy: a node whose models folder already holds a `*.gguf` of the manifest's size
and the plan's file SHA-256 uses that file and fetches nothing but the manifest.

Progress: every `PROGRESS_BYTES` fetched and at the end, a log line with bytes done and
to do (`swactor node --log-level INFO`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import struct
import tempfile
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swactor.model.errors import WeightsError, WeightsFault

log = logging.getLogger(__name__)

MANIFEST_MAGIC = b"SWMF0001"
MANIFEST_HEAD = struct.Struct(">8sQI")
MIN_CHUNK = 64 << 10
MAX_CHUNK = 4 << 20
MAX_CHUNKS = 1 << 15
MAX_FILE = 1 << 37
"""Files up to 128 GiB: `MAX_CHUNKS` chunks of at most one `MAX_RANGE` request each."""
MAX_RANGE = 4 << 20
IN_FLIGHT = 4
PROGRESS_BYTES = 16 << 20
_READ = 1 << 20


def chunk_size_for(size: int) -> int:
    """The smallest power of two >= `MIN_CHUNK` that splits `size` into <= `MAX_CHUNKS`."""
    chunk = MIN_CHUNK
    while chunk * MAX_CHUNKS < size:
        chunk *= 2
    return chunk


@dataclass(frozen=True)
class Manifest:
    """A file's size, chunk size and chunk digests."""

    size: int
    chunk: int
    digests: tuple[bytes, ...]
    sha256: str
    """The SHA-256 of the manifest's own bytes (what the plan names)."""

    @property
    def count(self) -> int:
        return len(self.digests)

    def span(self, index: int) -> tuple[int, int]:
        start = index * self.chunk
        return start, min(self.chunk, self.size - start)

    def chunks(self, offset: int, length: int) -> range:
        if length <= 0:
            return range(0)
        return range(offset // self.chunk, (offset + length - 1) // self.chunk + 1)

    @classmethod
    def parse(cls, data: bytes, expected_sha256: str) -> Manifest:
        """Check `data` against the plan's digest, then its structure."""
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected_sha256:
            raise WeightsError(WeightsFault.DigestMismatch,
                               f"manifest sha256 {actual} does not match the plan's "
                               f"{expected_sha256}")
        if len(data) < MANIFEST_HEAD.size:
            raise WeightsError(WeightsFault.SourceInvalid, "manifest shorter than its head")
        magic, size, chunk = MANIFEST_HEAD.unpack_from(data)
        if (magic != MANIFEST_MAGIC or not 0 < size <= MAX_FILE
                or not MIN_CHUNK <= chunk <= MAX_CHUNK or chunk & (chunk - 1)):
            raise WeightsError(WeightsFault.SourceInvalid, "manifest head is not valid")
        count = -(-size // chunk)
        if count > MAX_CHUNKS or len(data) != MANIFEST_HEAD.size + 32 * count:
            raise WeightsError(WeightsFault.SourceInvalid,
                               f"manifest holds {len(data)} bytes for {count} chunks")
        body = data[MANIFEST_HEAD.size:]
        digests = tuple(body[i * 32:(i + 1) * 32] for i in range(count))
        return cls(size, chunk, digests, actual)


@dataclass(frozen=True)
class OfferedFile:
    """What the orchestrator offers: path, file digest and manifest bytes."""

    path: Path
    sha256: str
    manifest: bytes

    @property
    def manifest_sha256(self) -> str:
        return hashlib.sha256(self.manifest).hexdigest()


_offers: dict[tuple[int, int, int, int], OfferedFile] = {}


def offer_file(path: str | os.PathLike[str]) -> OfferedFile:
    """Hash `path` once (file and chunks; remembered per device, inode, size, mtime)."""
    text = os.fspath(path)
    try:
        fd = os.open(text, os.O_RDONLY)
    except OSError as exc:
        raise WeightsError(WeightsFault.SourceInvalid,
                           f"cannot open {text}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        known = _offers.get(key)
        if known is not None:
            return known
        size = info.st_size
        if not 0 < size <= MAX_FILE:
            raise WeightsError(WeightsFault.SourceInvalid, f"{text}: {size} bytes")
        chunk = chunk_size_for(size)
        whole = hashlib.sha256()
        digests = bytearray()
        offset = 0
        while offset < size:
            part = hashlib.sha256()
            end = min(offset + chunk, size)
            while offset < end:
                data = os.pread(fd, min(_READ, end - offset), offset)
                if not data:
                    raise WeightsError(WeightsFault.Truncated, f"{text}: ended at {offset}")
                part.update(data)
                whole.update(data)
                offset += len(data)
            digests += part.digest()
        manifest = MANIFEST_HEAD.pack(MANIFEST_MAGIC, size, chunk) + bytes(digests)
        offered = OfferedFile(Path(text), whole.hexdigest(), manifest)
        _offers[key] = offered
        return offered
    finally:
        os.close(fd)


class ChunkStore:
    """`<cache>/<file sha256>/{manifest,data,have}` (module doc)."""

    def __init__(self, cache: Path, file_sha256: str, manifest: Manifest, raw: bytes) -> None:
        self.file_sha256 = file_sha256
        self.manifest = manifest
        self.root = cache / file_sha256
        self.data_path = self.root / "data"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            manifest_path = self.root / "manifest"
            if not manifest_path.is_file() or manifest_path.read_bytes() != raw:
                _write_atomic(manifest_path, raw)
            self._data = os.open(self.data_path, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(self._data).st_size != manifest.size:
                os.ftruncate(self._data, manifest.size)
            self._have = os.open(self.root / "have", os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(self._have).st_size != manifest.count:
                os.ftruncate(self._have, manifest.count)
        except OSError as exc:
            raise WeightsError(WeightsFault.CacheCorrupt,
                               f"model cache {self.root}: {exc.strerror}") from None
        self._checked: set[int] = set()

    @staticmethod
    def load_manifest(cache: Path, file_sha256: str, expected: str) -> bytes | None:
        """The cached manifest when its digest is the plan's (None: fetch it)."""
        try:
            raw = (cache / file_sha256 / "manifest").read_bytes()
        except OSError:
            return None
        return raw if hashlib.sha256(raw).hexdigest() == expected else None

    def present(self, index: int) -> bool:
        """Chunk `index` was stored and its bytes on disk still match the manifest."""
        if index in self._checked:
            return True
        if os.pread(self._have, 1, index) != b"\x01":
            return False
        start, length = self.manifest.span(index)
        data = os.pread(self._data, length, start)
        if hashlib.sha256(data).digest() != self.manifest.digests[index]:
            log.warning("model cache %s: chunk %d changed on disk; fetching it again",
                        self.root, index)
            os.pwrite(self._have, b"\x00", index)
            return False
        self._checked.add(index)
        return True

    def store(self, first: int, data: bytes) -> None:
        """Verify each chunk of `data` (chunks `first`...) against the manifest, then write."""
        manifest = self.manifest
        offset = 0
        index = first
        while offset < len(data):
            start, length = manifest.span(index)
            piece = data[offset:offset + length]
            actual = hashlib.sha256(piece).hexdigest()
            if actual != manifest.digests[index].hex():
                raise WeightsError(
                    WeightsFault.DigestMismatch,
                    f"file sha256 {self.file_sha256}: bytes [{start}, {start + length}) "
                    f"(chunk {index}) have sha256 {actual}, the manifest "
                    f"{manifest.sha256} says {manifest.digests[index].hex()}")
            offset += length
            index += 1
        start = first * manifest.chunk
        try:
            os.pwrite(self._data, data, start)
            os.pwrite(self._have, b"\x01" * (index - first), first)
        except OSError as exc:
            raise WeightsError(WeightsFault.CacheCorrupt,
                               f"model cache {self.root}: {exc.strerror}") from None
        self._checked.update(range(first, index))

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self._data, length, offset)

    def close(self) -> None:
        os.close(self._data)
        os.close(self._have)


Fetch = Callable[[int, int], Coroutine[Any, Any, bytes]]
"""`fetch(offset, length)`: the bytes of one range from the offering peer."""


class ChunkSource:
    """A `ByteSource` over a `ChunkStore` that fetches missing chunks first (module doc)."""

    def __init__(self, store: ChunkStore, fetch: Fetch, loop: asyncio.AbstractEventLoop,
                 name: str) -> None:
        self.store = store
        self.name = name
        self.bytes_read = 0
        self.fetched_bytes = 0
        self._fetch = fetch
        self._loop = loop
        self._reported = 0

    def size(self) -> int:
        return self.store.manifest.size

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size():
            raise WeightsError(WeightsFault.Truncated,
                               f"{self.name}: range [{offset}, {offset + length}) beyond "
                               f"{self.size()} bytes")
        self.ensure([(offset, length)])
        self.bytes_read += length
        return self.store.read(offset, length)

    def ensure(self, spans: list[tuple[int, int]]) -> None:
        """Fetch, verify and store every chunk the spans touch that is not present."""
        manifest = self.store.manifest
        wanted = sorted({i for offset, length in spans for i in manifest.chunks(offset, length)})
        missing = [i for i in wanted if not self.store.present(i)]
        if not missing:
            return
        runs: list[tuple[int, int]] = []  # (first chunk, chunk count), each <= MAX_RANGE
        per_request = max(1, MAX_RANGE // manifest.chunk)
        for index in missing:
            if runs and runs[-1][0] + runs[-1][1] == index and runs[-1][1] < per_request:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((index, 1))
        total = sum(manifest.span(first + k)[1] for first, count in runs for k in range(count))
        started = time.monotonic()
        done = 0
        queue = list(runs)
        flying: list[tuple[int, Future[bytes]]] = []
        try:
            while queue or flying:
                while queue and len(flying) < IN_FLIGHT:
                    first, count = queue.pop(0)
                    start = first * manifest.chunk
                    end = min(manifest.size, (first + count) * manifest.chunk)
                    coroutine = self._fetch(start, end - start)
                    flying.append((first, asyncio.run_coroutine_threadsafe(coroutine,
                                                                            self._loop)))
                first, future = flying.pop(0)
                data = future.result()
                self.store.store(first, data)
                done += len(data)
                self.fetched_bytes += len(data)
                if self.fetched_bytes - self._reported >= PROGRESS_BYTES or done == total:
                    self._reported = self.fetched_bytes
                    log.info("weights %s: fetched %d of %d bytes (%.1f s)", self.name, done,
                             total, time.monotonic() - started)
        finally:
            for _, future in flying:
                future.cancel()


@dataclass(frozen=True)
class StageFetch:
    """What `fetch_stage` did: the local file, bytes fetched, the stage's share."""

    path: Path
    fetched_bytes: int
    share_bytes: int
    manifest_fetched: bool


def parse_pool_peer(location: str) -> tuple[int, str]:
    """`<16 hex node id>:<manifest sha256>` -> (node id, manifest digest)."""
    peer, _, manifest = location.partition(":")
    return int(peer, 16), manifest


def fetch_stage(
    *,
    location: str,
    file_sha256: str,
    cache: Path,
    layer_start: int,
    layer_end: int,
    is_first: bool,
    is_last: bool,
    get_manifest: Callable[[], Coroutine[Any, Any, bytes]],
    fetch: Fetch,
    loop: asyncio.AbstractEventLoop,
    local_dir: Path | None = None,
) -> StageFetch:
    """Bring the stage's header and tensors into the node's cache (module doc); in a thread."""
    from swactor.model.gguf_range import GgufRangeReader

    _, manifest_sha256 = parse_pool_peer(location)
    raw = ChunkStore.load_manifest(cache, file_sha256, manifest_sha256)
    fetched_manifest = raw is None
    if raw is None:
        raw = asyncio.run_coroutine_threadsafe(get_manifest(), loop).result()
    manifest = Manifest.parse(raw, manifest_sha256)
    local = None if local_dir is None else local_copy(local_dir, manifest.size, file_sha256)
    if local is not None:
        log.info("weights: %s already holds sha256 %s; nothing to fetch", local, file_sha256)
        return StageFetch(local, 0, 0, fetched_manifest)
    store = ChunkStore(cache, file_sha256, manifest, raw)
    try:
        source = ChunkSource(store, fetch, loop, f"pool:{file_sha256[:16]}")
        reader = GgufRangeReader(source)
        entries = reader.validate_stage(layer_start, layer_end, is_first=is_first,
                                        is_last=is_last)
        source.ensure([(e.offset, e.n_bytes) for e in entries])
        share = reader.header_bytes + sum(e.n_bytes for e in entries)
        return StageFetch(store.data_path, source.fetched_bytes, share, fetched_manifest)
    finally:
        store.close()


def local_copy(folder: Path, size: int, sha256: str) -> Path | None:
    """A `*.gguf` directly in `folder` of `size` bytes whose SHA-256 is `sha256` (hashed
    once per file state, `source.local_sha256`), or None."""
    from swactor.model.source import local_sha256

    try:
        candidates = sorted(p for p in folder.glob("*.gguf")
                            if p.is_file() and p.stat().st_size == size)
    except OSError:
        return None
    for path in candidates:
        try:
            if local_sha256(path) == sha256:
                return path
        except WeightsError:
            continue
    return None


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)
