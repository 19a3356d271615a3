"""`python -I -m swactor.imagecheck.enter SPEC_JSON`: exec a command inside a root.

Theory of operation. The replayer and the compose runner start every RUN step and
every container process through this launcher (inside a network namespace for a
container: `ip netns exec NS python -I -m swactor.imagecheck.enter ...`). It reads
one JSON object — root, working directory, user, environment, argv — then chroots,
changes directory (creating it, as a Docker engine does for a missing WORKDIR),
takes the user's groups, gid and uid from the root's own /etc/passwd and
/etc/group, and execs argv with exactly that environment (looking argv[0] up on the
environment's PATH inside the root). Any failure before the exec prints one line
naming it and exits 127.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path


class UserError(Exception):
    """A USER that the root's passwd/group files do not define."""


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def _table(path: Path) -> list[list[str]]:
    if not path.is_file():
        return []
    return [line.split(":") for line in path.read_text(errors="replace").splitlines()
            if line and not line.startswith("#")]


def resolve_user(root: Path, user: str) -> Identity:
    """USER `name|uid[:group|gid]` against the root's /etc/passwd and /etc/group."""
    name, _, group = user.partition(":")
    passwd = _table(root / "etc/passwd")
    groups = _table(root / "etc/group")
    entry = next((e for e in passwd if len(e) >= 7 and (e[0] == name or e[2] == name)), None)
    if entry is None:
        if not name.isdigit():
            raise UserError(f"user {name!r} is not in the image's /etc/passwd")
        uid, gid, home, login = int(name), int(name), "/", None
    else:
        uid, gid, home, login = int(entry[2]), int(entry[3]), entry[5] or "/", entry[0]
    if group:
        found = next((g for g in groups if len(g) >= 3 and (g[0] == group or g[2] == group)),
                     None)
        if found is None and not group.isdigit():
            raise UserError(f"group {group!r} is not in the image's /etc/group")
        gid = int(found[2]) if found is not None else int(group)
    extra = tuple(sorted({int(g[2]) for g in groups
                          if len(g) >= 4 and login and login in g[3].split(",")} | {gid}))
    return Identity(uid, gid, extra, home)


def main(argv: list[str]) -> int:
    try:
        spec = json.loads(argv[0])
        root = Path(spec["root"])
        ident = resolve_user(root, spec["user"])
        env = dict(spec["env"])
        env.setdefault("HOME", ident.home)
        os.chroot(root)
        os.makedirs(spec["workdir"], exist_ok=True)
        os.chdir(spec["workdir"])
        os.setgroups(list(ident.groups))
        os.setgid(ident.gid)
        os.setuid(ident.uid)
        command = list(spec["argv"])
        os.execvpe(command[0], command, env)
    except (OSError, KeyError, ValueError, UserError, IndexError) as error:
        print(f"swactor.imagecheck.enter: {error}", file=sys.stderr, flush=True)
        return 127
    return 127  # pragma: no cover - execvpe does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
