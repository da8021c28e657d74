"""Authentication-stage benchmark (a script, not a test): the time `sidecar.identity.Identity.authenticate` takes
per request for an API key (SQLite ledger behind the sidecar's key cache: a cache hit, and a miss that reads the
ledger) and for a bearer JWT (RS256 2048-bit and ES256 P-256, keys from a JWKS file, claims mapped; verified on every
request, ``JWT_CACHE_TTL_S=0``, and the same token sent again under the default 60 s token cache), in process,
on the event loop, one call at a time. Prints p50/p90/p99 in microseconds and the JWT's added p50 over the API key.

    nice -n 10 .venv/bin/python bench/identity_auth.py [--n 5000] [--json out.json]

The uncached JWT rows are what every new token costs (signature, claims, mapping). The API key's cache hit
is the steady state of a key in use on SQLite (``LEDGER_CACHE_TTL_S``); a miss is its first request after a change.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sidecar.exchange import Exchange  # noqa: E402
from sidecar.identity import Identity  # noqa: E402
from sidecar.jwtauth import JwksSource, JwtVerifier  # noqa: E402
from sidecar.ledger import SQLiteLedger  # noqa: E402
from sidecar.ledger.cache import CachingLedger  # noqa: E402
from sidecar.stages.authorize import Authorizer  # noqa: E402
from tests.jwtutil import AUDIENCE, ISSUER, Issuer, SigningKey  # noqa: E402

CLAIMS = {"tenant": "tenant", "fleet": "fleet", "agent": "sub", "trust": "trust", "roles": "groups"}


def percentiles(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"p50_us": statistics.median(s), "p90_us": s[int(len(s) * 0.9)], "p99_us": s[int(len(s) * 0.99)]}


async def timed(n: int, call: Callable[[], Awaitable[Any]]) -> list[float]:
    for _ in range(min(200, n)):  # warm-up
        await call()
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        await call()
        out.append((time.perf_counter_ns() - t0) / 1000)
    return out


async def main(n: int) -> dict[str, dict[str, float]]:
    tmp = Path(tempfile.mkdtemp(prefix="mw-identity-bench-"))
    inner = SQLiteLedger(tmp / "ledger.db")
    cached = CachingLedger(inner, inner.cache_version, ttl_s=3600)
    uncached = CachingLedger(inner, inner.cache_version, ttl_s=0)
    _, key = inner.create_key("agent", "t1", "red", "a1", 1)
    issuer = Issuer([SigningKey.rsa("rsa-1"), SigningKey.ec("ec-1")])
    (tmp / "jwks.json").write_text(json.dumps(issuer.jwks()))
    algorithms = ("RS256", "ES256")
    jwks = JwksSource(algorithms, file=tmp / "jwks.json")
    verifier = JwtVerifier(ISSUER, AUDIENCE, algorithms, jwks, CLAIMS)  # JWT_CACHE_TTL_S=0: verified every time
    cached_verifier = JwtVerifier(ISSUER, AUDIENCE, algorithms, jwks, CLAIMS, cache_ttl_s=60.0)  # the default
    rs, es = issuer.token(issuer.keys[0], exp=int(time.time()) + 3600), issuer.token(issuer.keys[1], exp=int(time.time()) + 3600)
    ex = Exchange(method="GET", raw_path="/")
    hit = Identity(Authorizer(None, cached), verifier)  # type: ignore[arg-type]
    token_cache = Identity(Authorizer(None, cached), cached_verifier)  # type: ignore[arg-type]
    miss = Identity(Authorizer(None, uncached), verifier)  # type: ignore[arg-type]
    results = {
        "api_key_cache_hit": percentiles(await timed(n, lambda: hit.authenticate(ex, key, None))),
        "api_key_ledger_read": percentiles(await timed(n, lambda: miss.authenticate(ex, key, None))),
        "jwt_rs256": percentiles(await timed(n, lambda: hit.authenticate(ex, rs, None))),
        "jwt_es256": percentiles(await timed(n, lambda: hit.authenticate(ex, es, None))),
        "jwt_rs256_cached": percentiles(await timed(n, lambda: token_cache.authenticate(ex, rs, None))),
    }
    inner.close()
    return results


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    res = asyncio.run(main(args.n))
    base = res["api_key_cache_hit"]["p50_us"]
    for name, r in res.items():
        extra = f"  (+{r['p50_us'] - base:.1f} us p50 over an API key cache hit)" if name.startswith("jwt") else ""
        print(f"{name:22s} p50 {r['p50_us']:8.1f} us  p90 {r['p90_us']:8.1f}  p99 {r['p99_us']:8.1f}{extra}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
