"""Stage 2, authenticate, when credentials other than API keys are configured: which credential a request
carries and the principal it names.

A request carries at most one credential. The header credential is ``X-API-Key`` or ``Authorization: Bearer``
(`sidecar.stages.canonicalize.credential`: two different ones are refused, 401). A bearer value of three
dot-separated base64url segments (`looks_like_jwt`) is a JWT, verified by `sidecar.jwtauth.JwtVerifier` when
``JWT_*`` is configured (refused, 401, otherwise); any other value is an API key, looked up in the ledger as
before. A verified client certificate whose identity ``TLS_CLIENT_PRINCIPALS`` maps (`sidecar.tls`) is a
credential too: a request with such a certificate and a header credential is refused (401, ``more than one
credential``) rather than one of them chosen; a certificate that is not mapped authenticates only the
connection, and the request needs a header credential. Every refusal is `Unauthorized` (401, decision-logged
``deny`` / ``not_authenticated``) with a message saying why.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from sidecar.errors import Unauthorized
from sidecar.exchange import Exchange
from sidecar.governance import Principal

if TYPE_CHECKING:
    from sidecar.config import Settings
    from sidecar.jwtauth import JwtVerifier
    from sidecar.stages.authorize import Authorizer
    from sidecar.tls import ServerTls

# A compact JWS: header.payload.signature, base64url without padding (the signature may be empty: ``alg: none``,
# which is then refused by the verifier rather than looked up as an API key). API keys (``mwk_<id>.<secret>``)
# have one dot.
_JWT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*").fullmatch


def looks_like_jwt(token: str) -> bool:
    """Whether a bearer value is a compact JWT (three dot-separated base64url segments) rather than an API key."""
    return token.count(".") == 2 and _JWT(token) is not None


class Identity:
    """Authenticates a request by API key, bearer JWT or mapped client certificate (module docstring).
    `jwt`: the verifier, or None (JWTs refused); `tls`: the listener's TLS state, whose ``client_principals``
    (read at each request: reloaded on SIGHUP) maps certificates, or None."""

    def __init__(self, authz: "Authorizer", jwt: "JwtVerifier | None" = None, tls: "ServerTls | None" = None) -> None:
        self.authz = authz
        self.jwt = jwt
        self.tls = tls

    @classmethod
    def from_settings(cls, settings: "Settings", authz: "Authorizer", tls: "ServerTls | None") -> "Identity | None":
        """The identity stage the settings ask for; None when API keys are the only credential (no JWT settings, no
        client-certificate map), so the pipeline keeps its API-key path. Raises `sidecar.jwtauth.JwtConfigError`
        for JWT settings that cannot be used."""
        jwt = None
        if settings.jwt_issuer:
            from sidecar.jwtauth import JwtVerifier

            jwt = JwtVerifier.from_settings(settings)
        if jwt is None and (tls is None or tls.principals_path is None):
            return None
        return cls(authz, jwt, tls)

    async def authenticate(self, ex: Exchange, key: str | None, peercert: dict[str, Any] | None) -> Principal:
        """The principal of the request's one credential: `key` (the header credential, or None) or the verified
        client certificate `peercert` (``getpeercert()``'s dict; None or empty: none). Raises `Unauthorized` (401)
        naming what is wrong, `LedgerUnavailable` (503) when an API key cannot be looked up."""
        cert_principal = None
        if peercert and self.tls is not None and self.tls.client_principals is not None:
            cert_principal = self.tls.client_principals.principal(peercert)
        if key is None:
            if cert_principal is None:
                raise Unauthorized("missing credential (an API key, a bearer JWT or a mapped client certificate)")
            return cert_principal
        if cert_principal is not None:
            raise Unauthorized("more than one credential (a mapped client certificate and an API key or token)")
        if looks_like_jwt(key):
            if self.jwt is None:
                raise Unauthorized("bearer JWTs are not accepted here (no MEMWARDEN_JWT_* configured)")
            return await self.jwt.principal(key)
        principal = await self.authz.authenticate(ex, key)
        if principal is None:
            raise Unauthorized("unknown or revoked API key")
        return principal
