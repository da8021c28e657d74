"""The decision log shipped to a real HTTP collector (a `http.server` on 127.0.0.1, written here) by a real
`memwarden serve`: every request's event arrives gzip-compressed as NDJSON with the instance and the bearer token, the
same event the file sink wrote; the collector down for a while: requests keep answering and the events arrive once it
is back; down past the buffer bound: the oldest are dropped, counted (readiness and Prometheus) and logged, the newest
arrive; and SIGTERM flushes what is buffered."""

from __future__ import annotations

import gzip
import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.config import Settings
from memwarden_eval.harness import Server, free_port, start_sidecar
from sidecar.logship import from_settings
from tests.integration.conftest import POLICIES, Stack
from tests.integration.logutil import FIELDS, decisions, file_sink
from tests.tls_certs import make_certs

pytestmark = pytest.mark.integration

BUFFER_MAX, BATCH_MAX = 20, 5


class Collector:
    """An HTTP/1.0 decision-log collector on 127.0.0.1:`port` (each connection closed after its answer, so `down`
    really refuses connections): records every POST's headers and its NDJSON events; `up`/`down` start and stop it
    on the same port."""

    def __init__(self, port: int, tls: ssl.SSLContext | None = None) -> None:
        self.port = port
        self.tls = tls
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/ingest"
        self.events: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    def up(self) -> None:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                assert self.path == "/ingest" and self.headers["Content-Encoding"] == "gzip"
                assert self.headers["Content-Type"] == "application/x-ndjson"
                events = [json.loads(line) for line in gzip.decompress(body).decode().splitlines()]
                with collector.lock:
                    collector.headers.append({k.lower(): v for k, v in self.headers.items()})
                    collector.events.extend(events)
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        if self.tls is not None:
            self.server.socket = self.tls.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def by_id(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            return {e["request_id"]: e for e in self.events}


def wait_until(cond: Callable[[], bool], what: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def shipping(side: Server) -> dict[str, Any]:
    """The shipper's counts, from the operator readiness details."""
    return side.readiness().json()["decision_log_shipping"]


def settled(side: Server) -> bool:
    s = shipping(side)
    return s["buffered"] == 0 and s["shipped"] + sum(s["dropped"].values()) == s["accepted"]


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector(free_port())
    c.up()
    yield c
    c.down()


def start(tmp: Path, chroma: Server, collector: Collector, **env: str) -> tuple[Stack, Path]:
    token = tmp / "collector-token"
    token.write_text("s3cret-collector-token\n")
    log = tmp / "decisions.jsonl"
    side = start_sidecar(chroma.url, tmp / "ledger.db", POLICIES, extra_env=file_sink(
        log, MEMWARDEN_DECISION_LOG_URL=collector.url, MEMWARDEN_DECISION_LOG_INSTANCE="sidecar-it-1",
        MEMWARDEN_DECISION_LOG_TOKEN_FILE=str(token), MEMWARDEN_DECISION_LOG_HEADERS='{"X-Scope-OrgID": "acme"}',
        MEMWARDEN_DECISION_LOG_RETRY_BASE_S="0.05", MEMWARDEN_DECISION_LOG_RETRY_MAX_S="0.5", **env))
    return Stack(chroma, side, tmp / "ledger.db"), log


def test_events_reach_the_collector_through_an_outage(tmp_path: Path, chroma_server: Server,
                                                      collector: Collector) -> None:
    stack, log = start(tmp_path, chroma_server, collector, MEMWARDEN_DECISION_LOG_BATCH_MAX=str(BATCH_MAX),
                       MEMWARDEN_DECISION_LOG_FLUSH_S="0.2", MEMWARDEN_DECISION_LOG_BUFFER_MAX=str(BUFFER_MAX))
    side = stack.sidecar
    try:
        t = stack.tenant("ship")
        agent = stack.key(t.name, "red", "a1", 1)
        get = f"/api/v2/tenants/{t.name}/databases/default_database/collections/{t.collection_id}/get"
        sha = side.readiness().json()["policy"]["sha256"]
        assert f"decisions file {log}; shipped to {collector.url} (ndjson, gzip, batches of {BATCH_MAX} or every " \
               f"0.2 s, buffer {BUFFER_MAX})" in side.log.read_text()  # the start-up banner

        def requests(n: int) -> list[str]:
            """`n` requests, alternately allowed (200) and unauthenticated (401); their request ids."""
            ids = []
            with stack.http(agent) as h, stack.http() as anon:
                for i in range(n):
                    r = (h if i % 2 == 0 else anon).post(get, json={})
                    assert r.status_code == (200 if i % 2 == 0 else 401)  # answered whatever the collector does
                    ids.append(r.headers["x-request-id"])
            return ids

        # Up: every event arrives, the file sink's event plus the instance, with the token and the extra header.
        first = requests(12)
        wait_until(lambda: set(first) <= set(collector.by_id()), "the first events")
        got = collector.by_id()
        on_file = {e["request_id"]: e for e in decisions(log)}
        for rid in first:
            e = got[rid]
            assert FIELDS <= set(e) and e["instance"] == "sidecar-it-1" and e["schema_version"] == 1
            assert e["policy_sha256"] == sha
            assert {k: v for k, v in e.items() if k != "instance"} == on_file[rid]
        assert got[first[0]]["decision"] == "allow" and got[first[1]]["reason"] == "not_authenticated"
        assert all(h["authorization"] == "Bearer s3cret-collector-token" and h["x-scope-orgid"] == "acme"
                   for h in collector.headers)
        wait_until(lambda: settled(side), "the shipper to settle")

        # Down for a while, within the buffer: requests answer; the events arrive once the collector is back.
        collector.down()
        during = requests(8)
        wait_until(lambda: shipping(side)["send_errors"]["connect"] > 0, "a refused connection")
        assert not set(during) & set(collector.by_id())
        collector.up()
        wait_until(lambda: set(during) <= set(collector.by_id()), "the events of the outage")
        wait_until(lambda: settled(side), "the shipper to settle")
        assert sum(shipping(side)["dropped"].values()) == 0

        # Down past the bound: the oldest waiting events are dropped and counted, the newest arrive afterwards.
        collector.down()
        n = 4 * BUFFER_MAX
        long_outage = requests(n)
        wait_until(lambda: shipping(side)["accepted"] == shipping(side)["shipped"] + shipping(side)["buffered"]
                   + shipping(side)["dropped"]["buffer_full"], "every event enqueued")
        s = shipping(side)
        dropped = s["dropped"]["buffer_full"]
        assert n - BUFFER_MAX - BATCH_MAX <= dropped <= n - BUFFER_MAX and s["buffered"] == n - dropped
        scraped = {(x.name, tuple(x.labels.items())): x.value for fam in text_string_to_metric_families(
            httpx.get(side.metrics_url, trust_env=False).text) for x in fam.samples}  # type: ignore[arg-type]
        assert scraped[("memwarden_decision_log_dropped_total", (("reason", "buffer_full"),))] == dropped
        collector.up()
        wait_until(lambda: settled(side), "the backlog to ship")
        arrived = [rid for rid in long_outage if rid in collector.by_id()]
        assert len(arrived) == n - dropped
        assert long_outage[-BUFFER_MAX:] == arrived[-BUFFER_MAX:]  # the newest kept; the oldest dropped
        process_log = log.read_text() + side.log.read_text()
        assert "decision_log_dropped" in process_log and "decision_log_send_failed" in process_log
        assert "s3cret-collector-token" not in process_log
    finally:
        side.stop()
    assert side.proc.returncode == 0


def test_sigterm_flushes_the_buffer(tmp_path: Path, chroma_server: Server, collector: Collector) -> None:
    stack, _ = start(tmp_path, chroma_server, collector, MEMWARDEN_DECISION_LOG_BATCH_MAX="1000",
                     MEMWARDEN_DECISION_LOG_FLUSH_S="3600", MEMWARDEN_DECISION_LOG_SHUTDOWN_S="20")
    side = stack.sidecar
    try:
        with stack.http() as anon:
            ids = [anon.post("/api/v2/tenants/x/databases/y/collections/z/get", json={}).headers["x-request-id"]
                   for _ in range(5)]
        wait_until(lambda: shipping(side)["accepted"] == 5, "five events enqueued")
        assert shipping(side)["buffered"] == 5 and collector.events == []  # neither the batch nor the interval came
    finally:
        side.stop()
    assert side.proc.returncode == 0
    assert sorted(collector.by_id()) == sorted(ids)
    assert {e["instance"] for e in collector.events} == {"sidecar-it-1"}


def test_https_collector_verified_by_the_ca_bundle_with_a_client_certificate(tmp_path: Path) -> None:
    """An https collector requiring a client certificate: the shipper built from the settings (CA bundle, client
    certificate and key) delivers; one trusting only the system store never does (the handshake fails, counted,
    nothing sent) and counts the events dropped at its shutdown deadline."""
    certs = make_certs(tmp_path)
    c = Collector(free_port(), certs.server_context(require_client_cert=True))
    c.up()
    try:
        line = json.dumps({"schema_version": 1, "request_id": "r1", "policy_sha256": "00"}, separators=(",", ":"))
        good = from_settings(Settings(decision_log_url=c.url, decision_log_ca_bundle=certs.ca,
                                      decision_log_client_cert=certs.client_cert, decision_log_client_key=certs.client_key,
                                      decision_log_instance="tls-test"))
        assert good is not None
        good.enqueue(line)
        good.close(30)
        assert [(e["request_id"], e["instance"]) for e in c.events] == [("r1", "tls-test")]
        untrusting = from_settings(Settings(decision_log_url=c.url, decision_log_retry_base_s=0.05,
                                            decision_log_retry_max_s=0.1))
        assert untrusting is not None
        untrusting.enqueue(line)
        untrusting.close(0.5)
        st = untrusting.stats()
        assert st["send_errors"]["connect"] >= 1 and st["dropped"]["shutdown"] == 1 and st["shipped"] == 0
        assert len(c.events) == 1
    finally:
        c.down()
