"""Inbound TLS and mTLS on a real `memwarden serve` (README 'TLS and identity', sidecar/tls.py), with certificates
made for the test (tests/tlsutil.py): HTTPS serves, cleartext HTTP to the TLS port gets no answer, a changed
certificate is served to new connections without a restart (file watcher and SIGHUP), a client without a
certificate (or with one from another CA) fails the handshake under mTLS, and a mapped client certificate is a
credential (a second credential with it is refused)."""

from __future__ import annotations

import signal
import socket
import time
import uuid
from pathlib import Path
from typing import Iterator

import chromadb
import httpx
import pytest

from memwarden_eval.harness import Server, free_port, start_sidecar
from sidecar.ledger import SQLiteLedger
from tests.integration.conftest import POLICIES
from tests.tlsutil import CA, Issued, client_context

pytestmark = pytest.mark.integration


def presented(port: int, ca: CA) -> bytes:
    """The DER certificate the listener presents to a new connection."""
    ctx = client_context(ca)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def wait_for_certificate(port: int, ca: CA, want: bytes, timeout_s: float = 30.0) -> bytes:
    deadline = time.monotonic() + timeout_s
    seen = presented(port, ca)
    while seen != want and time.monotonic() < deadline:
        time.sleep(0.1)
        seen = presented(port, ca)
    return seen


def replace_pair(src: Issued, dst: Issued) -> None:
    """Overwrite `dst`'s files with `src`'s, as a certificate renewal does (key first, then certificate)."""
    dst.key.write_bytes(src.key.read_bytes())
    dst.cert.write_bytes(src.cert.read_bytes())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    d = tmp_path_factory.mktemp("pki")
    ca, other = CA.make(d / "ca"), CA.make(d / "other", "another CA")
    return {
        "dir": d, "ca": ca, "other": other,
        "server": ca.issue(d / "live", "server", "memwarden", server=True),
        "renewed": ca.issue(d / "next", "server", "memwarden renewed", server=True),
        "agent": ca.issue(d / "clients", "a1", "agent-a1", uris=("spiffe://example.org/ns/prod/sa/agent-a1",)),
        "cn_client": ca.issue(d / "clients", "indexer", "batch-indexer"),
        "unmapped": ca.issue(d / "clients", "stranger", "stranger", uris=("spiffe://example.org/ns/prod/sa/nobody",)),
        "foreign": other.issue(d / "clients", "foreign", "agent-a1", uris=("spiffe://example.org/ns/prod/sa/agent-a1",)),
    }


@pytest.fixture(scope="module")
def tls_sidecar(tmp_path_factory: pytest.TempPathFactory, chroma_server: Server, pki: dict[str, object]) -> Iterator[Server]:
    """HTTPS without client certificates; the certificate files are watched every 0.2 s."""
    tmp = tmp_path_factory.mktemp("tls")
    server = pki["server"]
    assert isinstance(server, Issued)
    env = {"MEMWARDEN_TLS_CERT": str(server.cert), "MEMWARDEN_TLS_KEY": str(server.key),
           "MEMWARDEN_TLS_RELOAD_INTERVAL_S": "0.2"}
    side = start_sidecar(chroma_server.url, tmp / "ledger.db", POLICIES, extra_env=env,
                         tls_client=client_context(pki["ca"]))  # type: ignore[arg-type]
    yield side
    side.stop()


@pytest.fixture(scope="module")
def mtls_sidecar(tmp_path_factory: pytest.TempPathFactory, chroma_server: Server, pki: dict[str, object]) -> Iterator[Server]:
    """mTLS required; two client identities mapped (a SPIFFE ID and a CN); no file watcher (SIGHUP reloads)."""
    tmp = tmp_path_factory.mktemp("mtls")
    ca = pki["ca"]
    assert isinstance(ca, CA)
    # its own copy of the server pair: the SIGHUP test rewrites it
    live = ca.issue(tmp / "pair", "server", "memwarden mtls", server=True)
    principals = tmp / "principals.toml"
    principals.write_text('["spiffe://example.org/ns/prod/sa/agent-a1"]\ntenant = "t1"\nfleet = "red"\nagent = "a1"\n'
                          'trust = 1\nroles = ["triage"]\n\n["CN=batch-indexer"]\ntenant = "t1"\nfleet = "ops"\n'
                          'agent = "indexer"\n')
    env = {"MEMWARDEN_TLS_CERT": str(live.cert), "MEMWARDEN_TLS_KEY": str(live.key),
           "MEMWARDEN_TLS_RELOAD_INTERVAL_S": "0", "MEMWARDEN_TLS_CLIENT_CA": str(ca.path),
           "MEMWARDEN_TLS_CLIENT_PRINCIPALS": str(principals)}
    side = start_sidecar(chroma_server.url, tmp / "ledger.db", POLICIES, extra_env=env,
                         tls_client=client_context(ca, pki["cn_client"]))  # type: ignore[arg-type]
    side.data_dir = tmp  # where its pair lives (`live`), for the SIGHUP test
    yield side
    side.stop()


