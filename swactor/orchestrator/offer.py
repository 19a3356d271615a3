"""The orchestrator offers its GGUF to the pool (`--offer-model`, spec §15 extension).

Theory of operation. `offered_source(model, me)` hashes the file once (`model.fetch`:
whole-file SHA-256 and the chunk manifest) and returns the plan's `GgufSource.pool_peer`:
this orchestrator's node id, the manifest's digest and the file's digest, so that no
node needs the file at any path. `serve_offer(endpoint, offered)` registers the
`swactor/artifact/1` handler on the orchestrator's own QUIC endpoint, whose allow-list is
the pool: only pool members can ask, only for this file, one bounded range at a time
(`transport.artifact_stream`). Its `served_bytes` says what the nodes fetched.
"""

from __future__ import annotations

from pathlib import Path

from swactor.model.fetch import OfferedFile, offer_file
from swactor.transport.artifact_stream import ArtifactChannel, FileOffer
from swactor.transport.endpoint import QuicEndpoint
from swactor.wire import GgufSource


def offered_source(model: Path, me: int) -> tuple[GgufSource, OfferedFile]:
    """The plan's PoolPeer source for `model`, offered by node `me`."""
    offered = offer_file(model)
    return GgufSource.pool_peer(me, offered.manifest_sha256, offered.sha256), offered


def serve_offer(endpoint: QuicEndpoint, offered: OfferedFile) -> tuple[ArtifactChannel, FileOffer]:
    """Serve `offered` to the endpoint's peers; close the `FileOffer` when the session ends."""
    channel = ArtifactChannel(endpoint)
    item = FileOffer(offered.path, offered.sha256, offered.manifest)
    channel.offer(item)
    return channel, item
