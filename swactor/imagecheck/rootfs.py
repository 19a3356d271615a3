"""Root filesystems for the replay: the cached bare Debian root, overlays, mounts.

Theory of operation. `base_root(cache)` returns a bare Debian bookworm root made by
`debootstrap --variant=minbase bookworm` from the Debian mirror this machine's own apt
sources name (`host_debian_mirror`), with the bookworm entries of those sources as its
apt sources. It is built once into a temporary directory, renamed into place, and
reused while its stamp (suite, variant, mirror) matches; a lock file serialises
builders. debootstrap is installed with apt-get when it is missing (root only).

The base is never written after that: a build and every container get an overlay
(`overlay(lower, upper)`), as a Docker engine's layers do. `Mounts` records what it
mounts and unmounts it in reverse order (lazily when busy); `remove_tree` refuses to
delete a directory that still has anything mounted under it and never crosses into
another file system, so a failed run cannot delete the host's /dev or /proc through a
bind mount left behind.

`HostNetwork` is what a `docker build` inherits from the machine it runs on: its DNS
configuration, its CA bundle and its pip configuration (the files and `PIP_*`
variables `pip config list` reports, local paths such as a `find-links` folder or a
`file://` index bind-mounted read-only under `/run/swactor-host`). It is mounted on a
tmpfs at `/run/swactor-host` during each RUN, never into the image itself.
"""

from __future__ import annotations

import configparser
import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

SUITE = "bookworm"
VARIANT = "minbase"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
HOST_DIR = "/run/swactor-host"


class RootfsError(Exception):
    """The root filesystem could not be made or mounted (names the command)."""


def run_host(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise RootfsError(f"{what}: `{' '.join(argv)}` exited {done.returncode}: "
                          + " | ".join(tail))


def default_cache() -> Path:
    return Path(os.environ.get("SWACTOR_IMAGECHECK_CACHE",
                               Path.home() / ".cache" / "swactor" / "imagecheck"))


# -- the host's apt sources ------------------------------------------------------------


@dataclass(frozen=True)
class AptSource:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]
    signed_by: str | None


def host_apt_sources(etc: Path = Path("/etc/apt")) -> list[AptSource]:
    """The `deb` entries of this machine's apt sources (one-line and deb822 forms)."""
    found: list[AptSource] = []
    files = [etc / "sources.list"] if (etc / "sources.list").is_file() else []
    directory = etc / "sources.list.d"
    if directory.is_dir():
        files += sorted(p for p in directory.iterdir() if p.suffix in (".list", ".sources"))
    for path in files:
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":
            found += _deb822(text)
        else:
            found += _one_line(text)
    return found


def _one_line(text: str) -> list[AptSource]:
    found = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        match = re.match(r"^deb\s+(\[[^\]]*\]\s+)?(\S+)\s+(\S+)\s*(.*)$", line)
        if match:
            options = match.group(1) or ""
            signed = re.search(r"signed-by=(\S+?)\]?(\s|$)", options)
            found.append(AptSource(match.group(2), (match.group(3),),
                                   tuple(match.group(4).split()),
                                   signed.group(1) if signed else None))
    return found


def _deb822(text: str) -> list[AptSource]:
    found = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            found.append(AptSource(uri, tuple(fields.get("suites", "").split()),
                                   tuple(fields.get("components", "").split()),
                                   fields.get("signed-by")))
    return found


def host_debian_mirror(sources: list[AptSource]) -> str:
    """The mirror this machine takes Debian bookworm's main archive from."""
    for source in sources:
        if SUITE in source.suites and "main" in source.components:
            return source.uri.rstrip("/")
    return DEFAULT_MIRROR


def chroot_sources(sources: list[AptSource], root: Path) -> str:
    """The host's bookworm entries as a sources.list for the root (keyrings it has)."""
    lines = []
    for source in sources:
        suites = [s for s in source.suites if s == SUITE or s.startswith(SUITE + "-")]
        if not suites or "main" not in source.components:
            continue
        if source.signed_by and not (root / source.signed_by.lstrip("/")).is_file():
            continue
        option = f"[signed-by={source.signed_by}] " if source.signed_by else ""
        for suite in suites:
            lines.append(f"deb {option}{source.uri} {suite} main")
    return "\n".join(lines) + "\n" if lines else f"deb {DEFAULT_MIRROR} {SUITE} main\n"


# -- the bare base root ----------------------------------------------------------------


