"""Smaller resource bounds on what outsiders send: the artifact server (connection cap,
socket timeouts, bounded Range headers and request records), the chat template (output
and time), and the control channel's rejection records. Each attack ends in a typed
refusal and a victim that keeps serving.
"""

from __future__ import annotations

import http.client
import socket
import sys
import time
from pathlib import Path

import pytest

from swactor.model import chat
from swactor.model.artifact_server import MAX_RANGE_HEADER, REQUESTS_KEPT, ArtifactServer
from swactor.model.chat import render_chat
from swactor.model.tokenizer_errors import TokenizerError, TokenizerFault
from swactor.transport.control import REJECTED_KEPT, decode_frame, encode_frame
from tests.transport.test_control import _pair

pytestmark = pytest.mark.timeout(60)
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(bytes(range(256)) * 64)
    return path


def _get(server: ArtifactServer, headers: dict[str, str]) -> tuple[int, bytes]:
    host, port = server._httpd.server_address[:2]
    conn = http.client.HTTPConnection(str(host), port, timeout=5)
    try:
        conn.request("GET", f"/{server.path.name}", headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_artifact_server_caps_its_connections(artifact: Path) -> None:
    with ArtifactServer(artifact, max_connections=2, timeout_s=5.0) as server:
        host, port = server._httpd.server_address[:2]
        held = [socket.create_connection((str(host), port)) for _ in range(2)]
        try:
            time.sleep(0.2)  # both are being served (waiting for a request line)
            extra = socket.create_connection((str(host), port))
            extra.settimeout(5)
            assert extra.recv(1) == b""  # closed unanswered
            extra.close()
            assert server.refused_connections == 1
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.2)
        assert _get(server, {"Range": "bytes=0-9"}) == (206, bytes(range(10)))


def test_artifact_server_drops_an_idle_connection(artifact: Path) -> None:
    with ArtifactServer(artifact, max_connections=1, timeout_s=0.5) as server:
        host, port = server._httpd.server_address[:2]
        idle = socket.create_connection((str(host), port))
        idle.sendall(b"GET /")  # half a request line, then nothing
        idle.settimeout(5)
        started = time.monotonic()
        while idle.recv(1024):  # the server gives up on it and closes
            pass
        assert time.monotonic() - started < 4
        idle.close()
        time.sleep(0.1)
        assert _get(server, {"Range": "bytes=5-6"}) == (206, bytes([5, 6]))  # slot is free


def test_artifact_server_bounds_range_headers(artifact: Path) -> None:
    with ArtifactServer(artifact) as server:
        huge = "bytes=" + "9" * 5000 + "-"
        assert _get(server, {"Range": huge})[0] == 416
        assert _get(server, {"Range": "bytes=0-1,4-5"})[0] == 416
        for _ in range(REQUESTS_KEPT + 10):
            server._count("GET", "bytes=" + "1" * 1000 + "-", 0)
        assert len(server.requests) == REQUESTS_KEPT
        assert all(len(r or "") <= MAX_RANGE_HEADER for _, r in server.requests)
        assert _get(server, {"Range": "bytes=-3"}) == (206, bytes([253, 254, 255]))


def test_chat_template_output_is_bounded() -> None:
    template = "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}"
    with pytest.raises(TokenizerError) as raised:
        render_chat(template, MESSAGES)
    assert raised.value.reason is TokenizerFault.ChatTemplateInvalid
    assert f"exceeds {chat.MAX_OUTPUT_CHARS} characters" in str(raised.value)


def test_chat_template_time_is_bounded_even_without_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(chat, "MAX_RENDER_S", 0.3)
    tracer = sys.gettrace()
    template = (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    )
    started = time.monotonic()
    with pytest.raises(TokenizerError) as raised:
        render_chat(template, MESSAGES)
    assert "ran longer than 0.3 s" in str(raised.value)
    assert time.monotonic() - started < 5
    # an ordinary template still renders, and the trace function is gone afterwards
    assert render_chat("{{ messages[0]['content'] }}!", MESSAGES) == "hi!"
    assert sys.gettrace() is tracer


async def test_control_rejections_are_kept_bounded() -> None:
    pair = await _pair()
    try:
        frame = encode_frame({"kind": "request", "type": "Nope", "body": {}})
        for _ in range(REJECTED_KEPT + 20):
            raw = await pair.orch_ctl.request_raw(pair.node.node_id, frame, timeout=5)
            assert decode_frame(raw)["code"] == "BadMessage"
        assert len(pair.node_ctl.rejected) == REJECTED_KEPT
        assert pair.node_ctl.rejected_count == REJECTED_KEPT + 20
    finally:
        await pair.close()
