"""Sources: HTTP Range reads through the artifact server, the content-addressed cache."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from swactor.model.artifact_server import ArtifactServer, file_sha256
from swactor.model.errors import WeightsError, WeightsFault
from swactor.model.gguf_range import GgufRangeReader, open_reader
from swactor.model.source import (
    CachedSource,
    HttpRangeSource,
    forget_small_reads,
    open_source,
)


@pytest.fixture
def server(tiny_mixed: Path) -> Iterator[ArtifactServer]:
    # a fresh process's view: small reads kept from an earlier test's server on the same
    # port (same URL, file and validators) would spare this one its header requests
    forget_small_reads()
    with ArtifactServer(tiny_mixed) as srv:
        yield srv


def _stage_tensor_bytes(path: Path, layers: range) -> int:
    prefixes = tuple(f"blk.{i}." for i in layers)
    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors if t.name.startswith(prefixes))


def test_http_stage_reads_only_its_ranges(server: ArtifactServer, tiny_mixed: Path) -> None:
    reader = open_reader(server.url)
    header_served = server.bytes_served
    assert header_served == reader.header_bytes
    weights = reader.load_stage(2, 4, is_first=False, is_last=False)
    stage_bytes = _stage_tensor_bytes(tiny_mixed, range(2, 4))
    tensor_served = server.bytes_served - header_served
    assert stage_bytes <= tensor_served <= stage_bytes + 4096 * len(weights.ranges)
    assert tensor_served == weights.bytes_read
    assert server.bytes_served < tiny_mixed.stat().st_size // 2
    assert all(method == "HEAD" or rng is not None for method, rng in server.requests)
    local = open_reader(tiny_mixed).load_stage(2, 4, is_first=False, is_last=False)
    for name, array in local.tensors.items():
        np.testing.assert_array_equal(weights.tensors[name], array)


def test_second_run_through_cache_reads_nothing(
    server: ArtifactServer, tiny_mixed: Path, tmp_path: Path
) -> None:
    digest = file_sha256(tiny_mixed)
    first = open_reader(server.url, digest=digest, cache_dir=tmp_path)
    loaded = first.load_stage(0, 3, is_first=True, is_last=False)
    served = server.bytes_served
    assert served > 0
    second_source = open_source(server.url, digest=digest, cache_dir=tmp_path)
    assert isinstance(second_source, CachedSource)
    again = GgufRangeReader(second_source).load_stage(0, 3, is_first=True, is_last=False)
    assert server.bytes_served == served  # not one byte more
    assert second_source.bytes_read == 0 and second_source.cache_hit_bytes > 0
    for name, array in loaded.tensors.items():
        np.testing.assert_array_equal(again.tensors[name], array)
    # the ETag is the SHA-256: without a given digest the cache is keyed the same way
    by_etag = open_source(server.url, cache_dir=tmp_path)
    assert isinstance(by_etag, CachedSource) and by_etag.digest == digest
    GgufRangeReader(by_etag).load_stage(0, 3, is_first=True, is_last=False)
    assert server.bytes_served == served


def test_cache_detects_a_damaged_entry(
    server: ArtifactServer, tiny_mixed: Path, tmp_path: Path
) -> None:
    digest = file_sha256(tiny_mixed)
    open_reader(server.url, digest=digest, cache_dir=tmp_path)
    blob = sorted((tmp_path / digest).glob("0-*"))[0]
    blob.write_bytes(blob.read_bytes()[:-1])
    with pytest.raises(WeightsError) as excinfo:
        open_reader(server.url, digest=digest, cache_dir=tmp_path)
    assert excinfo.value.reason is WeightsFault.CacheCorrupt


def test_artifact_server_range_semantics(server: ArtifactServer, tiny_mixed: Path) -> None:
    data = tiny_mixed.read_bytes()
    request = urllib.request.Request(server.url, headers={"Range": "bytes=10-19"})
    with urllib.request.urlopen(request) as response:
        assert response.status == 206
        assert response.headers["Content-Range"] == f"bytes 10-19/{len(data)}"
        assert response.read() == data[10:20]
    request = urllib.request.Request(server.url, headers={"Range": "bytes=-5"})
    with urllib.request.urlopen(request) as response:
        assert response.read() == data[-5:]
    with urllib.request.urlopen(server.url) as response:
        assert response.status == 200 and response.read() == data
    request = urllib.request.Request(server.url, headers={"Range": f"bytes={len(data)}-"})
    with pytest.raises(urllib.error.HTTPError) as excinfo:
        urllib.request.urlopen(request)
    assert excinfo.value.code == 416
    with pytest.raises(urllib.error.HTTPError) as excinfo:
        urllib.request.urlopen(server.url.rsplit("/", 1)[0] + "/other.gguf")
    assert excinfo.value.code == 404


def test_server_ignoring_ranges_is_refused(tiny_mixed: Path) -> None:
    handler = partial(SimpleHTTPRequestHandler, directory=str(tiny_mixed.parent))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/{tiny_mixed.name}"
        with pytest.raises(WeightsError) as excinfo:
            open_reader(url)
        assert excinfo.value.reason is WeightsFault.DownloadFailed
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_unreachable_url_is_typed() -> None:
    with pytest.raises(WeightsError) as excinfo:
        HttpRangeSource("http://127.0.0.1:9/model.gguf", timeout_s=2).size()
    assert excinfo.value.reason is WeightsFault.DownloadFailed


def test_missing_artifact_is_typed(server: ArtifactServer) -> None:
    with pytest.raises(WeightsError) as excinfo:
        open_reader(server.url.rsplit("/", 1)[0] + "/absent.gguf")
    assert excinfo.value.reason is WeightsFault.DownloadFailed


class _Prefix:
    """A ByteSource over a few real bytes of a file that claims to be `size` bytes long."""

    def __init__(self, data: bytes, size: int) -> None:
        self.data, self._size, self.name, self.bytes_read = data, size, "claimed", 0

    def size(self) -> int:
        return self._size

    def read(self, offset: int, length: int) -> bytes:
        self.bytes_read += length
        return (self.data[offset:offset + length]).ljust(length, b"\0")


def test_a_header_claiming_a_huge_string_is_refused_before_it_is_read() -> None:
    """A (remote) header whose first value claims 1 GiB: refused by the header bound after
    the first read, not fetched."""
    import struct

    from swactor.model.gguf_range import MAX_HEADER_BYTES, read_header

    key = b"general.architecture"
    head = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
            + struct.pack("<IQ", 8, 1 << 30))
    source = _Prefix(head, 1 << 40)
    with pytest.raises(WeightsError) as excinfo:
        read_header(source, source.size())
    assert excinfo.value.reason is WeightsFault.CorruptHeader
    assert f"{MAX_HEADER_BYTES}-byte bound" in str(excinfo.value)
    assert source.bytes_read <= 1 << 20


class _HugeFile(SimpleHTTPRequestHandler):
    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(1 << 50))
        self.end_headers()


def test_a_url_claiming_a_huge_file_is_refused_by_name() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _HugeFile)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/huge.gguf"
        with pytest.raises(WeightsError) as excinfo:
            HttpRangeSource(url).size()
        assert excinfo.value.reason is WeightsFault.SourceInvalid
        assert url in str(excinfo.value) and str(1 << 50) in str(excinfo.value)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_server_without_a_digest_etag_keys_the_cache_by_its_validators(
    tiny_mixed: Path, tmp_path: Path
) -> None:
    """The stdlib server sends no ETag (and ignores ranges): the cache key is still a
    stable hex key from the URL, size and Last-Modified, and changes with the file."""
    import os

    copy = tmp_path / "served" / tiny_mixed.name
    copy.parent.mkdir()
    copy.write_bytes(tiny_mixed.read_bytes())
    handler = partial(SimpleHTTPRequestHandler, directory=str(copy.parent))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/{copy.name}"
        first = HttpRangeSource(url)
        assert first.etag() is None and first.content_sha256() is None
        key = first.cache_key()
        assert len(key) == 64 and key == HttpRangeSource(url).cache_key()
        os.utime(copy, (1, 1))  # another Last-Modified: another key
        assert HttpRangeSource(url).cache_key() != key
        with pytest.raises(WeightsError) as excinfo:
            first.read(0, 16)
        assert url in str(excinfo.value) and "does not serve byte ranges" in str(excinfo.value)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_small_reads_of_one_url_are_fetched_once_per_process(
    server: ArtifactServer, tiny_mixed: Path
) -> None:
    """The orchestrator opens its URL for the plan and for the tokenizer: the header's
    bytes come from the server once."""
    from swactor.orchestrator.model_info import model_info_from_gguf

    info = model_info_from_gguf(server.url)  # its reader, then the tokenizer's (stop ids)
    served = server.bytes_served
    assert info.path == server.url and info.model_id == tiny_mixed.stem
    assert served == open_reader(tiny_mixed).header_bytes
    open_reader(server.url)
    assert server.bytes_served == served
