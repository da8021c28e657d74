"""The decision log's HTTP sink (`sidecar.logship.Shipper`) against `httpx.MockTransport` collectors: batches by count
and on the flush interval, a gzip body that decodes to the events (NDJSON and JSON array) with ``instance`` added,
retries with backoff on 5xx and connection errors then success, a content refusal dropped, the bounded buffer dropping
the oldest and counting, enqueue never waiting for a stuck collector, the shutdown flush and its deadline, drop logs,
the token file, the settings and the Prometheus series. Waits are for events, never timed assertions."""

from __future__ import annotations

import gzip
import json
import random
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from sidecar.config import Settings
from sidecar.logship import Shipper, Tee, backoff_delay, from_settings
from sidecar.metrics import Metrics

URL = "http://collector.test/v1/decisions"


def event(i: int) -> str:
    """A decision event's line, as the writer renders it (orjson, no spaces)."""
    return json.dumps({"schema_version": 1, "request_id": f"{i:032x}", "policy_sha256": "ab" * 32, "n": i},
                      separators=(",", ":"))


class Collector:
    """A MockTransport handler recording every POST (decoded), answering from `answers` (status codes or
    exceptions, in order; 200 once they run out)."""

    def __init__(self, answers: list[Any] | None = None, gate: threading.Event | None = None) -> None:
        self.answers = list(answers or [])
        self.gate = gate
        self.requests: list[httpx.Request] = []
        self.batches: list[list[dict[str, Any]]] = []  # the events of each POST answered 2xx
        self.attempts = 0
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.gate is not None:
            self.gate.wait(30)
        with self.lock:
            self.attempts += 1
            self.requests.append(request)
            answer = self.answers.pop(0) if self.answers else 200
            if isinstance(answer, Exception):
                self.changed.notify_all()
                raise answer
            if 200 <= answer < 300:
                self.batches.append(decode(request))
            self.changed.notify_all()
        return httpx.Response(answer)

    def events(self) -> list[dict[str, Any]]:
        return [e for b in self.batches for e in b]

    def wait_for(self, cond: Callable[[], bool], timeout: float = 30.0) -> None:
        with self.changed:
            assert self.changed.wait_for(cond, timeout), "the collector never saw it"


def decode(request: httpx.Request) -> list[dict[str, Any]]:
    assert request.headers["content-encoding"] == "gzip"
    text = gzip.decompress(request.content).decode()
    if request.headers["content-type"] == "application/x-ndjson":
        assert text.endswith("\n")
        return [json.loads(line) for line in text.splitlines()]
    assert request.headers["content-type"] == "application/json"
    out = json.loads(text)
    assert isinstance(out, list)
    return out


def shipper(collector: Collector, **kw: Any) -> Shipper:
    kw.setdefault("instance", "pod-a")
    kw.setdefault("retry_base_s", 0.001)
    kw.setdefault("retry_max_s", 0.01)
    kw.setdefault("flush_s", 3600.0)
    return Shipper(URL, transport=httpx.MockTransport(collector), rng=random.Random(7), **kw)


def test_full_batches_go_at_once_and_the_rest_at_close() -> None:
    c = Collector()
    s = shipper(c, batch_max=3, buffer_max=100)
    s.start()
    for i in range(7):
        s.enqueue(event(i))
    c.wait_for(lambda: len(c.batches) == 2)
    assert [len(b) for b in c.batches] == [3, 3]  # the flush interval (an hour) never came: count alone
    s.close(10)
    assert [len(b) for b in c.batches] == [3, 3, 1]
    got = c.events()
    assert [e["n"] for e in got] == list(range(7))
    assert all(e["instance"] == "pod-a" and e["schema_version"] == 1 and e["policy_sha256"] == "ab" * 32 for e in got)
    assert list(got[0])[-1] == "instance"  # appended after the event's own fields
    assert s.stats()["shipped"] == 7 and s.stats()["batches"] == 3 and s.stats()["buffered"] == 0
    assert sum(s.stats()["dropped"].values()) == 0


def test_a_partial_batch_goes_on_the_flush_interval() -> None:
    c = Collector()
    s = shipper(c, batch_max=100, flush_s=0.05)
    s.start()
    s.enqueue(event(1))
    s.enqueue(event(2))
    c.wait_for(lambda: len(c.batches) == 1)  # well below batch_max: only the interval sends it
    assert [e["n"] for e in c.events()] == [1, 2]
    s.close(10)


def test_json_array_format() -> None:
    c = Collector()
    s = shipper(c, fmt="json")
    for i in range(3):
        s.enqueue(event(i))
    s.close(10)  # never started: close ships in the caller
    assert c.requests[0].headers["content-type"] == "application/json"
    assert [e["n"] for e in c.events()] == [0, 1, 2] and c.events()[0]["instance"] == "pod-a"


