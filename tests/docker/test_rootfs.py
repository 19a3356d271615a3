"""What the replay takes from the host (fast, no root): the Debian mirror and bookworm
entries of its apt sources, its pip configuration (local paths to mount, CA bundle),
and users resolved against the image's own passwd and group files."""

from __future__ import annotations

import configparser
import os
from pathlib import Path

import pytest

from swactor.imagecheck.enter import UserError, resolve_user
from swactor.imagecheck.rootfs import (
    DEFAULT_MIRROR,
    HOST_DIR,
    HostNetwork,
    Mounts,
    RootfsError,
    chroot_sources,
    host_apt_sources,
    host_debian_mirror,
    mounted_under,
    remove_tree,
    sweep_stale_runs,
)

DEB822 = """Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


def test_mirror_and_bookworm_entries_come_from_the_host_sources(tmp_path: Path) -> None:
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list.d" / "debian.sources").write_text(DEB822)
    (etc / "sources.list.d" / "other.list").write_text(
        "deb [signed-by=/usr/share/keyrings/vendor.gpg] https://vendor.example/apt stable main\n")
    (etc / "sources.list.d" / "off.list.disabled").write_text("deb http://x bookworm main\n")
    sources = host_apt_sources(etc)
    assert host_debian_mirror(sources) == "http://mirror.example/debian"
    root = tmp_path / "root"
    (root / "usr/share/keyrings").mkdir(parents=True)
    (root / "usr/share/keyrings/debian-archive-keyring.gpg").write_bytes(b"")
    lines = chroot_sources(sources, root).splitlines()
    assert lines == [
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
        f"http://mirror.example/{path} {suite} main"
        for path, suite in (("debian", "bookworm"), ("debian", "bookworm-updates"),
                            ("debian-security", "bookworm-security"))]
    assert host_debian_mirror([]) == DEFAULT_MIRROR


def test_pip_settings_are_carried_and_local_paths_mounted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheels, index = tmp_path / "wheels", tmp_path / "pypi" / "simple"
    wheels.mkdir()
    index.mkdir(parents=True)
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", f"file://{index}")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "77")
    network = HostNetwork(tmp_path / "staging")
    config = configparser.ConfigParser(interpolation=None)
    config.read(network.config)
    assert config.get("global", "find-links") == str(wheels)
    assert config.get("global", "extra-index-url") == f"file://{index}"
    assert config.get("global", "default-timeout") == "77"
    # an index is mounted with its parent (its pages link to ../../files/)
    assert wheels in network.binds and index.parent in network.binds
    if network.ca_bundle:
        assert config.get("global", "cert") == f"{HOST_DIR}/ca.crt"
        assert (tmp_path / "staging" / "ca.crt").is_file()
    assert network.env()["PIP_CONFIG_FILE"] == f"{HOST_DIR}/pip.conf"


def test_users_come_from_the_image_s_own_files(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\nswactor:x:999:998::/var/lib/swactor:/bin/sh\n")
    (tmp_path / "etc/group").write_text("root:x:0:\nswactor:x:998:\nkvm:x:993:swactor\n")
    root = resolve_user(tmp_path, "root")
    assert (root.uid, root.gid, root.home) == (0, 0, "/root")
    user = resolve_user(tmp_path, "swactor")
    assert (user.uid, user.gid, user.groups, user.home) == (
        999, 998, (993, 998), "/var/lib/swactor")
    assert resolve_user(tmp_path, "999:0").gid == 0
    assert resolve_user(tmp_path, "1234").uid == 1234
    with pytest.raises(UserError, match="nobody"):
        resolve_user(tmp_path, "nobody")
    with pytest.raises(UserError, match="wheel"):
        resolve_user(tmp_path, "swactor:wheel")


@pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")
def test_leftovers_of_a_killed_check_are_unmounted_and_removed(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "keep").write_text("host data")
    dead = tmp_path / "cache" / "run-999999999"
    (dead / "image" / "root" / "proc").mkdir(parents=True)
    live = tmp_path / "cache" / f"run-{os.getpid()}"
    live.mkdir()
    mounts = Mounts()
    mounts.bind(source, dead / "image" / "root" / "proc")
    try:
        with pytest.raises(RootfsError, match="still mounted"):
            remove_tree(dead)
        assert sweep_stale_runs(tmp_path / "cache", lambda _: None) == [dead]
    finally:
        mounts.points.clear()  # the sweep unmounted it
    assert not dead.exists() and live.is_dir()
    assert (source / "keep").read_text() == "host data"  # never deleted through the mount
    assert mounted_under(tmp_path) == []
