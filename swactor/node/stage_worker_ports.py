"""The worker- and weight-facing half of `StagePorts`: GpuWorkerCtl commands and GGUF weights.

Theory of operation. `WorkerStagePorts` carries out the stage controller's effects that
concern the node's GPU worker and the stage's weights; the node composition adds the
edge ports (EdgeEstablisher, edge actors), `report` (control channel) and `emit`
(event log) beside it.

- `load_weights(provision)` resolves the provision's `GgufSource` to a location this
  node reads (LocalPath as is, never copied; HttpUrl read by byte ranges through
  `cache_dir`, the node's `<models dir>/http`, keyed by the file's digest;
  CacheKey as a file in `models_dir`; PoolPeer fetched by the `fetch` hook, e.g.
  `node.pool_weights.PoolWeights`, into the model cache, chunks verified as they arrive),
  checks a whole file against the plan's `sha256` when it names one
  (`model.source.verify_sha256`: a mismatch is WeightLoadFailed naming both digests;
  a fetched chunk that does not match is one too), then checks the stage's layer
  range, first/last tensors, hidden size, dtype and `max_seq_len` against the file's header
  (`GgufRangeReader.validate_stage`, in a thread: the header may come over HTTP). When
  the source is remote and cached, it then downloads the stage's tensor ranges into the
  cache (`fetch_stage_bytes`: the same coalesced ranges the worker's load reads, so the
  worker reads them from the cache and nothing twice over the network). Only then does
  it tell the stage `WeightsFetched` (bytes now on this node: downloaded, or the local
  file's stage bytes) and `WeightsReady` (the range is on this node and validated; the
  worker reads and binds it during role configuration, which `RoleConfigured` reports).
  A `WeightsError` raises `RunFaultError` with WeightDownloadFailed (download, cache,
  source problems) or WeightLoadFailed (the file does not hold what the plan says),
  which the controller reports as its StageFault.
- `configure_role(provision)` waits for that location, then sends ConfigureRole with the
  `llama_stage` config (`role_config.llama_stage_config`), the stage table the header
  check produced included (`GgufRangeReader.stage_table`: facts and the stage's tensor
  entries), so the worker reads the stage's tensor bytes and not the header again; it
  binds them and answers RoleConfigured / RoleFailed to the stage. If the weights
  failed, it raises too (the controller keeps the first fault).
- `grant_steps`, `revoke_steps`: the standing step grant and its revocation (extension
  beyond §29), as GpuWorkerCtl's machine events.
- `reset_role`: §29 has no command to drop a role, so nothing is sent: the next run's
  ConfigureRole replaces the role object (its weights and KV cache are freed with it),
  and a role's positions restart at inference step 0. Locations of the run are dropped.
- `worker_generation()`: the generation the node last heard of (`set_generation` on
  each WorkerReadyNotice).

Results go to `stage`, the StageHost (or a controller) the node wires in.
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from swactor import faults
from swactor.actors import ActorRef
from swactor.fsm.generated import gpu_worker_ctl as gwc
from swactor.fsm.generated import stage_controller as scm
from swactor.node.role_config import RoleConfigProblem, llama_stage_config
from swactor.node.stage_ports import WeightsFetched
from swactor.wire import (
    ConfigureRole,
    GgufSourceKind,
    GrantSteps,
    JsonObject,
    ProvisionStage,
    RevokeSteps,
    RoleId,
    RunFaultError,
    RunFaultReason,
    RunId,
    WorkerGeneration,
)

_DTYPE_NAMES = {4: "f32", 2: "f16"}
FIRST_GENERATION = WorkerGeneration(1)
HTTP_CACHE = "http"
"""The node's cache of ranges read from HttpUrl sources, in its models folder."""


def weights_location(provision: ProvisionStage, models_dir: Path) -> str:
    """Where this node reads the stage's GGUF: a local path or an http(s) URL."""
    source = provision.gguf_source
    if source.kind is GgufSourceKind.CacheKey:
        return str(models_dir / source.location)
    return source.location


def _fault_reason(error: Exception) -> RunFaultReason:
    from swactor.model.errors import WeightsFault

    reason = getattr(error, "reason", None)
    if reason in (WeightsFault.DownloadFailed, WeightsFault.CacheCorrupt,
                  WeightsFault.SourceInvalid):
        return RunFaultReason.WeightDownloadFailed
    return RunFaultReason.WeightLoadFailed


def validate_weights(provision: ProvisionStage, location: str, cache_dir: Path | None
                     ) -> tuple[int, JsonObject]:
    """Check the file against the plan's sha256 (when it names one) and the stage's range
    against the file's header and, for a cached remote source, download its tensor ranges
    into the cache (`fetch_stage_bytes`); the bytes now on this node for the stage, and
    the stage table the worker loads by (its header unread)."""
    from swactor.model.gguf_range import coalesce_ranges
    from swactor.model.source import verify_sha256

    model = provision.model
    expected = provision.gguf_source.sha256
    if expected is not None and provision.gguf_source.kind is not GgufSourceKind.PoolPeer:
        verify_sha256(location, expected)  # DigestMismatch: WeightLoadFailed
    cache_dir = cache_dir if is_remote(location) else None  # a local file is read in place
    reader = header_reader(location, expected, cache_dir)
    entries = reader.validate_stage(
        provision.layer_start,
        provision.layer_end_exclusive,
        is_first=provision.stage_index == 0,
        is_last=provision.stage_index == provision.stage_count - 1,
        hidden_dim=model.hidden_dim,
        dtype_family=_DTYPE_NAMES.get(model.dtype_width_bytes, "?"),
        max_seq_len=model.max_seq_len,
    )
    table: JsonObject = reader.stage_table(entries)
    spans = coalesce_ranges([(entry.offset, entry.n_bytes) for entry in entries])
    if is_remote(location) and cache_dir is not None:
        return fetch_stage_bytes(reader.source, spans), table
    return sum(entry.n_bytes for entry in entries), table


