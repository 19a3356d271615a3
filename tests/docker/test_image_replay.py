"""The image build, replayed for real (root): docker/Dockerfile on a bare Debian bookworm
root (debootstrap, cached under ~/.cache/swactor/imagecheck), every RUN and COPY run,
so the image cannot silently stop building. And a planted break — the Dockerfile with
the OpenSSL headers removed from its apt-get line — must fail at the step that needs
them, named with its line (a second whole replay, minutes: marked `soak`, run by `just
soak-tests`; `just test` keeps the replay of the real Dockerfile). The compose topology
run is `just docker-check`.

Not root is a failure here, not a skip: CI runs as root, and a green run that never
built the image would prove nothing (`--skip-slow` skips these, as every slow test).
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from swactor.imagecheck.dockerfile import parse
from swactor.imagecheck.replay import Replayer, StepFailed, launcher
from swactor.imagecheck.rootfs import Mounts, default_cache, mounted_under, remove_tree

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("the image replay needs root (chroot, mounts); run the suite as root, "
                    "as CI does, or pass --skip-slow")


def replayer(dockerfile: Path, work: Path, log: io.StringIO) -> Replayer:
    return Replayer(dockerfile, ROOT, work, default_cache(), log=log,
                    say=lambda text: log.write(f"[docker-check] {text}\n"))


def test_the_dockerfile_builds_on_bare_bookworm(tmp_path: Path) -> None:
    need_root()
    log = io.StringIO()
    try:
        image = replayer(DOCKERFILE, tmp_path, log).replay()
    except StepFailed as error:
        pytest.fail(f"{error}\n{log.getvalue()[-4000:]}")
    try:
        upper = image.layers[0]
        models = list((upper / "models").glob("*.gguf"))
        assert [m.name for m in models] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
        assert models[0].stat().st_size > 50_000_000
        assert (upper / "opt/swactor/bin/swactor").is_file()
        native = list((upper / "opt/swactor/lib").glob("python3*/site-packages/swactor/**/*.so"))
        assert native, "no compiled native module in the image"
        assert image.entrypoint == ("swactor",)
        assert not (upper / "run/swactor-host").exists()  # the host's pip setup stays out
        print(f"replayed in {image.seconds:.0f}s")
        # A node runs as the image's USER and keeps the ranges it fetches in its model
        # cache: that user must be able to create folders there.
        probe = tmp_path / "probe"
        with Mounts() as mounts:
            mounts.overlay(image.layers, probe / "upper", probe / "work", probe / "root")
            done = subprocess.run(launcher({
                "root": str(probe / "root"), "workdir": image.workdir, "user": image.user,
                "env": image.env, "argv": ["sh", "-c", 'test "$(id -u)" != 0 && '
                                           'mkdir "$SWACTOR_MODEL_CACHE/fetched-by-a-node"']}),
                capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert (probe / "upper/models/fetched-by-a-node").is_dir()
        remove_tree(probe)
    finally:
        assert mounted_under(tmp_path) == []
        image.remove()


@pytest.mark.soak
def test_a_removed_package_fails_at_the_step_that_needs_it(tmp_path: Path) -> None:
    need_root()
    text = DOCKERFILE.read_text()
    plant = re.compile(r"(apt-get install [^\n]*?) libssl-dev\b")
    assert plant.search(text), "no apt-get install line installs libssl-dev: update the plant"
    planted = tmp_path / "Dockerfile"
    planted.write_text(plant.sub(r"\1", text, count=1))
    installs = [i.source for i in parse(planted.read_text()) if "apt-get install" in i.source]
    assert installs and not any("libssl-dev" in run.split() for run in installs), installs
    shutil.copy(DOCKERFILE.with_name("Dockerfile.dockerignore"),
                planted.with_name("Dockerfile.dockerignore"))
    line = next(n for n, row in enumerate(text.splitlines(), 1)
                if row.startswith("RUN pip install ."))
    log = io.StringIO()
    with pytest.raises(StepFailed) as failed:
        replayer(planted, tmp_path / "work", log).replay()
    message = str(failed.value)
    assert f"Dockerfile line {line}: RUN pip install ." in failed.value.step, message
    assert "openssl" in message.lower(), message
    assert mounted_under(tmp_path) == []
