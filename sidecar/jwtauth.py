"""Bearer JWTs (OIDC access tokens, workload tokens) as credentials, beside API keys.

`JwtVerifier.principal(token)` checks, in this order, and refuses with `Unauthorized` (401, decision-logged
``not_authenticated``) naming the first thing wrong:

1. the token is at most ``JWT_MAX_TOKEN_BYTES`` long and its header parses;
2. its ``alg`` is one of ``JWT_ALGORITHMS`` (asymmetric only: ``none`` and ``HS*`` can never be configured, so a
   token signed with an issuer's *public* key as an HMAC secret — algorithm confusion — is refused before any key
   is looked at);
3. a key of the issuer's JWKS matches its ``kid`` and that algorithm (a key's own ``alg``, when the JWKS gives one,
   must be the token's; an RSA key serves RS*/PS*, an EC key the ES* of its curve, an OKP Ed25519 key EdDSA; keys
   with ``use: enc`` and symmetric ``oct`` keys are never used). A token without ``kid`` is accepted only when
   exactly one key fits. An unknown ``kid`` makes the JWKS be read again (file: if it changed; URL: fetched), at
   most once per ``JWT_JWKS_MIN_INTERVAL_S``, so a rotated-in key is found without a restart;
4. the signature verifies (PyJWT, with the key bound to that algorithm; RSA keys below 2048 bits refused);
5. ``iss`` equals ``JWT_ISSUER``, ``aud`` names ``JWT_AUDIENCE``, ``exp`` is present and not past and ``nbf`` (if
   present) not ahead, both with ``JWT_LEEWAY_S`` of clock skew;
6. the claims ``JWT_CLAIMS`` maps are all present and well-formed: tenant, fleet, agent (names as an API key's:
   non-empty, printable, no ``/`` or ``:``), trust (an integer 0-3, or such a digit as a string), roles (a list of
   role names, or one space-separated string).

The principal is an agent (``Agent::"<tenant>/<fleet>/<agent>"``, trust and roles from the token) with key id
``jwt:<sub>`` (``jwt:-`` without a ``sub``). Keys are read from a JWKS file (`JwksSource` re-reads it when its size,
inode or modification time changed and it is older than ``JWT_JWKS_REFRESH_S``, or on an unknown kid) or fetched
from a URL (once at start-up; again in the background when older than ``JWT_JWKS_REFRESH_S``, and on an unknown kid);
a fetch that fails keeps the keys in hand (none at first: every JWT is refused until one succeeds).

With ``JWT_CACHE_TTL_S`` > 0 a token verified once is answered from memory when it comes again (an agent sends the
same token on every request until it renews it): never past the token's ``exp``, never longer than that many
seconds, and never once the key set it was verified under was replaced by a JWKS read. Entries are indexed by a
keyed hash of the token (a random key per process), never the token itself.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import ssl
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jwt as pyjwt
import structlog
from jwt import PyJWK

from sidecar.errors import Unauthorized
from sidecar.governance import Principal

if TYPE_CHECKING:
    from sidecar.config import Settings

log = structlog.get_logger("memwarden.jwt")

# Signature algorithm -> the JWK key type (and EC/OKP curve) that can verify it.
ASYMMETRIC: dict[str, tuple[str, str | None]] = {
    "RS256": ("RSA", None), "RS384": ("RSA", None), "RS512": ("RSA", None),
    "PS256": ("RSA", None), "PS384": ("RSA", None), "PS512": ("RSA", None),
    "ES256": ("EC", "P-256"), "ES384": ("EC", "P-384"), "ES512": ("EC", "P-521"),
    "EdDSA": ("OKP", "Ed25519"),
}
CLAIM_FIELDS = ("tenant", "fleet", "agent", "trust", "roles")
MAX_CACHED_TOKENS = 10000  # verified tokens kept (all dropped when full)
_blake2b = hashlib.blake2b
MAX_JWKS_BYTES = 1024 * 1024


class JwtConfigError(ValueError):
    """JWT settings that cannot be used (an algorithm that is not accepted, a JWKS file that does not parse or
    holds no usable key)."""


def check_algorithms(text: str) -> tuple[str, ...]:
    """The comma-separated algorithm names of ``JWT_ALGORITHMS`` as a tuple. Raises ValueError for ``none``, an
    ``HS*`` algorithm (a shared secret: whoever verifies could mint tokens, and an issuer's public key could be
    used as the secret) or any name not in `ASYMMETRIC`."""
    names = tuple(a.strip() for a in text.split(",") if a.strip())
    for name in names:
        if name.lower() == "none":
            raise ValueError("MEMWARDEN_JWT_ALGORITHMS: 'none' (an unsigned token) is never accepted")
        if name.upper().startswith("HS"):
            raise ValueError(f"MEMWARDEN_JWT_ALGORITHMS: {name} (a shared secret) is not accepted; use the issuer's "
                             "asymmetric keys (RS*, PS*, ES*, EdDSA)")
        if name not in ASYMMETRIC:
            raise ValueError(f"MEMWARDEN_JWT_ALGORITHMS: unknown algorithm {name!r} (one of {', '.join(ASYMMETRIC)})")
    if not names:
        raise ValueError("MEMWARDEN_JWT_ALGORITHMS: name at least one algorithm")
    return names


def parse_jwks(doc: Any, algorithms: tuple[str, ...]) -> dict[tuple[str | None, str], PyJWK]:
    """The usable keys of a JWKS document (``{"keys": [...]}``) by (kid, algorithm): every allowed algorithm a key
    can verify (its own ``alg`` only, when it names one). Keys with ``use: enc``, symmetric (``oct``) keys, keys of
    another type or curve and keys PyJWT cannot load are left out. Raises ValueError when `doc` is not a JWKS."""
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise ValueError('not a JWKS (a JSON object with a "keys" list)')
    out: dict[tuple[str | None, str], PyJWK] = {}
    for jwk in doc["keys"]:
        if not isinstance(jwk, dict) or jwk.get("use", "sig") != "sig":
            continue
        kid = jwk.get("kid")
        if kid is not None and not isinstance(kid, str):
            continue
        own = jwk.get("alg")
        for alg in algorithms:
            kty, crv = ASYMMETRIC[alg]
            if (own is not None and own != alg) or jwk.get("kty") != kty or (crv is not None and jwk.get("crv") != crv):
                continue
            try:
                out[(kid, alg)] = PyJWK(jwk, alg)
            except pyjwt.PyJWTError:
                continue
    return out


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class JwksSource:
    """The issuer's keys (module docstring): from `file` or `url`, for `algorithms`. `refresh_s`: age after which
    they are read again; `min_interval_s`: at most one read per this many seconds triggered by an unknown kid.
    Raises `JwtConfigError` at construction for a file that cannot be read or holds no usable key."""

    def __init__(self, algorithms: tuple[str, ...], *, file: Path | None = None, url: str | None = None,
                 ca: Path | None = None, refresh_s: float = 300.0, min_interval_s: float = 30.0,
                 timeout_s: float = 5.0) -> None:
        if (file is None) == (url is None):
            raise JwtConfigError("a JWKS file or a JWKS URL (one of them)")
        self.algorithms = algorithms
        self.file, self.url, self.ca = file, url, ca
        self.refresh_s, self.min_interval_s, self.timeout_s = refresh_s, min_interval_s, timeout_s
        self.keys: dict[tuple[str | None, str], PyJWK] = {}
        self.loaded_at = float("-inf")  # monotonic time of the last successful read
        self.last_attempt = float("-inf")  # monotonic time of the last read triggered by an unknown kid
        self.fetches = 0  # reads made (file reads that found a change, URL fetches), successful or not
        self._file_seen: tuple[int, int, int] | None = None
        self._lock: asyncio.Lock | None = None
        self._background: asyncio.Task[None] | None = None
        self._background_at = float("-inf")
        if file is not None:
            error = self._read_file()
            if error is not None:
                raise JwtConfigError(error)
            if not self.keys:
                raise JwtConfigError(f"JWKS file {file}: no key usable for {', '.join(algorithms)}")
        else:
            self._fetch_sync()

    # -- reading -----------------------------------------------------------------------------
    def _read_file(self) -> str | None:
        """Re-read the file if it changed; None when the keys are current, else why they were kept."""
        assert self.file is not None
        seen = _stat(self.file)
        if seen is not None and seen == self._file_seen:
            self.loaded_at = time.monotonic()
            return None
        self.fetches += 1
        try:
            data = self.file.read_bytes()
            if len(data) > MAX_JWKS_BYTES:
                raise ValueError(f"larger than {MAX_JWKS_BYTES} bytes")
            keys = parse_jwks(json.loads(data), self.algorithms)
        except (OSError, ValueError) as exc:
            return f"JWKS file {self.file}: {type(exc).__name__}: {exc}"
        self._install(keys)
        self._file_seen = seen
        return None

    def _install(self, keys: dict[tuple[str | None, str], PyJWK]) -> None:
        if set(keys) != set(self.keys):
            log.info("jwks_loaded", source=str(self.file or self.url), kids=sorted({k or "" for k, _ in keys})[:20])
        self.keys = keys
        self.loaded_at = time.monotonic()

    def _verify(self) -> ssl.SSLContext | bool:
        return ssl.create_default_context(cafile=str(self.ca)) if self.ca is not None else True

    def _accept(self, status: int, body: bytes) -> str | None:
        if status != 200:
            return f"JWKS URL answered {status}"
        if len(body) > MAX_JWKS_BYTES:
            return f"JWKS larger than {MAX_JWKS_BYTES} bytes"
        try:
            keys = parse_jwks(json.loads(body), self.algorithms)
        except ValueError as exc:
            return f"JWKS URL: {exc}"
        self._install(keys)
        return None

    def _fetch_sync(self) -> None:
        """The start-up fetch: keys, or none (logged) until a later fetch succeeds."""
        import httpx

        self.fetches += 1
        try:
            with httpx.Client(timeout=self.timeout_s, verify=self._verify(), trust_env=False) as client:
                r = client.get(str(self.url))
            error = self._accept(r.status_code, r.content)
        except (httpx.HTTPError, OSError, ssl.SSLError) as exc:
            error = f"JWKS URL: {type(exc).__name__}"
        if error is not None:
            log.warning("jwks_fetch_failed", url=str(self.url), error=error, kept=len(self.keys))

    async def _fetch(self) -> None:
        import httpx

        self.fetches += 1
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, verify=self._verify(), trust_env=False) as client:
                r = await client.get(str(self.url))
            error = self._accept(r.status_code, r.content)
        except (httpx.HTTPError, OSError, ssl.SSLError) as exc:
            error = f"JWKS URL: {type(exc).__name__}"
        if error is not None:
            log.warning("jwks_fetch_failed", url=str(self.url), error=error, kept=len(self.keys))

    async def refresh(self) -> None:
        """Read the keys again now (one read at a time: a caller arriving during a read waits for it)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        started = time.monotonic()
        async with self._lock:
            if self.loaded_at >= started:  # another caller read them while this one waited
                return
            if self.file is not None:
                error = self._read_file()
                if error is not None:
                    log.warning("jwks_read_failed", error=error, kept=len(self.keys))
            else:
                await self._fetch()

    async def key(self, kid: str | None, alg: str) -> PyJWK | None:
        """The key for (`kid`, `alg`), or None. Keys older than `refresh_s` are read again (a file inline, it is a
        stat; a URL in the background, this call using the keys in hand); an unknown kid reads them again now,
        unless that was done less than `min_interval_s` ago."""
        now = time.monotonic()
        if now - self.loaded_at > self.refresh_s:
            if self.file is not None:
                await self.refresh()
            elif (self._background is None or self._background.done()) and \
                    now - self._background_at >= max(self.min_interval_s, 1.0):  # a failing URL: not fetched in a loop
                self._background_at = now
                self._background = asyncio.get_running_loop().create_task(self.refresh())
        found = self._find(kid, alg)
        if found is None and now - self.last_attempt >= self.min_interval_s:
            self.last_attempt = now
            await self.refresh()
            found = self._find(kid, alg)
        return found

    def _find(self, kid: str | None, alg: str) -> PyJWK | None:
        if kid is not None:
            return self.keys.get((kid, alg))
        fitting = [k for (_, a), k in self.keys.items() if a == alg]
        return fitting[0] if len(fitting) == 1 else None