def test_https_serves_and_the_banner_says_so(tls_sidecar: Server, pki: dict[str, object]) -> None:
    ledger = SQLiteLedger(tls_sidecar.log.parent / "ledger.db")
    try:
        _, key = ledger.create_key("agent", "t1", "red", "a1", 1)
    finally:
        ledger.close()
    with httpx.Client(base_url=tls_sidecar.url, verify=client_context(pki["ca"]), trust_env=False) as c:  # type: ignore[arg-type]
        r = c.get("/api/v2/auth/identity", headers={"X-API-Key": key})
        assert r.status_code == 200 and r.json()["user_id"] == "t1/red/a1"
        assert c.get("/api/v2/auth/identity").status_code == 401
    text = tls_sidecar.log.read_text()
    assert f"listening on https://127.0.0.1:{tls_sidecar.port}" in text and "TLS >= 1.2" in text


# chromadb hands its ssl_verify path to httpx as a string, which httpx 0.28+ deprecates (chromadb's own call)
@pytest.mark.filterwarnings("ignore:`verify=<str>` is deprecated:DeprecationWarning")
def test_the_official_chroma_client_over_https(tls_sidecar: Server, pki: dict[str, object]) -> None:
    tenant = f"tls{uuid.uuid4().hex[:8]}"
    ledger = SQLiteLedger(tls_sidecar.log.parent / "ledger.db")
    try:
        _, admin = ledger.create_key("admin", tenant, None, None, 0)
        _, key = ledger.create_key("agent", tenant, "red", "a1", 1)
    finally:
        ledger.close()
    ca = pki["ca"]
    assert isinstance(ca, CA)
    settings = dict(anonymized_telemetry=False, chroma_server_ssl_verify=str(ca.path))
    adm = chromadb.AdminClient(chromadb.config.Settings(
        chroma_api_impl="chromadb.api.fastapi.FastAPI", chroma_server_host="127.0.0.1", chroma_server_http_port=tls_sidecar.port,
        chroma_server_ssl_enabled=True, chroma_server_headers={"X-API-Key": admin}, **settings))
    adm.create_tenant(tenant)
    adm.create_database("default_database", tenant=tenant)

    def client(key: str) -> chromadb.api.ClientAPI:
        return chromadb.HttpClient(host="127.0.0.1", port=tls_sidecar.port, ssl=True, headers={"X-API-Key": key},
                                   tenant=tenant, settings=chromadb.config.Settings(**settings))

    client(admin).create_collection("mem")
    agent = client(key)
    assert agent.get_user_identity().user_id == f"{tenant}/red/a1"
    coll = agent.get_collection("mem")
    coll.add(ids=["r1"], documents=["over TLS"], embeddings=[[0.1, 0.2, 0.3]])
    assert coll.get(ids=["r1"])["documents"] == ["over TLS"]


