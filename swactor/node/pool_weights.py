"""A node's weights from the pool: fetch a `PoolPeer` stage's ranges into the model cache.

Theory of operation. A plan whose `GgufSource` is `PoolPeer` names the member that offers
the GGUF (the orchestrator) and the digests of its chunk manifest and of the whole file.
`PoolWeights(provision)` (WorkerStagePorts' `fetch` hook) asks that member over the
node's own QUIC endpoint (`transport.artifact_stream`, mutual TLS, only peers the node
admits) for the manifest and the stage's missing chunks, verifies each chunk, keeps it in
`<models dir>/fetched/<file sha256>/` (`model.fetch`) and returns the local file the
worker reads; a `*.gguf` in the models folder with the plan's digest is used as it is
(`model.fetch.local_copy`). `fetches` records each stage's `StageFetch` (bytes
fetched, share) and the node reports the last one in its status. Transport failures are
`WeightsError(DownloadFailed)`; a chunk that does not match is `DigestMismatch`.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from swactor.model.errors import WeightsError, WeightsFault
from swactor.model.fetch import StageFetch, fetch_stage, parse_pool_peer
from swactor.transport.artifact_stream import ArtifactChannel, ArtifactError
from swactor.transport.errors import TransportError
from swactor.wire import ProvisionStage

log = logging.getLogger(__name__)

FETCHED_DIR = "fetched"


class PoolWeights:
    """Fetches a provision's ranges from its `PoolPeer` into the model cache."""

    def __init__(self, channel: ArtifactChannel, models_dir: Path) -> None:
        self.channel = channel
        self.models_dir = models_dir
        self.cache = models_dir / FETCHED_DIR
        self.fetches: list[StageFetch] = []

    async def __call__(self, provision: ProvisionStage) -> str:
        source = provision.gguf_source
        assert source.sha256 is not None  # a PoolPeer source always names it (wire)
        file_sha256 = source.sha256
        peer, _ = parse_pool_peer(source.location)
        channel = self.channel

        async def get_manifest() -> bytes:
            try:
                return await channel.fetch_manifest(peer, file_sha256)
            except (ArtifactError, TransportError) as error:
                raise WeightsError(WeightsFault.DownloadFailed, str(error)) from None

        async def fetch(offset: int, length: int) -> bytes:
            try:
                return await channel.fetch_range(peer, file_sha256, offset, length)
            except (ArtifactError, TransportError) as error:
                raise WeightsError(WeightsFault.DownloadFailed, str(error)) from None

        result = await asyncio.to_thread(
            fetch_stage, location=source.location, file_sha256=file_sha256,
            cache=self.cache, layer_start=provision.layer_start,
            layer_end=provision.layer_end_exclusive, is_first=provision.stage_index == 0,
            is_last=provision.stage_index == provision.stage_count - 1,
            get_manifest=get_manifest, fetch=fetch, loop=asyncio.get_running_loop(),
            local_dir=self.models_dir)
        self.fetches.append(result)
        log.info("weights: stage %d fetched %d bytes of a %d-byte share from node %#018x",
                 int(provision.stage_index), result.fetched_bytes, result.share_bytes, peer)
        return str(result.path)

    def status(self) -> dict[str, object]:
        """The last fetch: bytes fetched and the stage's share (None before any)."""
        last = self.fetches[-1] if self.fetches else None
        return {"weights_fetched": None if last is None else {
            "fetched_bytes": last.fetched_bytes, "share_bytes": last.share_bytes,
            "manifest_fetched": last.manifest_fetched}}
