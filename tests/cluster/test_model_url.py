"""`--model http(s)://...`: each node reads only its own byte ranges from the URL into
its model cache (a content key: the server's SHA-256 ETag), and a URL that cannot serve
is refused at plan time, naming the URL, before any node starts.

The end-to-end case (soak: `just soak-tests`) serves the shipped SmolLM2 from a loopback
artifact server (`model.artifact_server`: Range requests, ETag = SHA-256) and runs
`swactor run --nodes 1 --model URL` twice as a user would, in a subprocess whose model
cache is an empty folder: the greedy tokens equal the single-stage reference; run 1's
node fetches at most 1.05x its share (header + tensors) and run 2's fetches nothing (the
orchestrator reads the header once per run). Each run prints the stage's memory at ready
as its worker measured it, beside the plan's prediction: weights within 1.25x the
range's file bytes, the KV cache as predicted.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from swactor.cli import main
from swactor.model.artifact_server import ArtifactServer
from swactor.model.gguf_range import open_reader
from swactor.model.paths import MODEL_CACHE_ENV, default_model_path
from swactor.model.tokenizer import Tokenizer
from tests import single_stage
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf

TOKENS = 6
MAX_SEQ = 64
PROMPT = "hello world"
READY = re.compile(
    r"\[swactor\] stage 0 ready \(1/1\): weights ([\d.]+) MiB = ([\d.]+)x its ([\d.]+) MiB "
    r"in the file \(predicted ([\d.]+) MiB\), KV cache ([\d.]+) MiB \(predicted ([\d.]+) "
    r"MiB\), worker RSS ([\d.]+) MiB")


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    (tmp_path / "served").mkdir()
    return write_tiny_gguf(tmp_path / "served" / "tiny.gguf", TinyConfig(blocks=2))


@pytest.fixture
def no_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    from swactor.cluster.launcher import LocalCluster

    async def no_start(self: LocalCluster) -> None:
        raise AssertionError("a node was started for a model URL the plan refuses")

    monkeypatch.setattr(LocalCluster, "start", no_start)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def plain_server(tiny: Path) -> Iterator[str]:
    """The stdlib file server: no Range support, 404 for what it lacks."""
    handler = partial(_Quiet, directory=str(tiny.parent))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize(("name", "words"), [
    ("absent.gguf", ["HTTP 404"]),
    ("tiny.gguf", ["does not serve byte ranges"]),
], ids=["404", "no-ranges"])
def test_a_url_that_cannot_serve_is_refused_by_name(
    plain_server: str, no_nodes: None, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    name: str, words: list[str],
) -> None:
    url = f"{plain_server}/{name}"
    assert main(["plan", "--model", url, "--nodes", "2"]) == 2
    assert main(["run", "--model", url, "--nodes", "1",
                 "--keys-dir", str(tmp_path / "keys")]) == 2
    # (the stdlib server prints a traceback when swactor hangs up on its 200 body)
    lines = [line for line in capsys.readouterr().err.splitlines()
             if line.startswith("swactor ")]
    assert [line.split(":", 1)[0] for line in lines] == ["swactor plan", "swactor run"], lines
    for line in lines:
        assert url in line and all(word in line for word in words), line


def test_plan_names_the_url_and_its_digest(
    tiny: Path, no_nodes: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ArtifactServer(tiny) as server:
        assert main(["plan", "--model", server.url, "--nodes", "2", "--json"]) == 0
        source = json.loads(capsys.readouterr().out)["model"]["gguf_source"]
        assert source == {"kind": "HttpUrl", "location": server.url, "sha256": server.sha256}
        # a URL is read where it is: offering it is refused by name
        assert main(["run", "--model", server.url, "--nodes", "1", "--offer-model",
                     "--keys-dir", str(tmp_path / "keys")]) == 2
        err = capsys.readouterr().err
        assert "--offer-model" in err and server.url in err


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.timeout(900)
def test_run_from_a_url_reads_the_stage_once_into_the_cache(tmp_path: Path) -> None:
    model = default_model_path()
    if not model.is_file():
        pytest.fail(f"{model} missing: run scripts/setup.sh")
    reader = open_reader(model)
    share = reader.header_bytes + sum(e.n_bytes for e in reader.tensors.values())
    prompt = tuple(Tokenizer.from_gguf(model).encode(PROMPT))
    expected = single_stage.reference_tokens(model, 30, prompt, TOKENS, MAX_SEQ)
    cache = tmp_path / "cache"
    env = {**os.environ, MODEL_CACHE_ENV: str(cache)}
    with ArtifactServer(model) as server:
        for run in (1, 2):
            before = server.bytes_served
            done = subprocess.run(
                [sys.executable, "-m", "swactor.cli", "run", "--nodes", "1", "--model",
                 server.url, "--prompt", PROMPT, "--max-tokens", str(TOKENS),
                 "--max-seq-len", str(MAX_SEQ), "--json", "--run-id", str(run),
                 "--keys-dir", str(tmp_path / "keys")],
                env=env, capture_output=True, text=True, timeout=600, check=False)
            assert done.returncode == 0, done.stderr[-3000:]
            report = json.loads(done.stdout.strip().splitlines()[-1])
            assert report["generated_token_ids"] == expected, f"run {run}"
            (ready,) = [m for m in map(READY.fullmatch, done.stderr.splitlines()) if m]
            print(ready.group(0))
            weights, ratio, in_file, _, kv_cache, kv_predicted, rss = map(float, ready.groups())
            assert in_file > 0 and ratio <= 1.25 and abs(weights / in_file - ratio) < 0.01
            assert kv_cache == kv_predicted > 0 and rss > weights
            node = server.bytes_served - before - reader.header_bytes  # less the orchestrator's
            print(f"run {run}: the node fetched {node} bytes from the URL for a {share}-byte "
                  f"share ({node / share:.3f})")
            if run == 1:
                assert share <= node <= 1.05 * share
            else:
                assert node == 0
    assert (cache / "http" / server.sha256).is_dir()
    assert not list(cache.rglob("*.gguf")), "the file was never copied whole"
