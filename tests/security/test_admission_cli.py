"""Pool admission on the command line: SWIM is pinned by default, open only on request.

Real `swactor node` / `swactor orchestrator` processes: SWIM without a pool file is
refused (exit 2, naming `--pool` and `--open-pool`) before anything binds; a pool file
that does not pin the process's own key, or pins it in the other role, is refused
naming the key; a pool file that pins only a 64-bit node id is refused; `--open-pool` is
accepted with a warning on stderr; `swactor pool add` / `show` write and read the file.
Without SWIM the same holds: `--node ID@HOST:PORT` and `--trust-orchestrator ID` name a
peer by 64 bits of its key's hash, so without `--pool` (which pins the full keys) they
are refused, and `--open-pool` accepts them only with a warning.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from swactor.membership.admission import PoolFileError, add_member, load_pool, parse_pool
from swactor.transport.identity import NodeIdentity

pytestmark = pytest.mark.timeout(300)


def swactor(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swactor.cli", *argv], capture_output=True,
                          text=True, timeout=timeout)


def pinned(tmp_path: Path) -> Path:
    """A pool file pinning orch.key (orchestrator) and node.key (node)."""
    pool = tmp_path / "pool.txt"
    assert swactor("pool", "add", str(pool), "--key", str(tmp_path / "orch.key"),
                   "--role", "orchestrator", "--name", "orch").returncode == 0
    assert swactor("pool", "add", str(pool), "--key", str(tmp_path / "node.key"),
                   "--name", "n0").returncode == 0
    return pool


def test_pool_add_and_show_pin_full_public_keys(tmp_path: Path) -> None:
    pool = pinned(tmp_path)
    shown = swactor("pool", "show", str(pool), "--json")
    assert shown.returncode == 0, shown.stderr
    members = [json.loads(line) for line in shown.stdout.splitlines()]
    orch = NodeIdentity.load(tmp_path / "orch.key")
    node = NodeIdentity.load(tmp_path / "node.key")
    assert [(m["role"], m["node_id"], m["name"]) for m in members] == [
        ("orchestrator", orch.node_id, "orch"), ("node", node.node_id, "n0")]
    assert all(len(bytes.fromhex(m["public_key"])) == 32 for m in members)
    again = swactor("pool", "add", str(pool), "--key", str(tmp_path / "node.key"))
    assert again.returncode == 2 and "listed twice" in again.stderr


def test_a_node_id_or_junk_is_not_a_pin(tmp_path: Path) -> None:
    identity = NodeIdentity.generate()
    with pytest.raises(PoolFileError, match="64 hex digits"):
        parse_pool(f"node {identity.node_id:016x}\n")
    with pytest.raises(PoolFileError, match="role"):
        parse_pool("admin " + "00" * 32 + "\n")
    with pytest.raises(PoolFileError, match="no members"):
        parse_pool("# nothing\n")
    big = tmp_path / "big.txt"
    big.write_bytes(b"#" * ((1 << 20) + 1))
    with pytest.raises(PoolFileError, match="larger than"):
        load_pool(big)
    pool = tmp_path / "pool.txt"
    add_member(pool, identity, "node")
    assert load_pool(pool).stage_ids == {identity.node_id}


def test_swim_without_a_pool_file_is_refused(tmp_path: Path) -> None:
    node = swactor("node", "--key", str(tmp_path / "n.key"), "--trust-orchestrator", "1",
                   "--swim", "127.0.0.1:0")
    assert node.returncode == 2 and "--pool" in node.stderr and "--open-pool" in node.stderr
    orch = swactor("orchestrator", "--key", str(tmp_path / "o.key"), "--seed", "127.0.0.1:9")
    assert orch.returncode == 2 and "--pool" in orch.stderr and "--open-pool" in orch.stderr
    assert "Traceback" not in node.stderr + orch.stderr


def test_a_pool_file_without_our_key_is_refused(tmp_path: Path) -> None:
    pool = pinned(tmp_path)
    stranger = swactor("node", "--key", str(tmp_path / "other.key"), "--swim", "127.0.0.1:0",
                       "--pool", str(pool))
    assert stranger.returncode == 2 and "is not in the pool file" in stranger.stderr
    # the orchestrator's key pinned as the orchestrator cannot serve as a node
    wrong_role = swactor("node", "--key", str(tmp_path / "orch.key"), "--swim", "127.0.0.1:0",
                         "--pool", str(pool))
    assert wrong_role.returncode == 2 and "is pinned as 'orchestrator'" in wrong_role.stderr
    orch = swactor("orchestrator", "--key", str(tmp_path / "node.key"), "--seed",
                   "127.0.0.1:9", "--pool", str(pool))
    assert orch.returncode == 2 and "is pinned as 'node'" in orch.stderr
    # --trust-orchestrator must name the pool's orchestrator
    other = swactor("node", "--key", str(tmp_path / "node.key"), "--swim", "127.0.0.1:0",
                    "--pool", str(pool), "--trust-orchestrator", "0x1234")
    assert other.returncode == 2 and "is not an orchestrator of the pool file" in other.stderr


def test_an_open_pool_is_explicit_and_warned(tmp_path: Path) -> None:
    # the node accepts --open-pool with a warning, then fails its boot on purpose (arena)
    node = swactor("node", "--key", str(tmp_path / "n.key"), "--trust-orchestrator", "1",
                   "--swim", "127.0.0.1:0", "--open-pool", "--arena-ceiling", str(1 << 62))
    assert "warning: --open-pool" in node.stderr and "stranger can join" in node.stderr
    assert node.returncode == 1 and "boot failed: arena" in node.stderr
    orch = swactor("orchestrator", "--key", str(tmp_path / "o.key"), "--seed", "127.0.0.1:9",
                   "--open-pool", "--model", str(tmp_path / "absent.gguf"))
    assert "warning: --open-pool" in orch.stderr
    assert orch.returncode == 2 and "absent.gguf not found" in orch.stderr
    both = swactor("node", "--key", str(tmp_path / "n.key"), "--trust-orchestrator", "1",
                   "--swim", "127.0.0.1:0", "--open-pool", "--pool", str(tmp_path / "p"))
    assert both.returncode == 2 and "not allowed with" in both.stderr


def test_a_pinned_swim_member_refuses_a_stranger_process(tmp_path: Path) -> None:
    """Two real `swactor swim` processes: the pinned one reports the stranger's join as a
    forged datagram, NotInPool, and never lists it as a member."""
    pool = tmp_path / "pool.txt"
    add_member(pool, NodeIdentity.load_or_create(tmp_path / "member.key"), "node")
    stranger_id = NodeIdentity.load_or_create(tmp_path / "stranger.key").node_id
    member = subprocess.Popen([sys.executable, "-m", "swactor.cli", "swim", "--key",
                               str(tmp_path / "member.key"), "--pool", str(pool),
                               "--scale", "0.2"], stdout=subprocess.PIPE, text=True)
    stranger: subprocess.Popen[str] | None = None
    try:
        assert member.stdout is not None
        started = json.loads(member.stdout.readline())
        stranger = subprocess.Popen([sys.executable, "-m", "swactor.cli", "swim", "--key",
                                     str(tmp_path / "stranger.key"), "--seed",
                                     started["swim"], "--scale", "0.2"],
                                    stdout=subprocess.DEVNULL)
        seen = []
        for line in member.stdout:
            seen.append(json.loads(line))
            if seen[-1]["event"] == "forged":
                break
        assert seen[-1] == {**seen[-1], "event": "forged", "claimed": stranger_id,
                            "reason": "NotInPool"}
        assert not any(e["event"] == "member" and e["node_id"] == stranger_id for e in seen)
    finally:
        for process in (member, stranger):
            if process is not None:
                process.terminate()
                process.wait(timeout=30)


def test_fixed_ids_without_a_pool_file_are_refused(tmp_path: Path) -> None:
    node = swactor("node", "--key", str(tmp_path / "n.key"), "--trust-orchestrator", "1")
    assert node.returncode == 2 and node.stdout == "", node.stderr
    assert "--trust-orchestrator ID without --pool admits peers by their 64-bit node id " \
           "alone" in node.stderr and "--open-pool" in node.stderr
    orch = swactor("orchestrator", "--key", str(tmp_path / "o.key"),
                   "--node", "1@127.0.0.1:9", "--model", str(tmp_path / "absent.gguf"))
    assert orch.returncode == 2 and orch.stdout == "", orch.stderr
    assert "--node ID@HOST:PORT without --pool admits peers by their 64-bit node id " \
           "alone" in orch.stderr and "absent.gguf" not in orch.stderr
    assert "Traceback" not in node.stderr + orch.stderr


def test_fixed_ids_with_a_pool_file_pin_the_full_keys(tmp_path: Path) -> None:
    from swactor.cli import build_parser
    from swactor.membership.admission import public_key_bytes
    from swactor.membership.cli import admission_from_args

    pool = pinned(tmp_path)
    orch_key, node_key = (NodeIdentity.load(tmp_path / f"{n}.key") for n in ("orch", "node"))
    args = build_parser("node").parse_args(
        ["node", "--key", str(tmp_path / "node.key"), "--pool", str(pool)])
    admission = admission_from_args(args, node_key, "node", "swactor node", swim=False)
    assert admission is not None  # what the node's QUIC endpoint pins (NodeConfig.admission)
    assert admission.pinned_keys[orch_key.node_id] == public_key_bytes(orch_key)
    # the pool file stands in for --trust-orchestrator; the node then boots (and fails
    # its boot on purpose: the arena), so the pool was accepted without SWIM
    node = swactor("node", "--key", str(tmp_path / "node.key"), "--pool", str(pool),
                   "--arena-ceiling", str(1 << 62))
    assert node.returncode == 1 and "boot failed: arena" in node.stderr, node.stderr
    listed = f"{node_key.node_id}@127.0.0.1:9"
    orch = swactor("orchestrator", "--key", str(tmp_path / "orch.key"), "--node", listed,
                   "--pool", str(pool), "--model", str(tmp_path / "absent.gguf"))
    assert orch.returncode == 2 and "absent.gguf not found" in orch.stderr, orch.stderr
    stranger = swactor("orchestrator", "--key", str(tmp_path / "orch.key"), "--node",
                       f"{orch_key.node_id}@127.0.0.1:9", "--pool", str(pool))
    assert stranger.returncode == 2 and "is not a node of the pool file" in stranger.stderr


def test_fixed_ids_with_an_open_pool_are_warned(tmp_path: Path) -> None:
    node = swactor("node", "--key", str(tmp_path / "n.key"), "--trust-orchestrator", "1",
                   "--open-pool", "--arena-ceiling", str(1 << 62))
    assert "warning: --open-pool: peers are admitted by their 64-bit node id alone" \
        in node.stderr
    assert node.returncode == 1 and "boot failed: arena" in node.stderr
