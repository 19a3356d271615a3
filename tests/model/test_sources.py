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
from swactor.model.source import CachedSource, HttpRangeSource, open_source


@pytest.fixture
def server(tiny_mixed: Path) -> Iterator[ArtifactServer]:
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
    assert excinfo.value.reason is WeightsFault.CACHE_CORRUPT


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
        assert excinfo.value.reason is WeightsFault.DOWNLOAD_FAILED
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_unreachable_url_is_typed() -> None:
    with pytest.raises(WeightsError) as excinfo:
        HttpRangeSource("http://127.0.0.1:9/model.gguf", timeout_s=2).size()
    assert excinfo.value.reason is WeightsFault.DOWNLOAD_FAILED


def test_missing_artifact_is_typed(server: ArtifactServer) -> None:
    with pytest.raises(WeightsError) as excinfo:
        open_reader(server.url.rsplit("/", 1)[0] + "/absent.gguf")
    assert excinfo.value.reason is WeightsFault.DOWNLOAD_FAILED