_HEADERS: OrderedDict[tuple[object, ...], JsonObject] = OrderedDict()
_HEADERS_KEPT = 4


def header_reader(location: str, digest: str | None, cache_dir: Path | None) -> Any:
    """A `GgufRangeReader` of `location` whose header this node process parses once per
    file: a node serves run after run from one file, and the header (1.8 MB for SmolLM2,
    mostly the tokenizer) says the same each time. A local file is known by its device,
    inode, size and modification time, a remote one by its digest (without one it is
    parsed every time); the last few files are kept."""
    from swactor.model.gguf_range import GgufRangeReader
    from swactor.model.source import open_source

    identity: tuple[object, ...] | None = None
    if not is_remote(location):
        try:
            info = os.stat(location)
            identity = (location, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        except OSError:
            identity = None  # open_source says what is wrong
    elif digest is not None:
        identity = (location, digest.lower())
    source = open_source(location, digest=digest, cache_dir=cache_dir)
    known = _HEADERS.get(identity) if identity is not None else None
    if known is not None and identity is not None:
        _HEADERS.move_to_end(identity)
        return GgufRangeReader(source, known)
    reader = GgufRangeReader(source)
    if identity is not None:
        _HEADERS[identity] = reader.stage_table(list(reader.tensors.values()))
        while len(_HEADERS) > _HEADERS_KEPT:
            _HEADERS.popitem(last=False)
    return reader


def is_remote(location: str) -> bool:
    return location.startswith(("http://", "https://"))


def fetch_stage_bytes(source: Any, spans: list[tuple[int, int]]) -> int:
    """Read `spans` (the worker load's coalesced ranges) through a cached source so they are
    stored in the cache; the bytes they hold. The worker's reads of the same ranges are
    then cache hits."""
    for start, length in spans:
        source.read(start, length)
    return sum(length for _, length in spans)


class WorkerStagePorts:
    """GpuWorkerCtl and weight ports of a stage (module doc)."""

    def __init__(
        self,
        worker: ActorRef[Any],
        stage: ActorRef[Any],
        *,
        models_dir: Path,
        cache_dir: Path | None = None,
        generation: WorkerGeneration = FIRST_GENERATION,
        weights: str = "blocks",
        fetch: Callable[[ProvisionStage], Awaitable[str]] | None = None,
    ) -> None:
        self.worker = worker
        self.stage = stage
        self.models_dir = models_dir
        self.cache_dir = cache_dir
        self.weights = weights
        self.fetch = fetch
        self._generation = generation
        self._locations: dict[RunId, asyncio.Future[tuple[str, JsonObject]]] = {}

    def set_generation(self, generation: WorkerGeneration) -> None:
        self._generation = generation

    def worker_generation(self) -> WorkerGeneration:
        return self._generation

    def _location(self, run: RunId) -> asyncio.Future[tuple[str, JsonObject]]:
        future = self._locations.get(run)
        if future is None:
            future = self._locations[run] = asyncio.get_running_loop().create_future()
        return future

    async def load_weights(self, provision: ProvisionStage) -> None:
        future = self._location(provision.run_id)
        location = weights_location(provision, self.models_dir)
        override = faults.hit("node.weights_path")
        location = str(override["path"]) if override else location
        try:
            if provision.gguf_source.kind is GgufSourceKind.PoolPeer and not override:
                if self.fetch is None:
                    raise RunFaultError(RunFaultReason.WeightDownloadFailed,
                                         "this node cannot fetch PoolPeer weights")
                location = await self.fetch(provision)
            spanned, table = await asyncio.to_thread(validate_weights, provision, location,
                                                     self.cache_dir)
        except Exception as error:  # WeightsError, or a reader bug: both fault the stage
            failure = error if isinstance(error, RunFaultError) else RunFaultError(
                _fault_reason(error), str(error))
            if not future.done():
                future.set_exception(failure)
                future.exception()  # configure_role may never await it
            raise failure from None
        if not future.done():
            future.set_result((location, table))
        self.stage.tell(WeightsFetched(spanned))
        self.stage.tell(scm.WeightsReady())

    async def configure_role(self, provision: ProvisionStage) -> None:
        location, table = await self._location(provision.run_id)
        try:
            cache = self.cache_dir if is_remote(location) else None
            config = llama_stage_config(provision, location, cache, self.weights,
                                        table=table,
                                        content_addressed=self._fetched(location))
        except RoleConfigProblem as error:
            raise RunFaultError(RunFaultReason.WeightLoadFailed, str(error)) from None
        self.worker.tell(gwc.ConfigureRole(ConfigureRole(provision.runtime.role_id, config)))

    def _fetched(self, location: str) -> bool:
        """Whether `location` is in the node's cache of pool-fetched chunks
        (`<models dir>/fetched/`, `swactor.node.pool_weights`)."""
        from swactor.node.pool_weights import FETCHED_DIR

        return not is_remote(location) and Path(location).resolve().is_relative_to(
            (self.models_dir / FETCHED_DIR).resolve())

    async def grant_steps(self, command: GrantSteps) -> None:
        self.worker.tell(gwc.GrantSteps(command))

    async def revoke_steps(self, role_id: RoleId) -> None:
        self.worker.tell(gwc.RevokeSteps(RevokeSteps(role_id)))

    async def reset_role(self, role_id: RoleId) -> None:
        for run, future in list(self._locations.items()):
            if future.done():
                del self._locations[run]