def test_retry_after_5xx_4xx_and_connection_errors_then_success() -> None:
    c = Collector([503, httpx.ConnectError("refused"), 500, httpx.ReadTimeout("slow"), 404, 429, 200])
    s = shipper(c, batch_max=2)
    s.start()
    s.enqueue(event(1))
    s.enqueue(event(2))
    c.wait_for(lambda: len(c.batches) == 1)
    assert c.attempts == 7
    bodies = {r.content for r in c.requests}
    assert len(bodies) == 1  # the same batch each time
    assert [e["n"] for e in c.events()] == [1, 2]
    s.close(10)
    st = s.stats()
    assert st["send_errors"] == {"connect": 1, "timeout": 1, "4xx": 2, "5xx": 2, "token_file": 0, "other": 0}
    assert st["shipped"] == 2 and sum(st["dropped"].values()) == 0


def test_backoff_grows_with_jitter_up_to_the_cap() -> None:
    rng = random.Random(1)
    for attempt in range(12):
        d = min(30.0, 0.5 * 2 ** attempt)
        draws = [backoff_delay(attempt, 0.5, 30.0, rng) for _ in range(200)]
        assert all(d / 2 <= x <= d for x in draws)
        assert len(set(draws)) > 100  # jittered: replicas do not retry in step
    assert backoff_delay(10_000, 0.5, 30.0) <= 30.0


def test_a_batch_refused_for_its_content_is_dropped_and_counted() -> None:
    c = Collector([400, 200])
    s = shipper(c, batch_max=2)
    for i in range(4):
        s.enqueue(event(i))
    s.close(10)
    assert c.attempts == 2 and [e["n"] for e in c.events()] == [2, 3]
    assert s.stats()["dropped"]["rejected"] == 2 and s.stats()["send_errors"]["4xx"] == 1


