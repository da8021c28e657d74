"""Proxy-bypass families (issue: canonicalisation and identity hardening), table-driven, through the
real sidecar process in front of a real HTTP backend that records what it receives. Every rejected
request is answered before any policy decision and the backend receives nothing."""

from __future__ import annotations

import json
import socket
from typing import Iterator

import pytest

from memwarden_eval.harness import Server, start_sidecar
from sidecar.ledger import CollectionRecord, SQLiteLedger
from tests.integration.conftest import POLICIES
from tests.integration.recorder import RecordingServer

pytestmark = pytest.mark.integration

CID = "22222222-2222-2222-2222-222222222222"
DATA = f"/api/v2/tenants/acme/databases/main/collections/{CID}"


class Env:
    def __init__(self, recorder: RecordingServer, sidecar: Server, key: str, other_key: str) -> None:
        self.recorder, self.sidecar, self.key, self.other_key = recorder, sidecar, key, other_key

    def raw(self, request: bytes) -> tuple[int, bytes]:
        """Send raw bytes (no client-side normalisation); return (status, body)."""
        with socket.create_connection(("127.0.0.1", self.sidecar.port), timeout=30) as s:
            s.sendall(request)
            data = b""
            while True:
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    break
                if not chunk:
                    break
                data += chunk
                if b"\r\n\r\n" in data:
                    head, _, rest = data.partition(b"\r\n\r\n")
                    length = [int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
                    if length and len(rest) >= length[0]:
                        break
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
        return status, data.partition(b"\r\n\r\n")[2]

    def request(self, method: str, target: str, headers: list[tuple[str, str]] | None = None, body: bytes = b"",
                auth: bool = True) -> tuple[int, bytes]:
        lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1"]
        if auth:
            lines.append(f"X-API-Key: {self.key}")
        for k, v in headers or []:
            lines.append(f"{k}: {v}")
        if body and not any(k.lower() in ("content-length", "transfer-encoding") for k, _ in headers or []):
            lines.append(f"Content-Length: {len(body)}")
        lines.append("Connection: close")
        return self.raw(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("bypass")
    recorder = RecordingServer().start()
    ledger = SQLiteLedger(tmp / "ledger.db")
    ledger.register_collection(CollectionRecord("chroma", CID, "acme", "main", "mem", "x", 1))
    key = ledger.create_key("agent", "acme", "red", "a1", 1)[1]
    other = ledger.create_key("agent", "acme", "red", "a2", 1)[1]
    ledger.close()
    sidecar = start_sidecar(recorder.url, tmp / "ledger.db", POLICIES, extra_env={"MEMWARDEN_MAX_BODY_BYTES": "4096"})
    yield Env(recorder, sidecar, key, other)
    sidecar.stop()
    recorder.stop()


def rejected(env: Env, status: int, expected: tuple[int, ...], send: tuple) -> None:
    before = len(env.recorder.app.received)
    got, body = env.request(*send[0], **send[1]) if isinstance(send[0], tuple) else env.request(*send)
    assert got in expected, (send, got, body[:200])
    assert len(env.recorder.app.received) == before, f"backend received {env.recorder.app.received[before:]}"


def test_control_request_is_forwarded(env: Env) -> None:
    """Degeneracy guard: a clean request does reach the backend, in canonical form."""
    before = len(env.recorder.app.received)
    # A filtered get (named ids the ledger does not know are answered without asking the backend).
    status, body = env.request("POST", f"{DATA}/get", [("Content-Type", "application/json")],
                               b'{"where": {"topic": "x"}}')
    assert status == 200, body
    got = env.recorder.app.received[before:]
    assert len(got) >= 1 and all(g.raw_path == f"{DATA}/get".encode() for g in got)
    assert '"topic"' in got[0].body.decode() and json.loads(got[0].body)["where"]


FAMILY_PATHS = {
    "1-dot-and-empty-segments": ["//api/v2/heartbeat", "/api//v2/heartbeat", "/api/v2/./heartbeat", "/api/v2/x/../heartbeat",
                                 f"/api/v2/tenants/other/../acme/databases/main/collections/{CID}/get", "/api/v2/heartbeat/."],
    "2-encoded-separators": ["/api/v2%2Fheartbeat", "/api/v2%2fheartbeat", "/api%5Cv2/heartbeat", "/api/v2/%2E%2E/heartbeat",
                             "/api/v2/%252F/heartbeat", f"{DATA}%2Fget", "/api/v2/%2e/heartbeat"],
    "3-path-parameters": ["/api/v2/heartbeat;x=1", "/api/v2/..;/heartbeat", "/api;/v2/heartbeat", f"{DATA};/get"],
    "4-hash-or-question-after-decoding": ["/api/v2/heart%23beat", "/api/v2/heart%3Fbeat", f"{DATA}%3F/get"],
    "5-control-and-invalid-utf8": ["/api/v2/heart%00beat", "/api/v2/heart%0Abeat", "/api/v2/heart%ffbeat", "/api/v2/%C0%AF"],
}


@pytest.mark.parametrize("family,path", [(f, p) for f, ps in FAMILY_PATHS.items() for p in ps])
def test_ambiguous_paths_rejected_before_decision(env: Env, family: str, path: str) -> None:
    rejected(env, 400, (400,), ("GET", path))


@pytest.mark.parametrize("headers", [
    [("X-HTTP-Method-Override", "DELETE")], [("X-HTTP-Method", "DELETE")], [("X-Method-Override", "PUT")],
])
def test_method_override_headers(env: Env, headers: list[tuple[str, str]]) -> None:
    rejected(env, 400, (400,), ("POST", f"{DATA}/get", headers + [("Content-Type", "application/json")], b"{}"))


def test_method_override_parameter_and_repeated_query(env: Env) -> None:
    rejected(env, 400, (400,), ("GET", "/api/v2/tenants/acme/databases?_method=DELETE"))
    rejected(env, 400, (400,), ("GET", "/api/v2/tenants/acme/databases?limit=1&limit=2"))
    rejected(env, 400, (400,), ("GET", "/api/v2/tenants/acme/databases?user_id=a&user_id=b"))


def test_control_characters_in_headers(env: Env) -> None:
    # The HTTP parser or the canonicaliser rejects these; either way with 400 and nothing forwarded.
    rejected(env, 400, (400,), ("GET", "/api/v2/heartbeat", [("X-Note", "a\x01b")]))
    rejected(env, 400, (400,), ("GET", "/api/v2/heartbeat", [("X-No\x01te", "a")]))


def test_identity_headers_stripped_and_not_used(env: Env) -> None:
    before = len(env.recorder.app.received)
    spoof = [("X-Agent-ID", "acme/red/a2"), ("X-Tenant-ID", "globex"), ("X-User-Id", "u"), ("X-Forwarded-For", "10.0.0.1"),
             ("X-Forwarded-Host", "evil"), ("X-Forwarded-Proto", "https"), ("X-Envoy-Original-Path", "/api/v2/reset"),
             ("X-Original-URL", "/api/v2/reset"), ("X-Rewrite-URL", "/api/v2/reset"), ("Forwarded", "for=1.2.3.4"),
             ("Content-Type", "application/json")]
    status, _ = env.request("POST", f"{DATA}/get", spoof, b"{}")
    assert status == 200
    got = env.recorder.app.received[before:]
    assert len(got) == 1 and got[0].raw_path == f"{DATA}/get".encode()
    names = {k.lower() for k, _ in got[0].headers}
    assert not names & {b"x-agent-id", b"x-tenant-id", b"x-user-id", b"x-forwarded-for", b"x-forwarded-host", b"forwarded",
                        b"x-envoy-original-path", b"x-original-url", b"x-rewrite-url", b"x-api-key"}


@pytest.mark.parametrize("body", [b'{"ids": ["a"], "ids": ["b"]}', b'{"where": {"k": 1, "k": 2}}',
                                  b'{"where": {"$and": [{"a": {"$eq": 1, "$eq": 2}}, {"b": 1}]}}'])
def test_duplicate_json_keys(env: Env, body: bytes) -> None:
    rejected(env, 400, (400,), ("POST", f"{DATA}/get", [("Content-Type", "application/json")], body))


def test_framing_conflicts(env: Env) -> None:
    body = b"{}"
    rejected(env, 400, (400,), ("POST", f"{DATA}/get", [("Content-Type", "application/json"), ("Content-Length", "2"),
                                                         ("Transfer-Encoding", "chunked")], b"0\r\n\r\n"))
    rejected(env, 400, (400,), ("POST", f"{DATA}/get", [("Content-Type", "application/json"), ("Content-Length", "2"),
                                                         ("Content-Length", "3")], body))


def test_body_over_limit_is_413_never_a_prefix(env: Env) -> None:
    big = json.dumps({"ids": ["x" * 5000]}).encode()
    rejected(env, 413, (413,), ("POST", f"{DATA}/get", [("Content-Type", "application/json")], big))
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(big[i:i + 1000]), big[i:i + 1000]) for i in range(0, len(big), 1000)) + b"0\r\n\r\n"
    rejected(env, 413, (413,), ("POST", f"{DATA}/get", [("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")], chunked))


def test_more_than_one_credential_is_401(env: Env) -> None:
    rejected(env, 401, (401,), ("GET", "/api/v2/heartbeat", [("Authorization", f"Bearer {env.key}"), ("Authorization", f"Bearer {env.other_key}")]))
    rejected(env, 401, (401,), ("GET", "/api/v2/heartbeat", [("X-API-Key", env.other_key)]))  # differs from the X-API-Key sent by request()


@pytest.mark.parametrize("path", ["/API/v2/heartbeat", "/api/V2/heartbeat", "/api/v2/Heartbeat", "/api/v2/heartbeat/",
                                  f"{DATA}/GET", f"{DATA}/get/", "/api/v2/tenants/acme/databases/"])
def test_case_variants_and_trailing_slashes_are_404(env: Env, path: str) -> None:
    rejected(env, 404, (404,), ("GET", path))