def _header(token: str) -> dict[str, Any]:
    """The JOSE header of a compact token (its first segment, base64url JSON), unverified: only to choose the
    algorithm and key; PyJWT parses and checks the whole token again when it verifies it. Raises `Unauthorized`
    when it is not a JSON object."""
    segment = token.partition(".")[0]
    try:
        header = json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    except (ValueError, TypeError):
        raise Unauthorized("malformed JWT") from None
    if not isinstance(header, dict):
        raise Unauthorized("malformed JWT")
    return header


def _claim(claims: dict[str, Any], path: str) -> Any:
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


class JwtVerifier:
    """Verifies bearer JWTs and maps their claims to a principal (module docstring)."""

    def __init__(self, issuer: str, audience: str, algorithms: tuple[str, ...], jwks: JwksSource,
                 claims: dict[str, str], leeway_s: float = 30.0, max_token_bytes: int = 8192,
                 cache_ttl_s: float = 0.0) -> None:
        self.issuer, self.audience, self.algorithms, self.jwks = issuer, audience, algorithms, jwks
        self.claims, self.leeway_s, self.max_token_bytes = dict(claims), leeway_s, max_token_bytes
        self._required = ["exp", "iss", "aud"]
        # Tokens verified already (`cache_ttl_s` > 0): keyed BLAKE2b of the token under a per-process key ->
        # (the key set in force then, monotonic deadline, the token's exp in epoch seconds, principal).
        self.cache_ttl_s = cache_ttl_s
        self._cache: dict[bytes, tuple[Any, float, float, Principal]] | None = {} if cache_ttl_s > 0 else None
        self._secret = os.urandom(32)

    @classmethod
    def from_settings(cls, settings: "Settings") -> "JwtVerifier":
        """The verifier ``JWT_*`` describes (validated by `Settings`). Raises `JwtConfigError` for a JWKS file that
        cannot be used."""
        try:
            algorithms = check_algorithms(settings.jwt_algorithms)
        except ValueError as exc:
            raise JwtConfigError(str(exc)) from None
        jwks = JwksSource(algorithms, file=settings.jwt_jwks_file,
                          url=str(settings.jwt_jwks_url) if settings.jwt_jwks_url is not None else None,
                          ca=settings.jwt_jwks_ca, refresh_s=settings.jwt_jwks_refresh_s,
                          min_interval_s=settings.jwt_jwks_min_interval_s)
        assert settings.jwt_issuer is not None and settings.jwt_audience is not None
        return cls(settings.jwt_issuer, settings.jwt_audience, algorithms, jwks, settings.jwt_claims,
                   settings.jwt_leeway_s, settings.jwt_max_token_bytes, settings.jwt_cache_ttl_s)

    def describe(self) -> str:
        """One line for the start-up banner."""
        source = self.jwks.file or self.jwks.url
        return (f"iss {self.issuer} aud {self.audience}; {', '.join(self.algorithms)}; keys {source} "
                f"({len({k for k, _ in self.jwks.keys})} kids)")

    async def principal(self, token: str) -> Principal:
        """The agent principal of a valid `token` (module docstring). Raises `Unauthorized` saying why not."""
        if len(token) > self.max_token_bytes:
            raise Unauthorized(f"JWT longer than {self.max_token_bytes} bytes (MEMWARDEN_JWT_MAX_TOKEN_BYTES)")
        cache = self._cache
        digest = None
        if cache is not None:
            digest = _blake2b(token.encode("utf-8", "surrogatepass"), key=self._secret, digest_size=32).digest()
            hit = cache.get(digest)
            if hit is not None:
                if hit[0] is self.jwks.keys and time.monotonic() < hit[1] and time.time() < hit[2]:
                    return hit[3]
                del cache[digest]
        header = _header(token)
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.algorithms:
            raise Unauthorized(f"JWT algorithm {str(alg)[:20]!r} is not accepted (MEMWARDEN_JWT_ALGORITHMS: "
                               f"{','.join(self.algorithms)})")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise Unauthorized("malformed JWT (kid is not a string)")
        key = await self.jwks.key(kid, alg)
        keys_in_force = self.jwks.keys
        if key is None:
            raise Unauthorized(f"JWT signed by an unknown key (kid {str(kid)[:64]!r}, {alg})" if kid is not None
                               else f"JWT without kid and not exactly one {alg} key in the JWKS")
        try:
            claims = pyjwt.decode(token, key=key, algorithms=[alg], audience=self.audience, issuer=self.issuer,
                                  leeway=self.leeway_s, options={"require": self._required,
                                                                 "enforce_minimum_key_length": True})
        except pyjwt.ExpiredSignatureError:
            raise Unauthorized("JWT expired (exp)") from None
        except pyjwt.ImmatureSignatureError:
            raise Unauthorized("JWT not yet valid (nbf or iat in the future)") from None
        except pyjwt.InvalidAudienceError:
            raise Unauthorized(f"JWT audience is not {self.audience!r}") from None
        except pyjwt.InvalidIssuerError:
            raise Unauthorized(f"JWT issuer is not {self.issuer!r}") from None
        except pyjwt.MissingRequiredClaimError as exc:
            raise Unauthorized(f"JWT lacks the required {exc.claim!r} claim") from None
        except pyjwt.InvalidSignatureError:
            raise Unauthorized("JWT signature does not verify") from None
        except pyjwt.PyJWTError as exc:
            raise Unauthorized(f"invalid JWT ({type(exc).__name__})") from None
        principal = self.map_claims(claims)
        if cache is not None and digest is not None:
            if len(cache) >= MAX_CACHED_TOKENS:
                cache.clear()
            # until the token's exp (no leeway: a cached answer never stretches it), at most cache_ttl_s, and only while
            # the key set it was verified under is the one in force (a JWKS re-read that changed it drops the entry)
            cache[digest] = (keys_in_force, time.monotonic() + self.cache_ttl_s, float(claims["exp"]), principal)
        return principal

    def map_claims(self, claims: dict[str, Any]) -> Principal:
        """The agent principal of verified `claims` under the claims map. Raises `Unauthorized` naming the claim
        that is missing or malformed."""
        from sidecar.ledger.base import check_key_request, check_names

        values: dict[str, Any] = {}
        for name, path in self.claims.items():
            value = _claim(claims, path)
            if value is None:
                raise Unauthorized(f"JWT lacks the {path!r} claim ({name}, MEMWARDEN_JWT_CLAIMS)")
            values[name] = value
        names = {}
        for name in ("tenant", "fleet", "agent"):
            v = values[name]
            if not isinstance(v, str) or not v or "/" in v or ":" in v or not v.isprintable() or len(v) > 256:
                raise Unauthorized(f"JWT claim {self.claims[name]!r} ({name}) is not a name (non-empty, printable, "
                                   "no '/' or ':')")
            names[name] = v
        trust = values.get("trust", 0)
        if isinstance(trust, str) and trust in ("0", "1", "2", "3"):
            trust = int(trust)
        if type(trust) is not int or not 0 <= trust <= 3:
            raise Unauthorized(f"JWT claim {self.claims.get('trust')!r} (trust) is not 0-3")
        roles = values.get("roles", [])
        if isinstance(roles, str):
            roles = roles.split()
        try:
            if not isinstance(roles, list):
                raise ValueError("not a list")
            roles_t = check_names("role", roles)
            check_key_request("agent", names["tenant"], names["fleet"], names["agent"], trust, roles_t)
        except ValueError as exc:
            raise Unauthorized(f"JWT claim {self.claims.get('roles')!r} (roles): {exc}") from None
        sub = claims.get("sub")
        key_id = f"jwt:{sub[:200]}" if isinstance(sub, str) and sub else "jwt:-"
        return Principal(kind="agent", key_id=key_id, tenant=names["tenant"], fleet=names["fleet"], agent=names["agent"],
                         trust=trust, roles=roles_t)
