"""CPU cost of writing one decision event (`sidecar.decisionlog.recorder`, the default chain, no masking) into a
sink that discards the line: microseconds per event, median of `--rounds` rounds of `--events` events, for a
typical read (a get of 5 rows, one denied) and a refused write. Runs against whichever ``sidecar`` is first on
``PYTHONPATH``, so two trees can be compared by alternating runs:

    for i in 1 2 3; do PYTHONPATH=/tmp/main python bench/decisionlog_cost.py; PYTHONPATH=. python bench/decisionlog_cost.py; done

Prints one line: ``schema <n> read <median µs> (min <µs>) write <median µs> (min <µs>)``. A figure, not a test: run it on a quiet machine.

``--ship`` also hands every line to a running `sidecar.logship.Shipper` (its thread batching, compressing and
POSTing to an `httpx.MockTransport` that answers 200), as ``DECISION_LOG_URL`` does: the request path's added cost
(`Tee` + `Shipper.enqueue`) with the shipping thread competing for the interpreter; the shipper's counts follow.
"""

from __future__ import annotations

import argparse
import statistics
import time

from sidecar import decisionlog
from sidecar.exchange import Exchange
from sidecar.governance import Principal


class Discard:
    def info(self, line: str) -> None:
        pass


def _set(ex: Exchange, **values: object) -> None:
    for name, value in values.items():
        if hasattr(ex, name):  # fields of the schema under test only
            setattr(ex, name, value)


def exchanges() -> tuple[Exchange, Exchange]:
    agent = Principal(kind="agent", key_id="0123456789abcdef", tenant="acme", fleet="red", agent="writer", trust=1)
    read = Exchange("POST", "/api/v2/tenants/acme/databases/default_database/collections/"
                            "11111111-1111-1111-1111-111111111111/get")
    _set(read, principal=agent, key_id="0123456789abcdef", operation="get", action="read", decision="allow",
         resource="Collection::chroma:11111111-1111-1111-1111-111111111111", policies={"agent-search-list",
         "read-fleet-scope"}, rows_allowed=4, rows_denied=1, row_deny_reasons={"no_permit": 1},
         row_ids=["r1", "r2", "r3", "r4"], client="127.0.0.1:50412", auth="x-api-key", actions=["list", "read"],
         denied_row_ids=["r5"])
    write = Exchange("POST", "/api/v2/tenants/acme/databases/default_database/collections/"
                             "11111111-1111-1111-1111-111111111111/add")
    _set(write, principal=agent, key_id="0123456789abcdef", operation="add", action="write", decision="deny",
         reason="no_permit", resource="Collection::chroma:11111111-1111-1111-1111-111111111111",
         policies={"agent-search-list"}, rows_denied=1, row_deny_reasons={"no_permit": 1}, client="127.0.0.1:50413",
         auth="x-api-key", actions=["list", "write"], deny_action="write", denied_row_ids=["n1"])
    return read, write


def per_event_us(record: object, ex: Exchange, status: int, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        record(ex, status, "ab" * 32, "enforce")  # type: ignore[operator]
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ship", action="store_true", help="also enqueue each line to a running HTTP shipper")
    args = ap.parse_args()
    sink: object = Discard()
    shipper = None
    if args.ship:
        import httpx

        from sidecar.logship import Shipper, Tee

        shipper = Shipper("http://collector.invalid/v1", instance="bench", flush_s=1.0,
                          transport=httpx.MockTransport(lambda request: httpx.Response(200)))
        shipper.start()
        sink = Tee(sink, shipper.enqueue)
    record = decisionlog.recorder(decisionlog.processors(), sink)
    read, write = exchanges()
    per_event_us(record, read, 200, 1000)  # warm the kept runs
    reads = [per_event_us(record, read, 200, args.events) for _ in range(args.rounds)]
    writes = [per_event_us(record, write, 403, args.events) for _ in range(args.rounds)]
    version = getattr(decisionlog, "SCHEMA_VERSION", 0)
    print(f"schema {version} read {statistics.median(reads):.2f} (min {min(reads):.2f}) write {statistics.median(writes):.2f} "
          f"(min {min(writes):.2f}) µs per event" + (" (shipped)" if shipper else ""))
    if shipper is not None:
        shipper.close(30)
        print(shipper.stats())


if __name__ == "__main__":
    main()