def ensure_debootstrap(say: Callable[[str], None]) -> str:
    path = shutil.which("debootstrap")
    if path:
        return path
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RootfsError("debootstrap is not installed (as root: apt-get install debootstrap)")
    say("installing debootstrap with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "debootstrap"]):
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise RootfsError(f"`{' '.join(argv)}` exited {done.returncode}: "
                              + done.stderr.strip()[-400:])
    found = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    if not Path(found).exists():
        raise RootfsError("apt-get installed debootstrap but it is not on PATH")
    return found


def base_root(cache: Path, say: Callable[[str], None]) -> Path:
    """The cached bare bookworm root, built first when missing or stale (module doc)."""
    sources = host_apt_sources()
    mirror = host_debian_mirror(sources)
    stamp_text = f"{SUITE} {VARIANT} {mirror}\n"
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / f"base-{SUITE}-{VARIANT}"
    stamp = cache / f"base-{SUITE}-{VARIANT}.stamp"
    with open(cache / "base.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if root.is_dir() and stamp.is_file() and stamp.read_text() == stamp_text:
            return root
        debootstrap = ensure_debootstrap(say)
        if root.exists():
            remove_tree(root)
        building = cache / f"base-{SUITE}-{VARIANT}.building"
        if building.exists():
            remove_tree(building)
        say(f"debootstrap --variant={VARIANT} {SUITE} from {mirror} (once; cached in {root})")
        started = time.monotonic()
        done = subprocess.run([debootstrap, f"--variant={VARIANT}", SUITE, str(building),
                               mirror], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            log = building / "debootstrap" / "debootstrap.log"
            detail = log.read_text(errors="replace")[-1500:] if log.is_file() else ""
            raise RootfsError(f"debootstrap exited {done.returncode}: "
                              f"{done.stderr.strip()[-800:]} {detail}")
        (building / "etc/apt/sources.list").write_text(chroot_sources(sources, building))
        building.rename(root)
        stamp.write_text(stamp_text)
        say(f"base root ready in {time.monotonic() - started:.0f}s")
        return root


# -- mounts ----------------------------------------------------------------------------


def mounted_under(path: Path) -> list[str]:
    """Mount points at or below `path` (from /proc/self/mountinfo)."""
    prefix = str(path.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return points


def remove_tree(path: Path) -> None:
    """Delete `path`, refusing while anything is mounted under it (module doc)."""
    left = mounted_under(path)
    if left:
        raise RootfsError(f"refusing to delete {path}: still mounted there: {left}")
    done = subprocess.run(["rm", "-rf", "--one-file-system", str(path)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RootfsError(f"rm -rf {path}: {done.stderr.strip()}")


def sweep_stale_runs(cache: Path, say: Callable[[str], None]) -> list[Path]:
    """Unmount and delete `cache/run-PID` folders whose process is gone (a check killed
    before its cleanup); the folders removed."""
    removed = []
    for folder in sorted(cache.glob("run-*")):
        pid = folder.name.removeprefix("run-")
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        for point in sorted(mounted_under(folder), key=len, reverse=True):
            subprocess.run(["umount", "-R", "-l", point], capture_output=True, check=False)
        remove_tree(folder)
        say(f"removed the leftovers of an earlier check: {folder}")
        removed.append(folder)
    return removed


@dataclass
class Mounts:
    """Mounts made for one build or container, undone in reverse (module doc)."""

    points: list[Path] = field(default_factory=list)
    created: list[Path] = field(default_factory=list)

    def _make(self, target: Path, directory: bool) -> None:
        """Create a missing mount point, remembering it for removal after unmount."""
        missing = []
        probe = target
        while not probe.exists() and not probe.is_symlink():
            missing.append(probe)
            probe = probe.parent
        for path in reversed(missing):
            if path == target and not directory:
                path.touch()
            else:
                path.mkdir()
            self.created.append(path)

    def mount(self, argv: list[str], target: Path) -> None:
        run_host(["mount", *argv, str(target)], f"mount {target}")
        self.points.append(target)

    def bind(self, source: Path, target: Path, read_only: bool = False,
             recursive: bool = False) -> None:
        self._make(target, source.is_dir())
        self.mount(["--rbind" if recursive else "--bind", str(source)], target)
        if recursive:
            run_host(["mount", "--make-rslave", str(target)], f"make-rslave {target}")
        if read_only:
            run_host(["mount", "-o", "remount,bind,ro", str(target)], f"remount ro {target}")

    def overlay(self, lowers: list[Path], upper: Path, work: Path, target: Path) -> None:
        for path in (upper, work, target):
            path.mkdir(parents=True, exist_ok=True)  # outside any root: kept
        lower = ":".join(str(p) for p in lowers)
        self.mount(["-t", "overlay", "overlay", "-o",
                    f"lowerdir={lower},upperdir={upper},workdir={work}"], target)

    def tmpfs(self, target: Path) -> None:
        self._make(target, True)
        self.mount(["-t", "tmpfs", "-o", "mode=755", "tmpfs"], target)

    def system(self, root: Path) -> None:
        """/proc, /dev and /sys of the host inside `root`, as a container sees them."""
        self.bind(Path("/proc"), root / "proc", recursive=True)
        self.bind(Path("/dev"), root / "dev", recursive=True)
        self.bind(Path("/sys"), root / "sys", recursive=True)

    def unmount_all(self) -> None:
        errors = []
        while self.points:
            target = self.points.pop()
            done = subprocess.run(["umount", "-R", str(target)], capture_output=True,
                                  text=True, check=False)
            if done.returncode != 0:
                lazy = subprocess.run(["umount", "-R", "-l", str(target)],
                                      capture_output=True, text=True, check=False)
                if lazy.returncode != 0:
                    errors.append(f"{target}: {lazy.stderr.strip()}")
        if errors:
            raise RootfsError("could not unmount: " + "; ".join(errors))
        while self.created:
            path = self.created.pop()
            with contextlib.suppress(OSError):
                if path.is_dir() and not path.is_symlink():
                    path.rmdir()
                else:
                    path.unlink()

    def __enter__(self) -> Mounts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmount_all()


# -- what a docker build inherits from its host ----------------------------------------


def _pip_config() -> list[tuple[str, str, str]]:
    """(section, key, value) of the host's effective pip configuration, files then env."""
    done = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                          text=True, check=False, env={**os.environ,
                                                       "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    files: list[tuple[str, str, str]] = []
    env: list[tuple[str, str, str]] = []
    for line in done.stdout.splitlines():
        match = re.match(r"^([^=]+?)\.([A-Za-z0-9_-]+)='(.*)'$", line)
        if not match:
            continue
        section, key, value = match.groups()
        if section == ":env:":
            env.append(("global", key, value))
        else:
            files.append((section, key, value))
    return files + env


@dataclass
class HostNetwork:
    """DNS, CA bundle and pip configuration a docker build inherits (module doc)."""

    staging: Path
    config: Path = field(init=False)
    binds: list[Path] = field(default_factory=list)
    ca_bundle: str | None = None

    def __post_init__(self) -> None:
        self.staging.mkdir(parents=True, exist_ok=True)
        self.config = self.staging / "pip.conf"
        bundle = next((Path(p) for p in (os.environ.get("SSL_CERT_FILE", ""),
                                         "/etc/ssl/certs/ca-certificates.crt",
                                         "/etc/pki/tls/certs/ca-bundle.crt")
                       if p and Path(p).is_file()), None)
        if bundle is not None:
            shutil.copyfile(bundle, self.staging / "ca.crt")
            self.ca_bundle = f"{HOST_DIR}/ca.crt"
        parser = configparser.ConfigParser(interpolation=None)
        for section, key, value in _pip_config():
            if not parser.has_section(section):
                parser.add_section(section)
            parser.set(section, key, self._localise(key, value))
        if self.ca_bundle:
            if not parser.has_section("global"):
                parser.add_section("global")
            parser.set("global", "cert", self.ca_bundle)
        with open(self.config, "w") as out:
            parser.write(out)

    def _localise(self, key: str, value: str) -> str:
        """Note the local paths a pip setting names, to mount them at the same path in
        the root (a `file://` index with its parent folder, where its pages link to
        their files); a constraint or requirement file is copied in instead."""
        out = []
        for word in value.split():
            path = word[len("file://"):] if word.startswith("file://") else word
            if path.startswith("/") and Path(path).exists() and key != "cert":
                if Path(path).is_file() and key in ("constraint", "requirement"):
                    name = f"{len(self.binds)}-{Path(path).name}"
                    shutil.copyfile(path, self.staging / name)
                    word = f"{HOST_DIR}/{name}"
                else:
                    source = Path(path).parent if key.endswith("index-url") else Path(path)
                    if source != Path("/") and source not in self.binds:
                        self.binds.append(source)
            out.append(word)
        return " ".join(out)

    def env(self) -> dict[str, str]:
        """Variables a RUN gets so its pip and OpenSSL see the host's settings."""
        env = {"PIP_CONFIG_FILE": f"{HOST_DIR}/pip.conf"}
        if self.ca_bundle:
            env["PIP_CERT"] = self.ca_bundle
        return env

    @contextlib.contextmanager
    def mounted(self, root: Path, mounts: Mounts) -> Iterator[None]:
        """Mount the staging files, the local pip paths and resolv.conf in `root`."""
        target = root / HOST_DIR.lstrip("/")
        mounts.tmpfs(target)
        for item in self.staging.iterdir():
            shutil.copy(item, target / item.name)
        for source in self.binds:
            mounts.bind(source, root / str(source).lstrip("/"), read_only=True)
        resolv = root / "etc/resolv.conf"
        if Path("/etc/resolv.conf").is_file() and (resolv.is_file() or not resolv.exists()):
            mounts.bind(Path("/etc/resolv.conf").resolve(), resolv, read_only=True)
        yield
