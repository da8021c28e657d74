"""sidecar/jwtauth.py and sidecar/identity.py without a server: which tokens are accepted, what each refusal says,
how claims become a principal, JWKS selection and rotation, and the settings that can verify a token."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.config import ConfigError, load_settings
from sidecar.errors import Unauthorized
from sidecar.exchange import Exchange
from sidecar.governance import Principal
from sidecar.identity import Identity, looks_like_jwt
from sidecar.jwtauth import JwksSource, JwtConfigError, JwtVerifier, check_algorithms, parse_jwks
from tests.jwtutil import AUDIENCE, ISSUER, Issuer, JwksServer, SigningKey

CLAIMS = {"tenant": "tenant", "fleet": "fleet", "agent": "sub", "trust": "trust", "roles": "groups"}


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer([SigningKey.rsa("rsa-1"), SigningKey.ec("ec-1")])


def verifier(tmp_path: Path, issuer: Issuer, claims: dict[str, str] | None = None, **kw: Any) -> JwtVerifier:
    f = tmp_path / "jwks.json"
    f.write_text(json.dumps(issuer.jwks()))
    algorithms = kw.pop("algorithms", ("RS256", "ES256"))
    jwks = JwksSource(algorithms, file=f, min_interval_s=kw.pop("min_interval_s", 0.0))
    return JwtVerifier(ISSUER, AUDIENCE, algorithms, jwks, claims or CLAIMS, **kw)


def accept(v: JwtVerifier, token: str) -> Principal:
    return asyncio.run(v.principal(token))


def refusal(v: JwtVerifier, token: str) -> str:
    with pytest.raises(Unauthorized) as info:
        asyncio.run(v.principal(token))
    assert info.value.status == 401 and info.value.reason == "not_authenticated"
    return info.value.message


def test_a_valid_token_maps_its_claims_to_an_agent(tmp_path: Path, issuer: Issuer) -> None:
    v = verifier(tmp_path, issuer)
    p = accept(v, issuer.token(trust=2, groups=["triage", "oncall"]))
    assert (p.kind, p.tenant, p.fleet, p.agent, p.trust, p.roles) == ("agent", "t1", "red", "a1", 2, ("oncall", "triage"))
    assert p.key_id == "jwt:a1" and p.describe() == "Agent::t1/red/a1"
    ec_p = accept(v, issuer.token(issuer.keys[1], trust="1", groups="a b"))  # ES256; trust as a digit, roles a string
    assert ec_p.trust == 1 and ec_p.roles == ("a", "b")


def test_nested_claims_and_optional_trust_and_roles(tmp_path: Path, issuer: Issuer) -> None:
    v = verifier(tmp_path, issuer, {"tenant": "org.id", "fleet": "org.team", "agent": "sub"})
    p = accept(v, issuer.token(org={"id": "acme", "team": "blue"}))
    assert (p.tenant, p.fleet, p.trust, p.roles) == ("acme", "blue", 0, ())


@pytest.mark.parametrize("make, says", [
    (lambda i: i.token(exp=1), "expired"),
    (lambda i: i.token(nbf=2_000_000_000 + 10**9), "not yet valid"),
    (lambda i: i.token(aud="another-service"), "audience"),
    (lambda i: i.token(iss="https://evil.example"), "issuer"),
    (lambda i: i.token(exp=None), "'exp'"),
    (lambda i: i.token(aud=None), "'aud'"),
    (lambda i: i.unsigned(), "algorithm 'none'"),
    (lambda i: i.hs256_with_public_key(), "algorithm 'HS256'"),
    (lambda i: i.token(headers={"kid": "nope"}), "unknown key"),
    (lambda i: i.tampered(tenant="t2"), "signature"),
    (lambda i: i.token(tenant=None), "'tenant'"),
    (lambda i: i.token(fleet=None), "'fleet'"),
    (lambda i: i.token(sub=None), "'sub'"),
    (lambda i: i.token(trust=None), "'trust'"),
    (lambda i: i.token(tenant="t1/x"), "tenant"),
    (lambda i: i.token(trust=9), "0-3"),
    (lambda i: i.token(trust=True), "0-3"),
    (lambda i: i.token(groups=["bad role"]), "role"),
    (lambda i: i.token(groups={"a": 1}), "roles"),
    (lambda i: i.token(pad="x" * 9000), "longer than"),
    (lambda i: "eyJhbGciOiJSUzI1NiJ9.bm90IGpzb24.c2ln", "signature|invalid JWT|malformed"),
    (lambda i: "not-base64!.x.y", "malformed"),
])
def test_a_bad_token_is_refused_saying_why(tmp_path: Path, issuer: Issuer, make: Any, says: str) -> None:
    import re

    v = verifier(tmp_path, issuer)
    tokens = make(issuer)
    message = refusal(v, tokens)
    assert re.search(says, message), message


def test_the_token_cannot_pick_an_algorithm_the_key_does_not_have(tmp_path: Path, issuer: Issuer) -> None:
    # an RS256 key named by kid, the token claiming ES256 (or PS256, allowed but not this key's alg): no key fits
    v = verifier(tmp_path, issuer, algorithms=("RS256", "PS256", "ES256"))
    head_es = issuer.token(issuer.keys[1], headers={"kid": "rsa-1"})
    assert "unknown key" in refusal(v, head_es)
    ps = SigningKey("rsa-1", "PS256", issuer.keys[0].private)  # same RSA key, PS256; the JWK says alg RS256
    assert "unknown key" in refusal(v, issuer.token(ps))


def test_a_kid_less_token_needs_exactly_one_fitting_key(tmp_path: Path) -> None:
    one = Issuer([SigningKey.rsa("only")])
    v = verifier(tmp_path, one)
    import jwt

    token = jwt.encode(one.claims(trust=0, groups=[]), one.keys[0].private, algorithm="RS256")
    assert accept(v, token).agent == "a1"
    two = Issuer([SigningKey.rsa("k1"), SigningKey.rsa("k2")])
    v2 = verifier(tmp_path, two)
    token2 = jwt.encode(two.claims(trust=0, groups=[]), two.keys[0].private, algorithm="RS256")
    assert "without kid" in refusal(v2, token2)


def test_short_rsa_keys_are_refused(tmp_path: Path) -> None:
    weak = Issuer([SigningKey.rsa("weak", bits=1024)])
    v = verifier(tmp_path, weak)
    with pytest.warns(Warning, match="1024 bits"):  # PyJWT warns when signing with it; memwarden refuses to verify
        token = weak.token()
    assert "InvalidKeyError" in refusal(v, token)


def test_a_rotated_in_key_of_the_jwks_file_is_picked_up(tmp_path: Path) -> None:
    iss = Issuer([SigningKey.rsa("old")])
    v = verifier(tmp_path, iss)
    new = SigningKey.rsa("new")
    assert "unknown key" in refusal(v, iss.token(new, trust=0, groups=[]))
    iss.keys.append(new)
    (tmp_path / "jwks.json").write_text(json.dumps(iss.jwks()))
    assert accept(v, iss.token(new, trust=0, groups=[])).agent == "a1"
    iss.keys.remove(new)  # and removed again: a read of the file (the unknown kid) drops it
    (tmp_path / "jwks.json").write_text(json.dumps(iss.jwks()) + " ")
    v.jwks.refresh_s = 0.0
    assert "unknown key" in refusal(v, iss.token(new, trust=0, groups=[]))


def test_unknown_kids_are_fetched_at_most_once_per_interval() -> None:
    iss = Issuer([SigningKey.rsa("k1")])
    server = JwksServer(iss)
    try:
        jwks = JwksSource(("RS256",), url=server.url, min_interval_s=3600)
        v = JwtVerifier(ISSUER, AUDIENCE, ("RS256",), jwks, CLAIMS)
        assert server.requests == 1  # the start-up fetch
        assert accept(v, iss.token(trust=0, groups=[])).agent == "a1"
        for i in range(5):
            refusal(v, iss.token(SigningKey.rsa(f"made-up-{i}"), trust=0, groups=[]))
        assert server.requests == 2  # one re-fetch for the first unknown kid, none for the others
        jwks.last_attempt = float("-inf")  # the interval over: a rotated-in key is found
        new = SigningKey.rsa("k2")
        iss.keys.append(new)
        assert accept(v, iss.token(new, trust=0, groups=[])).agent == "a1" and server.requests == 3
    finally:
        server.close()


def test_parse_jwks_keeps_signature_keys_of_allowed_algorithms_only() -> None:
    rsa_k, ec_k = SigningKey.rsa("r"), SigningKey.ec("e")
    doc = {"keys": [rsa_k.jwk(with_alg=False), ec_k.jwk(), {**SigningKey.rsa("enc").jwk(), "use": "enc"},
                    {"kty": "oct", "k": "c2VjcmV0", "kid": "hs"}, {"kty": "RSA", "kid": "broken", "n": "x"}, "junk"]}
    keys = parse_jwks(doc, ("RS256", "PS256", "ES256"))
    assert set(keys) == {("r", "RS256"), ("r", "PS256"), ("e", "ES256")}
    with pytest.raises(ValueError):
        parse_jwks({"nokeys": []}, ("RS256",))


def test_algorithms_none_and_hs_are_never_configurable() -> None:
    assert check_algorithms("RS256, ES256") == ("RS256", "ES256")
    for bad, says in (("none", "never"), ("RS256,HS256", "shared secret"), ("hs512", "shared secret"), ("XX1", "unknown"), ("", "at least")):
        with pytest.raises(ValueError, match=says):
            check_algorithms(bad)


def test_a_jwks_file_without_a_usable_key_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "jwks.json"
    f.write_text(json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}))
    with pytest.raises(JwtConfigError, match="no key usable"):
        JwksSource(("RS256",), file=f)
    f.write_text("{not json")
    with pytest.raises(JwtConfigError, match="JSONDecodeError"):
        JwksSource(("RS256",), file=f)


def test_jwt_settings_that_can_verify_a_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    f = tmp_path / "jwks.json"
    base = dict(jwt_issuer=ISSUER, jwt_audience=AUDIENCE, jwt_jwks_file=f)
    s = load_settings(**base, jwt_claims={"tenant": "org", "fleet": "team", "agent": "sub", "roles": "groups"})
    assert s.jwt_claims["roles"] == "groups" and s.jwt_leeway_s == 30.0
    for kw, says in ((dict(jwt_audience=AUDIENCE), "needs MEMWARDEN_JWT_ISSUER"),
                     (dict(jwt_issuer=ISSUER, jwt_jwks_file=f), "JWT_AUDIENCE"),
                     (dict(jwt_issuer=ISSUER, jwt_audience=AUDIENCE), "exactly one"),
                     (dict(**base, jwt_jwks_url="http://127.0.0.1:1/j"), "exactly one"),
                     (dict(**base, jwt_algorithms="RS256,HS256"), "shared secret"),
                     (dict(**base, jwt_algorithms="none"), "never"),
                     (dict(**base, jwt_claims={"tenant": "org", "fleet": "team"}), "missing: agent"),
                     (dict(**base, jwt_claims={"tenant": "o", "fleet": "t", "agent": "s", "kind": "k"}), "unknown: kind"),
                     (dict(**base, jwt_claims={"tenant": "o.", "fleet": "t", "agent": "s"}), "non-empty"),
                     (dict(**base, jwt_leeway_s=3600), "leeway")):
        with pytest.raises(ConfigError, match=says):
            load_settings(**kw)
    monkeypatch.setenv("MEMWARDEN_JWT_CLAIMS", '{"tenant":"org","fleet":"team","agent":"sub","trust":"trust"}')
    assert load_settings(**base).jwt_claims["trust"] == "trust"


def test_looks_like_jwt_tells_tokens_from_api_keys() -> None:
    assert looks_like_jwt("eyJhbGciOiJub25lIn0.eyJ4IjoxfQ.")  # alg none: still a JWT, refused as one
    assert looks_like_jwt("a.b.c")
    assert not looks_like_jwt("mwk_0123456789abcdef.c2VjcmV0LXNlY3JldA")
    assert not looks_like_jwt("a.b.c.d") and not looks_like_jwt("a..c") and not looks_like_jwt("a.b=.c")


class _Authz:
    """An `Authorizer` stand-in: one known API key."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def authenticate(self, ex: Exchange, key: str) -> Principal | None:
        self.asked.append(key)
        return Principal(kind="agent", key_id="k1", tenant="t1", fleet="red", agent="keyed") if key == "mwk_k1.s" else None


