"""PoolPeer weights over real QUIC (spec §15 extension): an orchestrator endpoint offers
SmolLM2; node endpoints with empty, separate caches fetch only their stage's ranges,
verified chunk by chunk, and reuse them; a tampered range is WeightLoadFailed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from swactor.actors import Actor, Context, Runtime
from swactor.fsm.generated import stage_controller as scm
from swactor.model.gguf_range import open_reader
from swactor.model.paths import default_model_path
from swactor.node.pool_weights import PoolWeights
from swactor.node.stage_ports import WeightsFetched
from swactor.node.stage_worker_ports import WorkerStagePorts
from swactor.orchestrator.inventory import synthetic_pool
from swactor.orchestrator.model_info import model_info_from_gguf
from swactor.orchestrator.offer import offered_source, serve_offer
from swactor.orchestrator.planner import PlanRequest, plan_run, stage_runtime_facts
from swactor.transport.artifact_stream import (
    REQUEST,
    ArtifactChannel,
    ArtifactError,
    Kind,
    encode_request,
)
from swactor.transport.config import TransportConfig
from swactor.transport.endpoint import QuicEndpoint
from swactor.transport.identity import NodeIdentity
from swactor.wire import (
    GgufSource,
    PromptSource,
    ProvisionStage,
    RunFaultError,
    RunFaultReason,
    RunId,
)
from swactor.wire import provision_stage as make_provision

pytestmark = pytest.mark.timeout(180)
CONFIG = TransportConfig(max_datagram_size=16383)
STAGES = 3


@pytest.fixture(scope="module")
def model() -> Path:
    path = default_model_path()
    if not path.is_file():
        pytest.fail(f"{path} missing: run scripts/setup.sh")
    return path


def provisions(model: Path, source: GgufSource) -> list[ProvisionStage]:
    info = model_info_from_gguf(model, with_stop_ids=False)
    request = PlanRequest(run_id=RunId(7), prompt=PromptSource.from_token_ids((1, 2)),
                          max_tokens=2, max_seq_len=64, gguf_source=source)
    plan = plan_run(synthetic_pool(STAGES), info, request).plan
    return [make_provision(plan, i, stage_runtime_facts(plan, i)) for i in range(STAGES)]


@dataclass
class Pool:
    orchestrator: QuicEndpoint
    nodes: list[QuicEndpoint]
    stranger: QuicEndpoint
    server: ArtifactChannel


Body = Callable[[Pool, GgufSource], Awaitable[None]]


def with_pool(served: Path, model: Path, body: Body) -> None:
    """An orchestrator endpoint offering `served` under `model`'s digests, 3 node
    endpoints it admits and one it does not."""

    async def main() -> None:
        ids = [NodeIdentity.generate() for _ in range(STAGES + 2)]
        orch = QuicEndpoint(ids[0], CONFIG, allowed={i.node_id for i in ids[1:STAGES + 1]})
        nodes = [QuicEndpoint(i, CONFIG, allowed={ids[0].node_id}) for i in ids[1:STAGES + 1]]
        stranger = QuicEndpoint(ids[-1], CONFIG, allowed={ids[0].node_id})
        endpoints = [orch, *nodes, stranger]
        for endpoint in endpoints:
            await endpoint.start()
        for endpoint in endpoints[1:]:
            endpoint.address_book[orch.node_id] = orch.address
        source, offered = offered_source(model, orch.node_id)
        if served != model:
            offered = type(offered)(served, offered.sha256, offered.manifest)
        server, item = serve_offer(orch, offered)
        try:
            await body(Pool(orch, nodes, stranger, server), source)
        finally:
            item.close()
            for endpoint in endpoints:
                await endpoint.close()

    asyncio.run(asyncio.wait_for(main(), timeout=150))


def stage_spans(model: Path, provision: ProvisionStage) -> list[tuple[int, int]]:
    reader = open_reader(model)
    entries = reader.validate_stage(provision.layer_start, provision.layer_end_exclusive,
                                    is_first=provision.stage_index == 0,
                                    is_last=provision.stage_index == provision.stage_count - 1)
    return [(0, reader.header_bytes)] + [(e.offset, e.n_bytes) for e in entries]


def same_spans(original: Path, fetched: Path, spans: list[tuple[int, int]]) -> int | None:
    """The offset of the first span whose bytes differ between the files, else None."""
    with open(original, "rb") as a, open(fetched, "rb") as b:
        for offset, length in spans:
            a.seek(offset)
            b.seek(offset)
            if a.read(length) != b.read(length):
                return offset
    return None


def flip_byte(path: Path, offset: int, mask: int) -> int:
    """XOR the byte at ``offset`` with ``mask``; the byte it held before."""
    with open(path, "r+b") as data:
        data.seek(offset)
        byte = data.read(1)[0]
        data.seek(offset)
        data.write(bytes([byte ^ mask]))
    return byte


def byte_at(path: Path, offset: int) -> int:
    with open(path, "rb") as data:
        data.seek(offset)
        return data.read(1)[0]


def test_each_stage_fetches_its_share_once_and_gets_the_files_bytes(
    model: Path, tmp_path: Path
) -> None:
    size = os.path.getsize(model)

    async def body(pool: Pool, source: GgufSource) -> None:
        stages = provisions(model, source)
        assert all(p.gguf_source.location.startswith(f"{pool.orchestrator.node_id:016x}:")
                   for p in stages)
        fetchers = [PoolWeights(ArtifactChannel(node), tmp_path / f"node-{i}")
                    for i, node in enumerate(pool.nodes)]
        ratios = []
        for provision, fetcher in zip(stages, fetchers, strict=True):
            path = await fetcher(provision)
            first = fetcher.fetches[-1]
            assert first.manifest_fetched and first.fetched_bytes > 0
            ratio = first.fetched_bytes / first.share_bytes
            ratios.append(ratio)
            # the bytes the stage reads are the file's own
            spans = stage_spans(model, provision)
            assert await asyncio.to_thread(same_spans, model, path, spans) is None
            # nobody fetched the whole file
            assert first.fetched_bytes < 0.6 * size
        print(f"\nfetched/share per stage: {', '.join(f'{r:.3f}' for r in ratios)}")
        assert max(ratios) <= 1.05, ratios
        served = pool.server.served_bytes
        # second run: nothing fetched, not even the manifest
        for provision, fetcher in zip(stages, fetchers, strict=True):
            await fetcher(provision)
            again = fetcher.fetches[-1]
            assert (again.fetched_bytes, again.manifest_fetched) == (0, False)
        assert pool.server.served_bytes == served

    with_pool(model, model, body)


def test_a_chunk_changed_in_the_cache_is_fetched_again(model: Path, tmp_path: Path) -> None:
    async def body(pool: Pool, source: GgufSource) -> None:
        provision = provisions(model, source)[1]
        fetcher = PoolWeights(ArtifactChannel(pool.nodes[0]), tmp_path / "cache")
        path = await fetcher(provision)
        offset, _ = stage_spans(model, provision)[1]
        byte = await asyncio.to_thread(flip_byte, path, offset, 0xFF)
        await fetcher(provision)
        again = fetcher.fetches[-1]
        assert 0 < again.fetched_bytes <= 64 << 10
        assert await asyncio.to_thread(byte_at, path, offset) == byte

    with_pool(model, model, body)


class Inbox(Actor[Any]):
    def __init__(self, box: list[Any]) -> None:
        self.box = box

    async def receive(self, ctx: Context[Any], message: Any) -> None:
        self.box.append(message)


def test_a_tampered_range_is_weight_load_failed_naming_the_digest(
    model: Path, tmp_path: Path
) -> None:
    tampered = tmp_path / "tampered.gguf"
    shutil.copyfile(model, tampered)

    async def body(pool: Pool, source: GgufSource) -> None:
        provision = provisions(model, source)[1]
        offset, length = stage_spans(model, provision)[3]
        # one byte inside one of the stage's tensors
        await asyncio.to_thread(flip_byte, tampered, offset + length // 2, 0x01)
        async with Runtime("node") as runtime:
            stage_box: list[Any] = []
            ports = WorkerStagePorts(runtime.spawn(lambda: Inbox([]), "worker"),
                                     runtime.spawn(lambda: Inbox(stage_box), "stage"),
                                     models_dir=tmp_path,
                                     fetch=PoolWeights(ArtifactChannel(pool.nodes[0]),
                                                       tmp_path / "cache"))
            with pytest.raises(RunFaultError) as raised:
                await ports.load_weights(provision)
            await asyncio.sleep(0.05)
        assert raised.value.reason is RunFaultReason.WeightLoadFailed
        assert source.sha256 is not None and source.sha256 in str(raised.value)
        assert "DigestMismatch" in str(raised.value)
        assert not any(isinstance(m, WeightsFetched | scm.WeightsReady) for m in stage_box)

    with_pool(tampered, model, body)


def test_the_server_answers_only_pool_peers_and_bounded_requests(
    model: Path, tmp_path: Path
) -> None:
    size = os.path.getsize(model)

    async def body(pool: Pool, source: GgufSource) -> None:
        assert source.sha256 is not None
        sha = source.sha256
        orch = pool.orchestrator.node_id
        stranger = ArtifactChannel(pool.stranger)
        with pytest.raises(ArtifactError):  # the TLS handshake refuses a non-member
            await stranger.fetch_range(orch, sha, 0, 4096, timeout=5)
        client = ArtifactChannel(pool.nodes[0])
        with pytest.raises(ArtifactError, match="UNKNOWN_FILE"):
            await client.fetch_range(orch, "ab" * 32, 0, 4096)
        with pytest.raises(ArtifactError, match="BAD_RANGE"):
            await client.fetch_range(orch, sha, size - 10, 4096)
        with pytest.raises(ArtifactError):  # over MAX_RANGE: refused before asking
            await client.fetch_range(orch, sha, 0, 64 << 20)
        # a raw stream with more than one request's bytes is answered BAD_REQUEST
        link = await pool.nodes[0].connect(orch, "swactor/artifact/1")
        stream = link.open_bidi_stream()
        key = (link, stream)
        from swactor.transport.artifact_stream import _Pending

        pending = client._pending[key] = _Pending(1 << 20)
        link.send(stream, encode_request(Kind.RANGE, sha, 0, 16) + b"x" * REQUEST.size,
                  end=True)
        answer = await asyncio.wait_for(pending.answer, 10)
        assert answer[0] == 3  # Status.BAD_REQUEST
        # the server still serves
        assert await client.fetch_range(orch, sha, 0, 4) == b"GGUF"
        assert pool.server.refused_requests == 3

    with_pool(model, model, body)


def test_a_node_that_holds_the_file_uses_it_and_fetches_no_range(
    model: Path, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    os.symlink(model, models / "same-bytes-other-name.gguf")

    async def body(pool: Pool, source: GgufSource) -> None:
        fetcher = PoolWeights(ArtifactChannel(pool.nodes[0]), models)
        path = await fetcher(provisions(model, source)[1])
        assert Path(path) == models / "same-bytes-other-name.gguf"
        assert fetcher.fetches[-1].fetched_bytes == 0
        assert pool.server.served_bytes < 1 << 20  # the manifest only

    with_pool(model, model, body)