def test_a_batch_too_large_for_the_collector_is_split() -> None:
    """413 for a body of more than two events (or for the event "huge"): halves are sent, in order, down to single
    events; a single event still too large is dropped (``rejected``)."""
    taken: list[list[int]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        events = decode(request)
        if len(events) > 2 or any(e.get("huge") for e in events):
            return httpx.Response(413)
        taken.append([e["n"] for e in events])
        return httpx.Response(200)

    s = Shipper(URL, instance="pod-a", batch_max=7, transport=httpx.MockTransport(handler), rng=random.Random(7))
    for i in range(7):
        s.enqueue(event(i) if i != 4 else json.dumps({"n": 4, "huge": True}))
    s.close(10)
    # [0..6] -> [0, 1, 2] + [3..6]; [0, 1, 2] -> [0] + [1, 2]; [3..6] -> [3, 4] + [5, 6]; [3, 4] -> [3] + [4] (dropped)
    assert taken == [[0], [1, 2], [3], [5, 6]]
    st = s.stats()
    assert (st["shipped"], st["dropped"]["rejected"], st["buffered"]) == (6, 1, 0)


def test_full_buffer_drops_the_oldest_and_counts() -> None:
    c = Collector()
    s = shipper(c, batch_max=5, buffer_max=5)
    for i in range(8):  # no thread yet: nothing leaves the buffer
        s.enqueue(event(i))
    st = s.stats()
    assert st["dropped"]["buffer_full"] == 3 and st["buffered"] == 5 and st["accepted"] == 8
    with capture_logs() as logs:
        s.start()
        s.close(10)
    assert [e["n"] for e in c.events()] == [3, 4, 5, 6, 7]  # the newest kept
    drops = [e for e in logs if e["event"] == "decision_log_dropped"]
    assert len(drops) == 1 and drops[0]["dropped"] == 3 and drops[0]["log_level"] == "warning"
    assert drops[0]["dropped_total"]["buffer_full"] == 3 and drops[0]["url"] == URL


def test_enqueue_never_waits_for_a_stuck_collector() -> None:
    gate = threading.Event()
    c = Collector(gate=gate)
    s = shipper(c, batch_max=2, buffer_max=10)
    s.start()
    s.enqueue(event(0))
    s.enqueue(event(1))  # a full batch: the thread POSTs it and the collector does not answer
    deadline = time.monotonic() + 30
    while s.stats()["buffered"] != 2 or len(s._buf) != 0:  # the batch is in flight
        assert time.monotonic() < deadline
        time.sleep(0.01)
    for i in range(2, 1000):  # the request path meanwhile: returns every time; the buffer keeps its bound
        s.enqueue(event(i))
    assert len(s._buf) == 10 and s.stats()["dropped"]["buffer_full"] == 988
    gate.set()
    s.close(10)
    assert [e["n"] for e in c.events()] == [0, 1, *range(990, 1000)]
    st = s.stats()
    assert st["shipped"] + sum(st["dropped"].values()) == st["accepted"] == 1000


def test_close_gives_up_at_its_deadline_and_counts_the_rest() -> None:
    c = Collector([503] * 10_000)
    s = shipper(c, batch_max=2, retry_base_s=0.01, retry_max_s=0.05)
    s.start()
    for i in range(5):
        s.enqueue(event(i))
    with capture_logs() as logs:
        s.close(0.3)
    st = s.stats()
    assert st["shipped"] == 0 and st["dropped"]["shutdown"] == 5 and st["buffered"] == 0
    assert any(e["event"] == "decision_log_send_failed" and e["last"]["status"] == 503 for e in logs)
    assert any(e["event"] == "decision_log_dropped" and e["dropped_total"]["shutdown"] == 5 for e in logs)
    s.enqueue(event(9))  # after close: counted, not kept
    assert s.stats()["dropped"]["shutdown"] == 6 and s.stats()["buffered"] == 0


def test_drop_logs_at_most_once_per_interval() -> None:
    c = Collector([503] * 10_000)
    s = shipper(c, batch_max=1, buffer_max=1, log_interval_s=3600)
    with capture_logs() as logs:
        s.start()
        for round_ in range(5):
            for i in range(10):
                s.enqueue(event(round_ * 10 + i))
            c.wait_for(lambda: c.attempts > round_ * 3 + 3)  # the thread reports after every failed try
        assert [e["event"] for e in logs].count("decision_log_dropped") == 1
        assert [e["event"] for e in logs].count("decision_log_send_failed") == 1
        s.close(0)


def test_bearer_token_from_a_file_reread_when_it_changes(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    c = Collector()
    s = shipper(c, batch_max=1, token_file=token, headers={"X-Scope-OrgID": "acme"})
    s.enqueue(event(0))
    s._deliver([s._buf.popleft()], final=False)
    token.write_text("second-token\n")
    s.enqueue(event(1))
    s.close(10)
    assert [r.headers["authorization"] for r in c.requests] == ["Bearer first", "Bearer second-token"]
    assert all(r.headers["x-scope-orgid"] == "acme" for r in c.requests)


def test_an_unreadable_token_file_is_retried_not_sent_without() -> None:
    c = Collector()
    s = shipper(c, token_file=Path("/nonexistent/token"))
    s.enqueue(event(0))
    s.close(0.1)
    assert c.attempts == 0 and s.stats()["send_errors"]["token_file"] >= 1 and s.stats()["dropped"]["shutdown"] == 1


def test_tee_writes_the_sink_then_ships() -> None:
    lines: list[str] = []

    class Sink:
        def info(self, line: str) -> None:
            lines.append("sink:" + line)

    tee = Tee(Sink(), lambda line: lines.append("ship:" + line))
    tee.info("{}")
    tee.msg("{ }")
    assert lines == ["sink:{}", "ship:{}", "sink:{ }", "ship:{ }"]

    class Broken:
        def info(self, line: str) -> None:
            raise BrokenPipeError

    shipped: list[str] = []
    with pytest.raises(BrokenPipeError):
        Tee(Broken(), shipped.append).info("{}")
    assert shipped == ["{}"]  # the collector still gets it


def test_shipper_bounds_and_reserved_headers() -> None:
    with pytest.raises(ValueError):
        Shipper(URL, batch_max=10, buffer_max=5)
    with pytest.raises(ValueError):
        Shipper(URL, headers={"Content-Encoding": "br"})
    with pytest.raises(ValueError):
        Shipper(URL, fmt="xml")  # type: ignore[arg-type]


def test_settings(tmp_path: Path) -> None:
    assert from_settings(Settings()) is None
    s = Settings(decision_log_url="http://127.0.0.1:9/logs", decision_log_batch_max=7, decision_log_buffer_max=70,
                 decision_log_instance="replica-1", decision_log_headers={"X-Tenant": "t"})
    sh = from_settings(s)
    assert sh is not None and (sh.batch_max, sh.buffer_max, sh.instance, sh.fmt) == (7, 70, "replica-1", "ndjson")
    sh.close(0)
    assert from_settings(Settings(decision_log_url="http://127.0.0.1:9/logs", decision_log="off")) is None
    default = from_settings(Settings(decision_log_url="http://127.0.0.1:9/logs"))
    assert default is not None and default.instance  # the host name
    default.close(0)
    for bad in ({"decision_log_token_file": tmp_path / "t"},  # without a URL
                {"decision_log_url": "http://h/x", "decision_log_batch_max": 20, "decision_log_buffer_max": 10},
                {"decision_log_url": "http://h/x", "decision_log_ca_bundle": tmp_path / "ca.pem"},  # not https
                {"decision_log_url": "https://h/x", "decision_log_ca_bundle": tmp_path / "missing.pem"},
                {"decision_log_url": "http://h/x", "decision_log_headers": {"Content-Type": "text/plain"}},
                {"decision_log_url": "ftp://h/x"}):
        with pytest.raises(ValueError):
            Settings(**bad)


def test_prometheus_series() -> None:
    c = Collector([400])
    s = shipper(c, batch_max=1, buffer_max=1)
    m = Metrics()
    m.watch_decision_log(s.stats)
    for i in range(3):
        s.enqueue(event(i))  # 2 pushed out of the buffer
    s.close(10)  # the last one refused (400)
    values = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
              for fam in text_string_to_metric_families(m.render().decode()) for sample in fam.samples}
    assert values[("memwarden_decision_log_dropped_total", (("reason", "buffer_full"),))] == 2
    assert values[("memwarden_decision_log_dropped_total", (("reason", "rejected"),))] == 1
    assert values[("memwarden_decision_log_send_errors_total", (("kind", "4xx"),))] == 1
    assert values[("memwarden_decision_log_shipped_total", ())] == 0
    assert values[("memwarden_decision_log_buffered", ())] == 0
