"""Replay a Dockerfile's build, step by step, on a bare Debian root (no Docker engine).

Theory of operation. `replay(dockerfile, context, work)` parses the Dockerfile
(`dockerfile.parse`: whatever it does not understand is refused, by name, before
anything runs), stands in for the `FROM` image with the cached bare bookworm root
(`rootfs.base_root`; only a Debian bookworm base can be stood in for, any other is
refused), and mounts an overlay over it — the image's one writable layer,
`work/image/upper` — at `work/image/root`. Then each instruction in file order:

- `ARG`, `ENV`, `WORKDIR`, `USER`, `SHELL`, `ENTRYPOINT`, `CMD`, `EXPOSE`, `VOLUME`,
  `LABEL` change the build state (`dockerfile.Stage`); `WORKDIR` also creates its
  directory, `VOLUME` its mount points;
- `COPY` copies from the repository what the build context holds (the Dockerfile's
  ignore file applied, `context.py`), with Docker's rules for a directory source (its
  contents), several sources (into a directory) and `--chown`;
- `RUN` runs in the root through `enter.py` (chroot, the build's user, working
  directory and environment: the ARGs in scope and the ENV, plus `HOME`), with the
  host's /proc, /dev and /sys and its DNS, CA bundle and pip configuration mounted
  (`rootfs.HostNetwork`), as a `docker build` inherits its host's network. Its output
  streams to `log` with each line prefixed by the step.

A step that fails stops the replay with `StepFailed`, which names the step
(`step 5/14, Dockerfile line 38: RUN pip install ...`), its exit status and the last
lines of its output. The result, `Image`, is the overlay's layers plus the image
configuration a `docker run` would use (ENV, WORKDIR, USER, ENTRYPOINT, CMD,
VOLUMEs); `work` keeps the layer until `Image.remove()`.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from swactor.imagecheck import enter
from swactor.imagecheck.context import ContextError, IgnoreRules, context_files, ignore_file_for
from swactor.imagecheck.dockerfile import DockerfileError, Instruction, Stage, parse, words
from swactor.imagecheck.rootfs import (
    HostNetwork,
    Mounts,
    RootfsError,
    base_root,
    remove_tree,
)

# Base images the bare root stands in for: the Debian bookworm family.
STAND_IN_SUITE = "bookworm"
TAIL_LINES = 25


class StepFailed(Exception):
    """A replayed step failed: names the step, its line and why (module doc)."""

    def __init__(self, step: str, reason: str, tail: list[str]) -> None:
        super().__init__(f"{step} failed: {reason}"
                         + ("\n  | " + "\n  | ".join(tail) if tail else ""))
        self.step = step
        self.reason = reason
        self.tail = tail


def launcher(spec: Mapping[str, object]) -> list[str]:
    """argv that runs `spec` (enter.py's JSON) with the host's interpreter, isolated."""
    return [sys.executable, "-I", str(Path(enter.__file__).resolve()), json.dumps(spec)]


@dataclass
class Image:
    """A replayed image: its layers (upper first) and its run configuration."""

    layers: list[Path]
    env: dict[str, str]
    workdir: str
    user: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    volumes: list[str]
    exposed: list[str]
    base: str
    seconds: float
    work: Path

    def remove(self) -> None:
        remove_tree(self.work / "image")


@dataclass
class Replayer:
    dockerfile: Path
    context: Path
    work: Path
    cache: Path
    build_args: Mapping[str, str] = field(default_factory=dict)
    log: TextIO = sys.stderr
    keep_failed: bool = False
    say: Callable[[str], None] = lambda text: print(f"[docker-check] {text}",
                                                    file=sys.stderr, flush=True)

    def replay(self) -> Image:
        """Replay every step (module doc); on failure the layer is removed unless
        `keep_failed`."""
        try:
            return self._replay()
        except BaseException:
            if not self.keep_failed and (self.work / "image").exists():
                remove_tree(self.work / "image")
            raise

    def _replay(self) -> Image:
        started = time.monotonic()
        text = self.dockerfile.read_text()
        try:
            instructions = parse(text)
        except DockerfileError as error:
            raise StepFailed(f"parsing {self.dockerfile}", str(error), []) from None
        ignore = ignore_file_for(self.dockerfile, self.context)
        rules = IgnoreRules(ignore.read_text() if ignore else "")
        stage = Stage(build_args=dict(self.build_args))
        total = len(instructions)
        root_dir = self.work / "image"
        if root_dir.exists():
            remove_tree(root_dir)
        upper, root = root_dir / "upper", root_dir / "root"
        base: Path | None = None
        network = HostNetwork(root_dir / "host")
        with Mounts() as mounts:
            for number, ins in enumerate(instructions, 1):
                label = f"step {number}/{total}, Dockerfile line {ins.line}: {_short(ins)}"
                self.say(label)
                try:
                    if ins.keyword == "FROM":
                        stage.apply(ins)
                        assert stage.base is not None
                        self._check_base(stage.base, label)
                        base = base_root(self.cache, self.say)
                        mounts.overlay([base], upper, root_dir / "work", root)
                    elif stage.apply(ins):
                        if ins.keyword == "WORKDIR":
                            self._mkdir(root, stage.workdir, stage.user)
                        elif ins.keyword == "VOLUME":
                            for path in stage.volumes:
                                self._mkdir(root, path, "root")
                    elif ins.keyword == "COPY":
                        self._copy(ins, stage, root, rules)
                    else:
                        self._run(ins, stage, root, network, label)
                except (DockerfileError, ContextError, RootfsError, OSError,
                        enter.UserError) as error:
                    raise StepFailed(label, str(error), []) from None
        unused = set(self.build_args) - stage.used_build_args
        if unused:
            self.say(f"warning: build args never declared by an ARG: {sorted(unused)}")
        assert base is not None and stage.base is not None
        return Image([upper, base], dict(stage.env), stage.workdir, stage.user,
                     stage.entrypoint, stage.cmd, list(stage.volumes), list(stage.exposed),
                     stage.base, time.monotonic() - started, self.work)

    def _check_base(self, image: str, label: str) -> None:
        tag = image.rpartition(":")[2] if ":" in image.rpartition("/")[2] else ""
        if STAND_IN_SUITE not in tag:
            raise StepFailed(label, f"base image {image!r} is not a Debian {STAND_IN_SUITE} "
                             "image; the replay stands in for those only", [])

    def _mkdir(self, root: Path, path: str, user: str) -> None:
        target = inside_root(root, path)
        target.mkdir(parents=True, exist_ok=True)
        if user != "root":
            ident = enter.resolve_user(root, user)
            os.chown(target, ident.uid, ident.gid)

    def _copy(self, ins: Instruction, stage: Stage, root: Path, rules: IgnoreRules) -> None:
        parts = ([*ins.exec_form] if ins.exec_form is not None
                 else words(ins.rest, stage.scope()))
        if len(parts) < 2:
            raise DockerfileError(f"{ins.where()}: COPY needs a source and a destination")
        sources, dest = parts[:-1], parts[-1]
        for source in sources:
            if any(c in source for c in "*?["):
                raise DockerfileError(f"{ins.where()}: wildcard sources are not replayed")
        dest_path = posixpath.normpath(posixpath.join(stage.workdir, dest))
        into_dir = dest.endswith("/") or dest in (".", "./") or len(sources) > 1
        owner: enter.Identity | None = None
        for name, value in ins.flags:
            if name == "chown":
                owner = enter.resolve_user(root, value)
        for source in sources:
            files = context_files(self.context, source, rules)
            src = posixpath.normpath(source).lstrip("/")
            is_dir = (self.context / src).is_dir() and not (self.context / src).is_symlink()
            for rel in files:
                if is_dir:
                    inner = posixpath.relpath(rel, src) if src != "." else rel
                    target = posixpath.join(dest_path, inner)
                elif into_dir or inside_root(root, dest_path).is_dir():
                    target = posixpath.join(dest_path, posixpath.basename(rel))
                else:
                    target = dest_path
                self._copy_one(self.context / rel, inside_root(root, target), owner)

    @staticmethod
    def _copy_one(source: Path, target: Path, owner: enter.Identity | None) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.is_file():
            target.unlink()
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        else:
            shutil.copy2(source, target)
        uid, gid = (owner.uid, owner.gid) if owner else (0, 0)
        os.lchown(target, uid, gid)

    def _run(self, ins: Instruction, stage: Stage, root: Path, network: HostNetwork,
             label: str) -> None:
        argv = list(ins.exec_form) if ins.exec_form is not None else [*stage.shell, ins.rest]
        env = {**network.env(), **stage.run_env()}
        spec = {"root": str(root), "workdir": stage.workdir, "user": stage.user,
                "env": env, "argv": argv}
        with Mounts() as mounts:
            mounts.system(root)
            with network.mounted(root, mounts):
                tail = self._stream(launcher(spec), number_label(label))
        code, lines = tail
        if code != 0:
            raise StepFailed(label, f"exit status {code}", lines)

    def _stream(self, argv: list[str], prefix: str) -> tuple[int, list[str]]:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, errors="replace",
                                   env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        assert process.stdout is not None
        tail: list[str] = []
        for line in process.stdout:
            line = line.rstrip("\n")
            tail = [*tail[-(TAIL_LINES - 1):], line]
            print(f"{prefix} {line}", file=self.log, flush=True)
        return process.wait(), tail


def number_label(label: str) -> str:
    return "[" + label.split(",", 1)[0] + "]"


def _short(ins: Instruction, width: int = 100) -> str:
    text = ins.source
    return text if len(text) <= width else text[:width - 3] + "..."


def inside_root(root: Path, path: str) -> Path:
    """`path` (absolute, inside the image) under `root`; refuses a path whose existing
    part leads out of the root through a symbolic link."""
    clean = posixpath.normpath("/" + path).lstrip("/")
    target = root / clean if clean and clean != "." else root
    probe = target
    while not probe.exists() and probe != root:
        probe = probe.parent
    if not probe.resolve().is_relative_to(root.resolve()):
        raise DockerfileError(f"{path} leads out of the image root")
    return target