def test_cleartext_http_to_the_tls_port_gets_no_answer(tls_sidecar: Server) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{tls_sidecar.port}/_memwarden/healthz", timeout=10, trust_env=False)
    # and the raw bytes of an HTTP request are never answered with HTTP
    with socket.create_connection(("127.0.0.1", tls_sidecar.port), timeout=10) as s:
        s.sendall(b"GET /_memwarden/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            data = s.recv(1024)
        except ConnectionResetError:
            data = b""
        assert not data.startswith(b"HTTP/")


def test_a_renewed_certificate_is_served_without_a_restart(tls_sidecar: Server, pki: dict[str, object]) -> None:
    ca, live, renewed = pki["ca"], pki["server"], pki["renewed"]
    assert isinstance(ca, CA) and isinstance(live, Issued) and isinstance(renewed, Issued)
    before = presented(tls_sidecar.port, ca)
    assert before == live.der()
    # a connection opened before the renewal keeps working after it
    with httpx.Client(base_url=tls_sidecar.url, verify=client_context(ca), trust_env=False) as old:
        assert old.get("/_memwarden/healthz").status_code == 200
        want = renewed.der()
        replace_pair(renewed, live)
        assert wait_for_certificate(tls_sidecar.port, ca, want) == want
        assert old.get("/_memwarden/healthz").status_code == 200
    assert tls_sidecar.proc.poll() is None  # the same process
    # a broken pair (a key that is not the certificate's) is refused; the renewed certificate stays in use
    other = ca.issue(Path(str(live.cert.parent)) / "bad", "x", "bad", server=True)
    live.key.write_bytes(other.key.read_bytes())
    deadline = time.monotonic() + 10
    while "tls_reload_failed" not in tls_sidecar.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "tls_reload_failed" in tls_sidecar.log.read_text()
    assert presented(tls_sidecar.port, ca) == want
    with httpx.Client(base_url=tls_sidecar.url, verify=client_context(ca), trust_env=False) as c:
        assert c.get("/_memwarden/healthz").status_code == 200


def test_mtls_refuses_a_client_without_a_certificate(mtls_sidecar: Server, pki: dict[str, object]) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(mtls_sidecar.url + "/_memwarden/healthz", verify=client_context(pki["ca"]), timeout=10,  # type: ignore[arg-type]
                  trust_env=False)


def test_mtls_refuses_a_certificate_from_another_ca(mtls_sidecar: Server, pki: dict[str, object]) -> None:
    # the same SPIFFE ID as a mapped agent, signed by a CA the listener does not trust
    ctx = client_context(pki["ca"], pki["foreign"])  # type: ignore[arg-type]
    with pytest.raises(httpx.HTTPError):
        httpx.get(mtls_sidecar.url + "/api/v2/auth/identity", verify=ctx, timeout=10, trust_env=False)


def test_a_mapped_client_certificate_is_a_credential(mtls_sidecar: Server, pki: dict[str, object]) -> None:
    ca = pki["ca"]
    with httpx.Client(base_url=mtls_sidecar.url, verify=client_context(ca, pki["agent"]), trust_env=False) as c:  # type: ignore[arg-type]
        r = c.get("/api/v2/auth/identity")
        assert r.status_code == 200 and r.json()["user_id"] == "t1/red/a1"  # its SPIFFE ID
        # a certificate that is a credential and a header credential: refused, not one of them chosen
        ledger = SQLiteLedger(mtls_sidecar.log.parent / "ledger.db")
        try:
            _, key = ledger.create_key("agent", "t1", "blue", "b1", 0)
        finally:
            ledger.close()
        r = c.get("/api/v2/auth/identity", headers={"X-API-Key": key})
        assert r.status_code == 401 and "more than one credential" in r.json()["message"]
    with httpx.Client(base_url=mtls_sidecar.url, verify=client_context(ca, pki["cn_client"]), trust_env=False) as c:  # type: ignore[arg-type]
        assert c.get("/api/v2/auth/identity").json()["user_id"] == "t1/ops/indexer"  # its CN
    with httpx.Client(base_url=mtls_sidecar.url, verify=client_context(ca, pki["unmapped"]), trust_env=False) as c:  # type: ignore[arg-type]
        # verified but not mapped: the connection is authenticated, the request is not
        assert c.get("/api/v2/auth/identity").status_code == 401
        assert c.get("/api/v2/auth/identity", headers={"X-API-Key": key}).json()["user_id"] == "t1/blue/b1"
    events = [line for line in mtls_sidecar.log.read_text().splitlines() if '"not_authenticated"' in line]
    assert events


def test_sighup_reloads_the_certificate(mtls_sidecar: Server, pki: dict[str, object]) -> None:
    ca = pki["ca"]
    assert isinstance(ca, CA) and mtls_sidecar.data_dir is not None
    pair = Issued(mtls_sidecar.data_dir / "pair" / "server.pem", mtls_sidecar.data_dir / "pair" / "server.key", 0)
    ctx = client_context(ca, pki["cn_client"])  # type: ignore[arg-type]

    def served() -> bytes:
        with socket.create_connection(("127.0.0.1", mtls_sidecar.port), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der

    before = served()
    renewed = ca.issue(mtls_sidecar.data_dir / "renewal", "server", "memwarden mtls renewed", server=True)
    replace_pair(renewed, pair)
    time.sleep(0.5)
    assert served() == before  # no watcher (TLS_RELOAD_INTERVAL_S=0): nothing changes by itself
    mtls_sidecar.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while served() != renewed.der() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert served() == renewed.der() and mtls_sidecar.proc.poll() is None


def test_serve_refuses_a_key_that_is_not_the_certificates(tmp_path: Path, chroma_server: Server,
                                                          pki: dict[str, object]) -> None:
    server, renewed = pki["server"], pki["renewed"]
    assert isinstance(server, Issued) and isinstance(renewed, Issued)
    ca = pki["ca"]
    assert isinstance(ca, CA)
    pair = ca.issue(tmp_path, "s", "s", server=True)
    other = ca.issue(tmp_path, "o", "o", server=True)
    with pytest.raises(RuntimeError, match="TLS refused"):
        start_sidecar(chroma_server.url, tmp_path / "ledger.db", POLICIES, port=free_port(), timeout_s=60,
                      extra_env={"MEMWARDEN_TLS_CERT": str(pair.cert), "MEMWARDEN_TLS_KEY": str(other.key)},
                      tls_client=client_context(ca))
