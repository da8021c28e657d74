"""Inbound TLS of ``memwarden serve``: the listener's `ssl.SSLContext`, its certificate reloaded without a
restart, and client certificates (mTLS) as credentials.

`ServerTls(cert, key, client_ca=None, client_auth="required", principals=None)` builds one context (Python's
``ssl.create_default_context(Purpose.CLIENT_AUTH)``: TLS 1.2 at least, OpenSSL's default cipher list without
the weak ones, no compression, no renegotiation) and keeps it for the life of the process: uvicorn is handed
that object (``uvicorn.Config(ssl_context_factory=...)``), so a certificate chain loaded into it later
(``SSLContext.load_cert_chain`` on the live context) is what the next handshake presents, while connections
already open keep the certificate they were made with.

`ServerTls.reload` (on SIGHUP, and every ``TLS_RELOAD_INTERVAL_S`` when the files' size, inode or modification
time changed) reads the certificate and key once, checks them on a scratch context and only then loads them
into the live one, from the same bytes: a half-written pair, a key that does not match, an unreadable file
leaves the certificate in use unchanged (logged ``tls_reload_failed``), never a context with no certificate.
The client CA bundle is read at start-up only (OpenSSL can add trusted CAs to a live context, not remove
them); a changed bundle needs a restart.

With a client CA (``TLS_CLIENT_CA``) the listener asks for a client certificate and verifies it against that
bundle alone (never the system's CAs). ``TLS_CLIENT_AUTH=required`` fails the handshake of a client without a
verified certificate; ``optional`` accepts it (it then needs an API key or a JWT). A verified certificate is
a credential when `ClientPrincipals` (``TLS_CLIENT_PRINCIPALS``, a TOML file) maps its identity
(`peer_identity`: its SPIFFE URI SAN, else ``CN=<subject common name>``) to an agent.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import ssl
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import structlog

from sidecar.governance import Principal

log = structlog.get_logger("memwarden.tls")

_SPIFFE = "spiffe://"
_PRINCIPAL_FIELDS = frozenset({"tenant", "fleet", "agent", "trust", "roles"})


class TlsConfigError(ValueError):
    """A certificate, key, CA bundle or client-principal file that cannot be used; the message names the file
    and never includes key material."""


def peer_identity(peercert: dict[str, Any] | None) -> str | None:
    """The identity of a verified client certificate, as ``ssl.SSLSocket.getpeercert()`` returns it (a dict;
    empty or None when the client sent none or it was not verified): its SPIFFE ID (the one URI SAN starting
    ``spiffe://``, SPIFFE X.509-SVID), else ``CN=<common name>`` when the subject has exactly one common name.
    None when there is no certificate, more than one SPIFFE ID, or neither a SPIFFE ID nor a single CN."""
    if not peercert:
        return None
    spiffe = [v for t, v in peercert.get("subjectAltName", ()) if t == "URI" and isinstance(v, str) and v.startswith(_SPIFFE)]
    if spiffe:
        return spiffe[0] if len(spiffe) == 1 else None
    names = [v for rdn in peercert.get("subject", ()) for k, v in rdn if k == "commonName"]
    return f"CN={names[0]}" if len(names) == 1 else None


@dataclass(frozen=True)
class ClientPrincipals:
    """Client-certificate identities mapped to agent principals, read from a TOML file whose tables are named
    by the identity (`peer_identity`) and hold ``tenant``, ``fleet``, ``agent`` (strings), ``trust`` (0-3,
    default 0) and ``roles`` (a list of role names, default none)::

        ["spiffe://example.org/ns/prod/sa/agent-a1"]
        tenant = "t1"
        fleet = "red"
        agent = "a1"
        trust = 1
        roles = ["triage"]

        ["CN=batch-indexer"]
        tenant = "t1"
        fleet = "ops"
        agent = "indexer"

    A principal made from one has key id ``cert:<identity>``."""

    by_identity: dict[str, Principal]

    @classmethod
    def load(cls, path: Path) -> "ClientPrincipals":
        """Read and check `path`. Raises `TlsConfigError` naming the file and the first bad entry."""
        from sidecar.ledger.base import check_key_request

        try:
            doc = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise TlsConfigError(f"{path}: {type(exc).__name__}: {exc}") from None
        out: dict[str, Principal] = {}
        for identity, entry in doc.items():
            where = f"{path} [{identity!r}]"
            if not (identity.startswith(_SPIFFE) and len(identity) > len(_SPIFFE)) and not (
                    identity.startswith("CN=") and len(identity) > 3):
                raise TlsConfigError(f"{where}: an identity is 'spiffe://...' or 'CN=<common name>'")
            if not isinstance(entry, dict):
                raise TlsConfigError(f"{where}: a table with tenant, fleet, agent (trust, roles optional)")
            unknown = set(entry) - _PRINCIPAL_FIELDS
            if unknown:
                raise TlsConfigError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
            tenant, fleet, agent = entry.get("tenant"), entry.get("fleet"), entry.get("agent")
            trust, roles = entry.get("trust", 0), entry.get("roles", [])
            if not isinstance(tenant, str) or not isinstance(fleet, str) or not isinstance(agent, str) \
                    or type(trust) is not int or not isinstance(roles, list):
                raise TlsConfigError(f"{where}: tenant, fleet, agent are strings, trust an integer, roles a list")
            try:
                roles_t = check_key_request("agent", tenant, fleet, agent, trust, roles)
            except ValueError as exc:
                raise TlsConfigError(f"{where}: {exc}") from None
            out[identity] = Principal(kind="agent", key_id=f"cert:{identity}", tenant=tenant, fleet=fleet, agent=agent,
                                      trust=trust, roles=roles_t)
        return cls(out)

    def principal(self, peercert: dict[str, Any] | None) -> Principal | None:
        """The principal of a verified client certificate, or None when it is not mapped (or there is none)."""
        identity = peer_identity(peercert)
        return None if identity is None else self.by_identity.get(identity)


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)  # follows symlinks: a Kubernetes Secret update swaps the ..data link
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class ServerTls:
    """The listener's TLS state (module docstring). Raises `TlsConfigError` at construction when the
    certificate, key, CA bundle or principal file cannot be used."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None,
                 client_auth: Literal["required", "optional"] = "required", principals: Path | None = None) -> None:
        self.cert, self.key, self.client_ca, self.principals_path = Path(cert), Path(key), client_ca, principals
        try:
            if client_ca is not None:
                # cafile given: only this bundle is trusted for client certificates (no system CAs are loaded)
                ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(client_ca))
                ctx.verify_mode = ssl.CERT_REQUIRED if client_auth == "required" else ssl.CERT_OPTIONAL
            else:
                ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                ctx.verify_mode = ssl.CERT_NONE
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(f"client CA bundle {client_ca}: {type(exc).__name__}: {exc}") from None
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        self.context = ctx
        self.loaded: str | None = None  # sha256 of the certificate and key in force
        self.reloads = 0  # pairs loaded after the first
        self.failures = 0  # reloads refused (the previous pair kept)
        self._seen = self._files_state()
        error = self._load()
        if error is not None:
            raise TlsConfigError(error)
        self.client_principals: ClientPrincipals | None = None
        self._principals_seen: tuple[int, int, int] | None = None
        if principals is not None:
            self._principals_seen = _stat(principals)
            self.client_principals = ClientPrincipals.load(principals)

    def _load(self) -> str | None:
        """Load the certificate and key files into the live context if they differ from those in force; None
        when done (or nothing changed), else why not (the context keeps its chain)."""
        try:
            cert_pem, key_pem = self.cert.read_bytes(), self.key.read_bytes()
        except OSError as exc:
            return f"{type(exc).__name__} reading {exc.filename}: {exc.strerror}"
        digest = hashlib.sha256(cert_pem + b"\0" + key_pem).hexdigest()
        if digest == self.loaded:
            return None
        # `load_cert_chain` reads files only: a private copy of the bytes just read, so the check and the load
        # see the same pair even while the originals are being rewritten.
        with tempfile.TemporaryDirectory(prefix="memwarden-tls-") as tmp:
            cert_f, key_f = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            cert_f.write_bytes(cert_pem)
            fd = os.open(key_f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(key_pem)
            try:
                ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_f, key_f)  # the check: nothing live
                self.context.load_cert_chain(cert_f, key_f)
            except (ssl.SSLError, OSError, ValueError) as exc:
                return (f"certificate {self.cert} / key {self.key}: {type(exc).__name__}: "
                        f"{getattr(exc, 'reason', None) or exc}")
        first = self.loaded is None
        self.loaded = digest
        if not first:
            self.reloads += 1
        return None

    def _files_state(self) -> tuple[Any, ...]:
        return (_stat(self.cert), _stat(self.key))

    def reload(self, force: bool = False) -> bool:
        """Load the certificate and key again if the files changed since the last look (always, with `force`:
        SIGHUP), and the client-principal file if it changed. True when a new certificate is now served. A
        pair that cannot be used is logged (``tls_reload_failed``) and counted; the one in force stays."""
        changed = False
        state = self._files_state()
        if force or state != self._seen:
            self._seen = state
            before = self.loaded
            error = self._load()
            if error is not None:
                self.failures += 1
                log.warning("tls_reload_failed", error=error, kept_sha256=(self.loaded or "")[:16])
            elif self.loaded != before:
                changed = True
                log.info("tls_certificate_reloaded", cert=str(self.cert), sha256=(self.loaded or "")[:16])
        if self.principals_path is not None:
            seen = _stat(self.principals_path)
            if force or seen != self._principals_seen:
                self._principals_seen = seen
                try:
                    self.client_principals = ClientPrincipals.load(self.principals_path)
                    log.info("tls_client_principals_reloaded", path=str(self.principals_path),
                             identities=len(self.client_principals.by_identity))
                except TlsConfigError as exc:
                    self.failures += 1
                    log.warning("tls_client_principals_reload_failed", error=str(exc))
        return changed

    async def watch(self, interval_s: float) -> None:
        """Every `interval_s` seconds, `reload` (a stat of each file; a read only when one changed)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.reload()
            except Exception as exc:  # noqa: BLE001 - never let the watcher die; the chain in force stays
                log.warning("tls_reload_failed", error=type(exc).__name__)

    def describe(self) -> str:
        """One line for the start-up banner: certificate file and digest, client verification."""
        mtls = "off" if self.client_ca is None else (
            f"{'required' if self.context.verify_mode == ssl.CERT_REQUIRED else 'optional'} (CA {self.client_ca}"
            + (f", {len(self.client_principals.by_identity)} mapped identities" if self.client_principals else "") + ")")
        return f"{self.cert} sha256 {(self.loaded or '')[:16]}; TLS >= 1.2; client certificates {mtls}"
