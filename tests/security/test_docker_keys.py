"""docker/: no container sees another's private key, and none runs as root but `keys`.

The one-shot `keys` service makes every private key in a volume of its own (mounted
under /keys) and writes the pool file; each long-running service mounts exactly one of
those volumes, its own, and passes the key on it as `--key`; no two services share a
key volume. The image runs as an unprivileged user and only `keys` overrides it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from swactor.imagecheck.dockerfile import parse

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """Volume name -> path inside the container."""
    found: dict[str, str] = {}
    for entry in service.get("volumes", []):
        source, target = str(entry).split(":")[:2]
        found[source] = target
    return found


def test_each_service_mounts_only_its_own_private_key() -> None:
    services: dict[str, dict[str, Any]] = yaml.safe_load(COMPOSE.read_text())["services"]
    key_volumes = {volume for volume, path in _mounts(services["keys"]).items()
                   if path.startswith("/keys")}
    assert key_volumes, "the keys service makes the keys in volumes under /keys"
    owners: dict[str, str] = {}
    runners = {name: s for name, s in services.items() if name != "keys"}
    assert {"node1", "node2", "node3", "orchestrator"} <= set(runners)
    for name, service in runners.items():
        mounts = _mounts(service)
        mine = key_volumes & set(mounts)
        assert len(mine) == 1, f"{name} mounts key volumes {sorted(mine)}"
        (volume,) = mine
        assert volume not in owners, f"{name} shares {volume} with {owners.get(volume)}"
        owners[volume] = name
    for volume, name in owners.items():
        service, mounts = runners[name], _mounts(runners[name])
        command = [str(word) for word in service["command"]]
        key = command[command.index("--key") + 1]
        assert key.startswith(mounts[volume] + "/"), (name, key, mounts[volume])
        pool = next(str(v) for v in service["volumes"] if str(v).startswith("pool:"))
        assert pool.endswith(":ro"), f"{name} may write the pool file: {pool}"


def test_only_the_keys_service_runs_as_root() -> None:
    services: dict[str, dict[str, Any]] = yaml.safe_load(COMPOSE.read_text())["services"]
    users = [i.source.split(None, 1)[1].strip() for i in parse(DOCKERFILE.read_text())
             if i.keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    overridden = {name for name, s in services.items() if "user" in s}
    assert overridden <= {"keys"}, overridden
