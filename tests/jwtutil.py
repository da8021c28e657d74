"""A local token issuer for tests: signing keys made with `cryptography`, their JWKS, tokens signed with PyJWT, and
the hostile tokens an attacker would send (``alg: none``, HS256 keyed with the issuer's public key, a tampered
payload) made by hand. Optionally serves its JWKS over HTTP on 127.0.0.1 (`JwksServer`)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

ISSUER = "https://idp.test.example"
AUDIENCE = "memwarden"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


@dataclass
class SigningKey:
    kid: str
    alg: str
    private: Any

    @classmethod
    def rsa(cls, kid: str, alg: str = "RS256", bits: int = 2048) -> "SigningKey":
        return cls(kid, alg, rsa.generate_private_key(public_exponent=65537, key_size=bits))

    @classmethod
    def ec(cls, kid: str) -> "SigningKey":
        return cls(kid, "ES256", ec.generate_private_key(ec.SECP256R1()))

    def jwk(self, with_alg: bool = True) -> dict[str, Any]:
        algo = jwt.algorithms.RSAAlgorithm if self.alg.startswith(("RS", "PS")) else jwt.algorithms.ECAlgorithm
        out: dict[str, Any] = json.loads(algo.to_jwk(self.private.public_key()))
        out.update({"kid": self.kid, "use": "sig"})
        if with_alg:
            out["alg"] = self.alg
        return out

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo)


@dataclass
class Issuer:
    keys: list[SigningKey] = field(default_factory=list)
    issuer: str = ISSUER
    audience: str = AUDIENCE

    def jwks(self) -> dict[str, Any]:
        return {"keys": [k.jwk() for k in self.keys]}

    def claims(self, **overrides: Any) -> dict[str, Any]:
        now = int(time.time())
        base: dict[str, Any] = {"iss": self.issuer, "aud": self.audience, "iat": now, "exp": now + 300,
                                "sub": "a1", "tenant": "t1", "fleet": "red", "trust": 1, "groups": []}
        base.update(overrides)
        return {k: v for k, v in base.items() if v is not None}

    def token(self, key: SigningKey | None = None, headers: dict[str, Any] | None = None, **claims: Any) -> str:
        key = key or self.keys[0]
        return jwt.encode(self.claims(**claims), key.private, algorithm=key.alg,
                          headers={"kid": key.kid, **(headers or {})})

    def unsigned(self, **claims: Any) -> str:
        """``alg: none`` (RFC 7519 §6): no signature at all."""
        head = b64url(json.dumps({"alg": "none", "typ": "JWT"}).encode())
        return f"{head}.{b64url(json.dumps(self.claims(**claims)).encode())}."

    def hs256_with_public_key(self, key: SigningKey | None = None, **claims: Any) -> str:
        """Algorithm confusion: HS256 keyed with the issuer's public key (PEM), which a verifier that lets the token
        pick the algorithm would accept."""
        key = key or self.keys[0]
        head = b64url(json.dumps({"alg": "HS256", "typ": "JWT", "kid": key.kid}).encode())
        body = b64url(json.dumps(self.claims(**claims)).encode())
        sig = hmac.new(key.public_pem(), f"{head}.{body}".encode(), hashlib.sha256).digest()
        return f"{head}.{body}.{b64url(sig)}"

    def tampered(self, **changes: Any) -> str:
        """A valid token whose payload was then changed (the signature is the original one)."""
        head, _, sig = self.token().split(".")
        return f"{head}.{b64url(json.dumps(self.claims(**changes)).encode())}.{sig}"


class JwksServer:
    """The issuer's JWKS at ``http://127.0.0.1:<port>/jwks.json`` (a thread), answering what `issuer.jwks()` is
    at each request and counting the requests."""

    def __init__(self, issuer: Issuer) -> None:
        self.issuer = issuer
        self.requests = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.requests += 1
                body = json.dumps(outer.issuer.jwks()).encode()
                self.send_response(200 if self.path == "/jwks.json" else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/jwks.json"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
