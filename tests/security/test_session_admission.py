"""The orchestrator session and a node pin their peers' full keys, or are told the pool
is open.

`run_session` is what `swactor orchestrator`, `swactor run` and every test rig call. A
session without a pool file would admit each node by its 64-bit id alone (a hash prefix
of its key, which a ground key can match), so it is refused before anything binds
unless the caller opened the pool on purpose (`open_pool`, `--open-pool`); a node the
pool file does not pin as a `node` is refused too. The command passes `--pool` and
`--open-pool` through to the session. A `StageNode` is held to the same rule: without
a pool file its SWIM participant would admit any key and its QUIC endpoint would take
the orchestrator and its peers by their ids alone.
"""

from __future__ import annotations

import argparse
import io
from dataclasses import replace
from pathlib import Path

import pytest

from swactor.events.emitter import Emitter
from swactor.membership.admission import pool_of
from swactor.node.node import NodeConfig, StageNode
from swactor.orchestrator import orchestrate_cmd
from swactor.orchestrator.session import (
    Pool,
    PoolMember,
    SessionError,
    SessionOptions,
    run_session,
)
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId, RunId


def _member(identity: NodeIdentity) -> PoolMember:
    return PoolMember(NodeId(identity.node_id), "127.0.0.1", 9)


async def _session(options: SessionOptions) -> str:
    with pytest.raises(SessionError) as refused:
        await run_session(options, Emitter("orchestrator", []), io.StringIO(), io.StringIO())
    return str(refused.value)


def _options(tmp_path: Path, orchestrator: NodeIdentity, *nodes: NodeIdentity,
             **changes: object) -> SessionOptions:
    return SessionOptions(identity=orchestrator, nodes=tuple(_member(n) for n in nodes),
                          model=tmp_path / "absent.gguf", prompt_token_ids=(1, 2),
                          decode=False, **changes)  # type: ignore[arg-type]


async def test_a_session_without_a_pool_file_is_refused(tmp_path: Path) -> None:
    orchestrator, node = NodeIdentity.generate(), NodeIdentity.generate()
    error = await _session(_options(tmp_path, orchestrator, node))
    assert "no pool file" in error and "64-bit node id alone" in error, error


async def test_a_node_the_pool_file_does_not_pin_as_a_node_is_refused(tmp_path: Path) -> None:
    orchestrator, node, stranger = (NodeIdentity.generate() for _ in range(3))
    pool = pool_of(orchestrator, [node])
    error = await _session(_options(tmp_path, orchestrator, node, stranger, admission=pool))
    assert f"node {stranger.node_id:016x} is not a node of the pool file" in error, error
    # the orchestrator's own key is pinned, but as the orchestrator: never a stage
    error = await _session(_options(tmp_path, orchestrator, orchestrator, admission=pool))
    assert f"node {orchestrator.node_id:016x} is not a node of the pool file" in error


async def test_a_pinned_or_explicitly_open_session_gets_past_admission(tmp_path: Path) -> None:
    orchestrator, node = NodeIdentity.generate(), NodeIdentity.generate()
    for changes in ({"admission": pool_of(orchestrator, [node])}, {"open_pool": True}):
        error = await _session(_options(tmp_path, orchestrator, node, **changes))
        assert error.startswith("plan: ModelUnreadable") and "absent.gguf" in error, error


async def test_a_serving_pool_is_held_to_the_same_rule(tmp_path: Path) -> None:
    """`Pool.open` builds the orchestrator's endpoint for one prompt and for `--serve`."""
    orchestrator, node = NodeIdentity.generate(), NodeIdentity.generate()
    with pytest.raises(SessionError, match="64-bit node id alone"):
        await Pool.open(_options(tmp_path, orchestrator, node), RunId(1), None)


@pytest.mark.parametrize("serve", [False, True], ids=["prompt", "serve"])
@pytest.mark.parametrize("flags", [["--pool", "POOL"], ["--open-pool"]])
def test_the_command_hands_its_pool_flags_to_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], serve: bool
) -> None:
    from swactor.cli import build_parser
    from swactor.membership.admission import add_member
    from swactor.model.paths import default_model_path
    from swactor.serve import orchestrator_cmd as serve_cmd

    orchestrator = NodeIdentity.load_or_create(tmp_path / "orch.key")
    node = NodeIdentity.generate()
    pool = tmp_path / "pool.txt"
    add_member(pool, orchestrator, "orchestrator")
    add_member(pool, node, "node")
    model = default_model_path()
    if not model.is_file():
        pytest.fail(f"{model} missing: run scripts/setup.sh")
    seen: list[SessionOptions] = []

    async def serving(args: object, options: SessionOptions, *_: object) -> int:
        seen.append(options)
        return 0

    monkeypatch.setattr(orchestrate_cmd, "execute",
                        lambda options, *_: seen.append(options) or 0)
    monkeypatch.setattr(serve_cmd, "_serve", serving)
    args: argparse.Namespace = build_parser("orchestrator").parse_args(
        ["orchestrator", "--key", str(tmp_path / "orch.key"), "--model", str(model),
         "--node", f"{node.node_id}@127.0.0.1:9",
         *(["--serve", "127.0.0.1:0"] if serve else []),
         *(str(pool) if flag == "POOL" else flag for flag in flags)])
    assert args.handler(args) == 0
    (options,) = seen
    if "--open-pool" in flags:
        assert options.admission is None and options.open_pool
    else:
        assert options.admission is not None and not options.open_pool
        assert options.admission.pinned_keys[node.node_id] == pool_of(
            orchestrator, [node]).pinned_keys[node.node_id]


def test_a_node_without_a_pool_file_is_refused() -> None:
    orchestrator, identity = NodeIdentity.generate(), NodeIdentity.generate()
    config = NodeConfig(identity=identity, orchestrator=NodeId(orchestrator.node_id))
    with pytest.raises(ValueError, match="64-bit node id alone"):
        StageNode(config, Emitter("node", []))
    for changes in ({"admission": pool_of(orchestrator, [identity])}, {"open_pool": True}):
        StageNode(replace(config, **changes), Emitter("node", []))  # type: ignore[arg-type]
