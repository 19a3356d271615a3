"""WorkerStagePorts: GGUF checks before the worker is asked, ConfigureRole after them (§15).

Real actors collect what the ports send; the GGUF files are tiny ones the test writes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from swactor.actors import Actor, Context, Runtime
from swactor.fsm.generated import gpu_worker_ctl as gwc
from swactor.fsm.generated import stage_controller as scm
from swactor.node.stage_ports import WeightsFetched
from swactor.node.stage_worker_ports import WorkerStagePorts
from swactor.orchestrator.inventory import synthetic_pool
from swactor.orchestrator.model_info import model_info_from_gguf
from swactor.orchestrator.planner import PlanRequest, plan_run, stage_runtime_facts
from swactor.wire import (
    GgufSource,
    GgufSourceKind,
    PromptSource,
    ProvisionStage,
    RunFaultError,
    RunFaultReason,
    RunId,
    provision_stage,
)
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf
from tests.orchestrator.conftest import synthetic_model

TINY = TinyConfig(blocks=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=64, context=32)


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("worker-ports") / "tiny.gguf", TINY)


class Inbox(Actor[Any]):
    def __init__(self, box: list[Any]) -> None:
        self.box = box

    async def receive(self, ctx: Context[Any], message: Any) -> None:
        self.box.append(message)


def provision_for(gguf: Path, *, source: GgufSource | None = None, blocks: int | None = None,
                  stage: int = 1) -> ProvisionStage:
    model = (model_info_from_gguf(gguf, with_stop_ids=False) if blocks is None
             else synthetic_model(blocks=blocks, hidden=TINY.hidden, context=TINY.context))
    request = PlanRequest(run_id=RunId(4), prompt=PromptSource.from_token_ids((1, 2)),
                          max_tokens=2, max_seq_len=16, first_edge_id=50,
                          gguf_source=source or GgufSource(GgufSourceKind.LocalPath, str(gguf)))
    plan = plan_run(synthetic_pool(2), model, request).plan
    return provision_stage(plan, stage, stage_runtime_facts(plan, stage))


def run_ports(gguf: Path, body: Any, cache_dir: Path | None = None) -> None:
    async def main() -> None:
        async with Runtime("node") as runtime:
            worker_box: list[Any] = []
            stage_box: list[Any] = []
            ports = WorkerStagePorts(runtime.spawn(lambda: Inbox(worker_box), "worker"),
                                     runtime.spawn(lambda: Inbox(stage_box), "stage"),
                                     models_dir=gguf.parent, cache_dir=cache_dir)
            await body(ports, worker_box, stage_box)

    asyncio.run(asyncio.wait_for(main(), timeout=20))


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_weights_checked_then_role_configured(gguf: Path) -> None:
    provision = provision_for(gguf, source=GgufSource(GgufSourceKind.CacheKey, gguf.name))

    async def body(ports: WorkerStagePorts, worker: list[Any], stage: list[Any]) -> None:
        configure = asyncio.ensure_future(ports.configure_role(provision))
        await settle()
        assert worker == [], "no ConfigureRole before the weights are checked"
        await ports.load_weights(provision)
        await configure
        await settle()
        fetched, ready = stage
        assert isinstance(fetched, WeightsFetched) and fetched.bytes_fetched > 0
        assert isinstance(ready, scm.WeightsReady)
        (command,) = worker
        assert isinstance(command, gwc.ConfigureRole)
        config = command.command.config
        assert isinstance(config, dict)
        assert command.command.role_id == provision.runtime.role_id
        assert (config["kind"], config["gguf"]) == ("llama_stage", str(gguf))
        assert (config["layer_start"], config["layer_end"], config["last"]) == (1, 2, True)
        table = config["table"]  # the worker loads by the node's header read
        assert isinstance(table, dict)
        assert {entry[0] for entry in table["tensors"]} >= {"blk.1.attn_q.weight",
                                                            "output_norm.weight"}
        assert not any(str(entry[0]).startswith("blk.0.") for entry in table["tensors"])

    run_ports(gguf, body)


def test_a_remote_stage_is_downloaded_before_weights_ready(gguf: Path, tmp_path: Path) -> None:
    """WeightsFetched / WeightsReady (weights_downloaded) come after the stage's tensor
    bytes are in the node's cache, and the worker's own load then reads nothing more over
    the network."""
    from swactor.model.artifact_server import ArtifactServer, file_sha256
    from swactor.model.gguf_range import open_reader

    digest = file_sha256(gguf)
    with ArtifactServer(gguf) as server:
        provision = provision_for(gguf, source=GgufSource(GgufSourceKind.HttpUrl, server.url,
                                                          digest))

        async def body(ports: WorkerStagePorts, worker: list[Any], stage: list[Any]) -> None:
            await ports.load_weights(provision)
            await settle()
            fetched, ready = stage
            assert isinstance(fetched, WeightsFetched) and isinstance(ready, scm.WeightsReady)
            served = server.bytes_served
            worker_reader = open_reader(server.url, digest=digest, cache_dir=tmp_path)
            weights = worker_reader.load_stage(1, 2, is_first=False, is_last=True)
            assert server.bytes_served == served, "the worker's load came from the cache"
            assert fetched.bytes_fetched >= weights.tensor_bytes
            assert served >= worker_reader.header_bytes + weights.tensor_bytes

        run_ports(gguf, body, cache_dir=tmp_path)


@pytest.mark.parametrize(("case", "reason"), [
    ("range", RunFaultReason.WeightLoadFailed),      # the plan has 6 blocks, the file 2
    ("missing", RunFaultReason.WeightDownloadFailed),
])
def test_weight_failures_raise_their_reason_and_block_the_role(
    gguf: Path, case: str, reason: RunFaultReason
) -> None:
    if case == "range":
        provision = provision_for(gguf, blocks=6)
    else:
        provision = provision_for(gguf, source=GgufSource(GgufSourceKind.LocalPath,
                                                          str(gguf.parent / "absent.gguf")))

    async def body(ports: WorkerStagePorts, worker: list[Any], stage: list[Any]) -> None:
        with pytest.raises(RunFaultError) as raised:
            await ports.load_weights(provision)
        assert raised.value.reason is reason
        with pytest.raises(RunFaultError):
            await ports.configure_role(provision)
        await settle()
        assert worker == [] and stage == []

    run_ports(gguf, body)


def test_a_node_parses_a_files_header_once_until_the_file_changes(tmp_path: Path) -> None:
    import os

    from swactor.node.stage_worker_ports import header_reader, validate_weights

    path = write_tiny_gguf(tmp_path / "tiny.gguf", TINY)
    first = header_reader(str(path), None, None)
    assert first.header_bytes > 0 and first.source.bytes_read == first.header_bytes
    again = header_reader(str(path), None, None)
    assert again.source.bytes_read == 0 and again.header_bytes == 0
    assert again.facts == first.facts and again.tensors == first.tensors
    provision = provision_for(path)
    assert validate_weights(provision, str(path), None) == validate_weights(provision,
                                                                            str(path), None)
    info = path.stat()
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000))
    rewritten = header_reader(str(path), None, None)
    assert rewritten.source.bytes_read == rewritten.header_bytes > 0