def test_identity_picks_one_credential(tmp_path: Path, issuer: Issuer) -> None:
    authz = _Authz()
    ident = Identity(authz, verifier(tmp_path, issuer))  # type: ignore[arg-type]
    ex = Exchange(method="GET", raw_path="/")

    def run(key: str | None, peercert: dict[str, Any] | None = None) -> Principal:
        return asyncio.run(ident.authenticate(ex, key, peercert))

    assert run(issuer.token(trust=1, groups=[])).agent == "a1" and authz.asked == []  # a JWT never reaches the ledger
    assert run("mwk_k1.s").agent == "keyed"
    for key, says in ((None, "missing credential"), ("mwk_k2.s", "unknown or revoked"),
                      (issuer.unsigned(), "algorithm 'none'")):
        with pytest.raises(Unauthorized, match=says):
            run(key)
    no_jwt = Identity(authz, None)  # type: ignore[arg-type]
    with pytest.raises(Unauthorized, match="not accepted here"):
        asyncio.run(no_jwt.authenticate(ex, issuer.token(), None))


def test_a_verified_token_is_answered_from_memory_within_its_bounds(tmp_path: Path, issuer: Issuer,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import time as time_mod

    import jwt

    v = verifier(tmp_path, issuer, cache_ttl_s=60.0)
    calls = []
    real = jwt.decode
    monkeypatch.setattr(jwt, "decode", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    token = issuer.token(exp=int(time_mod.time()) + 120)
    p = accept(v, token)
    assert accept(v, token) == p and len(calls) == 1  # the second from memory
    assert accept(v, issuer.token(exp=int(time_mod.time()) + 120, sub="a2")).agent == "a2" and len(calls) == 2
    # never past the token's exp (no leeway for a cached answer): after it, the token is verified again
    now = time_mod.time()
    monkeypatch.setattr("sidecar.jwtauth.time.time", lambda: now + 121)
    assert accept(v, token) == p and len(calls) == 3  # PyJWT's clock is the real one: still within exp, accepted
    monkeypatch.undo()
    # a JWKS read that replaced the key set drops what was verified under the old one
    v2 = verifier(tmp_path, issuer, cache_ttl_s=60.0)
    counted = []
    monkeypatch.setattr(jwt, "decode", lambda *a, **kw: counted.append(1) or real(*a, **kw))
    accept(v2, token)
    accept(v2, token)
    assert len(counted) == 1
    (tmp_path / "jwks.json").write_text(json.dumps(issuer.jwks()) + "\n")
    asyncio.run(v2.jwks.refresh())
    accept(v2, token)
    assert len(counted) == 2
    # and a refusal is never remembered
    bad = issuer.token(aud="other")
    for _ in range(2):
        refusal(v2, bad)
    assert len(counted) == 4
