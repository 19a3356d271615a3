"""Weights from the pool: what each stage fetches of SmolLM2 and how fast (spec §15).

Theory of operation: one process holds an orchestrator QUIC endpoint offering the model
(`orchestrator.offer`) and one endpoint per stage, each with its own empty cache, all on
loopback (real aioquic, mutual TLS). For a `--stages` split it times, per stage, the
first fetch (`node.pool_weights.PoolWeights`: manifest, header, the stage's chunks, each
verified) and a second one (nothing fetched: chunks re-hashed from the cache), and
prints bytes fetched over the stage's share (goal <= 1.05) and the fetch rate. The
offer's one-time hash of the file is timed apart.

`--model URL` path: the same file served over HTTP on loopback
(`model.artifact_server`, Range requests, ETag = SHA-256); per stage, the node's own
weight step (`node.stage_worker_ports.validate_weights` into an empty cache: header,
checks, the stage's coalesced tensor ranges) twice, with the bytes the server sent
over the stage's share.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from swactor.model.paths import default_model_path


async def measure(model: Path, stages: int, root: Path) -> int:
    from swactor.model.fetch import offer_file
    from swactor.node.pool_weights import PoolWeights
    from swactor.orchestrator.inventory import synthetic_pool
    from swactor.orchestrator.model_info import model_info_from_gguf
    from swactor.orchestrator.offer import serve_offer
    from swactor.orchestrator.planner import PlanRequest, plan_run, stage_runtime_facts
    from swactor.transport.artifact_stream import ArtifactChannel
    from swactor.transport.config import TransportConfig
    from swactor.transport.endpoint import QuicEndpoint
    from swactor.transport.identity import NodeIdentity
    from swactor.wire import GgufSource, PromptSource, RunId, provision_stage

    config = TransportConfig(max_datagram_size=16383)
    ids = [NodeIdentity.generate() for _ in range(stages + 1)]
    orch = QuicEndpoint(ids[0], config, allowed={i.node_id for i in ids[1:]})
    nodes = [QuicEndpoint(i, config, allowed={ids[0].node_id}) for i in ids[1:]]
    for endpoint in (orch, *nodes):
        await endpoint.start()
    for node in nodes:
        node.address_book[orch.node_id] = orch.address
    started = time.perf_counter()
    offered = await asyncio.to_thread(offer_file, model)
    hashed = time.perf_counter() - started
    server, item = serve_offer(orch, offered)
    source = GgufSource.pool_peer(orch.node_id, offered.manifest_sha256, offered.sha256)
    info = model_info_from_gguf(model, with_stop_ids=False)
    plan = plan_run(synthetic_pool(stages), info, PlanRequest(
        run_id=RunId(1), prompt=PromptSource.from_token_ids((1,)), max_tokens=1,
        max_seq_len=64, gguf_source=source)).plan
    print(f"model {model.name}: {offered.path.stat().st_size} bytes, offer hash "
          f"{hashed:.2f} s (file sha256 + {len(offered.manifest)}-byte chunk manifest)")
    print("stage  layers   share B      fetched B    fetched/share  first s  MiB/s  "
          "second: fetched B  s")
    worst = 0.0
    try:
        for index, node in enumerate(nodes):
            provision = provision_stage(plan, index, stage_runtime_facts(plan, index))
            fetcher = PoolWeights(ArtifactChannel(node), root / f"node-{index}")
            t0 = time.perf_counter()
            await fetcher(provision)
            first_s = time.perf_counter() - t0
            first = fetcher.fetches[-1]
            t0 = time.perf_counter()
            await fetcher(provision)
            second_s = time.perf_counter() - t0
            second = fetcher.fetches[-1]
            ratio = first.fetched_bytes / first.share_bytes
            worst = max(worst, ratio)
            rate = first.fetched_bytes / first_s / (1 << 20)
            print(f"{index:5d}  {provision.layer_start:2d}-{provision.layer_end_exclusive:<2d}"
                  f"    {first.share_bytes:11d}  {first.fetched_bytes:11d}  {ratio:13.3f}"
                  f"  {first_s:7.2f}  {rate:5.0f}  {second.fetched_bytes:17d}  {second_s:.2f}")
    finally:
        item.close()
        for endpoint in (orch, *nodes):
            await endpoint.close()
    print(f"worst fetched/share {worst:.3f} (goal <= 1.05); served {server.served_bytes} "
          f"bytes in {server.served_requests} requests")
    worst_url = await asyncio.to_thread(measure_url, model, plan, root)
    return 0 if max(worst, worst_url) <= 1.05 else 1


def measure_url(model: Path, plan: Any, root: Path) -> float:
    """The `--model URL` rows (module doc); the worst fetched/share."""
    from dataclasses import replace

    from swactor.model.artifact_server import ArtifactServer
    from swactor.model.source import forget_small_reads
    from swactor.node import stage_worker_ports
    from swactor.orchestrator.planner import stage_runtime_facts
    from swactor.wire import GgufSource, provision_stage

    print("--model URL (HTTP Range on loopback): each stage's node into an empty cache")
    print("stage  layers   share B      fetched B    fetched/share  first s  MiB/s  "
          "second: fetched B  s")
    worst = 0.0
    with ArtifactServer(model) as server:
        source = GgufSource.http_url(server.url, sha256=server.sha256)
        for index in range(len(plan.stages)):
            provision = provision_stage(plan, index, stage_runtime_facts(plan, index))
            provision = replace(provision, gguf_source=source)
            cache = root / f"http-{index}"
            row = []
            for _ in range(2):  # a node process of its own each time: nothing kept in memory
                stage_worker_ports._HEADERS.clear()
                forget_small_reads()
                before = server.bytes_served
                t0 = time.perf_counter()
                stage_worker_ports.validate_weights(provision, server.url, cache)
                row.append((server.bytes_served - before, time.perf_counter() - t0))
            stage_worker_ports._HEADERS.clear()  # parse it again (from the cache) to count it
            reader = stage_worker_ports.header_reader(server.url, server.sha256, cache)
            entries = reader.validate_stage(
                provision.layer_start, provision.layer_end_exclusive,
                is_first=index == 0, is_last=index == len(plan.stages) - 1)
            share = reader.header_bytes + sum(e.n_bytes for e in entries)
            (first, first_s), (second, second_s) = row
            ratio = first / share
            worst = max(worst, ratio)
            print(f"{index:5d}  {provision.layer_start:2d}-{provision.layer_end_exclusive:<2d}"
                  f"    {share:11d}  {first:11d}  {ratio:13.3f}  {first_s:7.2f}  "
                  f"{first / first_s / (1 << 20):5.0f}  {second:17d}  {second_s:.2f}")
    print(f"worst fetched/share over the URL {worst:.3f} (goal <= 1.05)")
    return worst


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench weights_fetch",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--stages", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="swactor-fetch-bench-") as root:
        return asyncio.run(measure(args.model, args.stages, Path(root)))
