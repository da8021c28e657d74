"""Configuration: one frozen `Settings` object, from the environment (prefix ``MEMWARDEN_``), a .env
file in the working directory (its ``MEMWARDEN_*`` keys only: other keys there, e.g. ``OPENAI_API_KEY``,
belong to other programs and are ignored), or a TOML config file named by ``MEMWARDEN_CONFIG_FILE`` (keys
= option names in lower case). Precedence: constructor arguments > environment > .env > config file >
defaults.

`load_settings` is how the command line builds them: an unknown ``MEMWARDEN_*`` variable (environment or
.env), an unknown config-file key or a bad value raises `ConfigError`, whose message is one line naming the
key and, for a key read from .env or the config file, that file (never the value: it may be a credential)."""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any, Literal

from dotenv import dotenv_values
from pydantic import Field, HttpUrl, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource


PACKAGE_DIR = Path(__file__).resolve().parent
DOTENV = ".env"  # read from the working directory
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")  # `Settings.log_level`


def default_policies_dir() -> Path:
    """The default policy set, used when ``POLICIES_DIR`` is unset: ``sidecar/default_policies/`` of an
    installed wheel (the build-time copy of the repository's ``policies/``, setup.py), else ``policies/``
    of the source checkout this package is imported from (an editable install). An absolute path."""
    packaged = PACKAGE_DIR / "default_policies"
    if packaged.is_dir():
        return packaged
    return PACKAGE_DIR.parent / "policies"


class Settings(BaseSettings):
    """Every option, its default and unit. Environment variable = ``MEMWARDEN_`` + upper-case name."""

    # .env: only its MEMWARDEN_* keys are read (``dotenv_filtering``, pydantic-settings >= 2.14); an unknown one is
    # refused as an unknown environment variable is.
    model_config = SettingsConfigDict(env_prefix="MEMWARDEN_", env_file=DOTENV, dotenv_filtering="match_prefix",
                                      extra="forbid", frozen=True)

    backend: Literal["chroma", "mem0"] = "chroma"
    mem0_deployment: str = Field(default="default", pattern=r"^[A-Za-z0-9_.-]+$",
                                 description="name of the Mem0 deployment: the ledger collection key of its rows")
    mem0_infer: Literal["confine", "refuse"] = Field(
        default="confine", description="Mem0 adds with infer=true: confine to the caller's own rows, or refuse (400)")
    backend_url: HttpUrl = Field(default=HttpUrl("http://127.0.0.1:8000"), description="base URL of the backend")
    backend_token: str | None = Field(default=None, description="credential the sidecar sends to the backend")
    backend_auth_header: str = Field(
        default="Authorization",
        description="header carrying backend_token; default Authorization (Bearer) for chroma, X-API-Key for mem0")
    backend_timeout_s: float = Field(default=10.0, gt=0, description="per-call backend timeout, seconds")
    update_lease_s: float = Field(
        default=30.0, gt=0, description="an update holds its rows' update markers (one update of a row at a time; "
        "another update of the same row meanwhile is 409) for at most this long, seconds: a marker left by an update "
        "whose process died is taken over after it; an update that outlives it is 409 and writes no governance")
    backend_max_connections: int = Field(default=64, gt=0)
    backend_max_response_bytes: int = Field(
        default=64 * 1024 * 1024, gt=0, description="largest backend answer body accepted, bytes, as received and "
        "once decoded (gzip/deflate are inflated to this size at most); larger: 502")
    backend_ca_bundle: Path | None = Field(
        default=None, description="https:// backend: PEM file of the CA certificates trusted for the backend's "
        "certificate; unset: the system's trust store. The host name is always verified")
    backend_client_cert: Path | None = Field(
        default=None, description="https:// backend: PEM file of the client certificate presented to it (mutual TLS), "
        "with its key unless backend_client_key names the key's file")
    backend_client_key: Path | None = Field(default=None, description="https:// backend: PEM file of backend_client_cert's key")
    ledger_path: Path = Field(default=Path(".memwarden/ledger.db"), description="SQLite ledger file")
    ledger_url: str | None = Field(
        default=None, pattern=r"^postgres(ql)?://",
        description="PostgreSQL ledger URL shared by replicas; when set it replaces ledger_path")
    ledger_schema: str = Field(default="public", pattern=r"^[a-z_][a-z0-9_]{0,62}$", description="PostgreSQL schema of the ledger tables")
    ledger_pool_min: int = Field(default=1, ge=0, description="PostgreSQL pooled connections kept open, per process")
    ledger_pool_max: int = Field(default=10, ge=1, description="PostgreSQL pooled connections at most, per process")
    ledger_timeout_s: float = Field(default=5.0, gt=0, description="seconds to get a pooled/new PostgreSQL connection")
    ledger_off_loop: bool = Field(
        default=True, description="run PostgreSQL ledger calls in a worker thread (sidecar.ledger.offloop) so the event loop "
        "serves other requests meanwhile; false keeps them inline (fewer thread hops: lower latency at one client, "
        "lower throughput under concurrency)")
    ledger_async: bool = Field(
        default=False, description="PostgreSQL: authenticate and the read path's row lookup are awaited on psycopg's "
        "asynchronous pool (no thread hop) instead of following ledger_off_loop; off by default: measured slower here "
        "(psycopg's asyncio waits cost more event-loop time per query than a worker-thread hop)")
    ledger_pg_direct: Literal["on", "off"] = Field(
        default="on", description="PostgreSQL: on = the row read by id runs through psycopg's internals "
        "(sidecar/ledger/pg_direct.py: prepared statements under our own names on the connection's pgconn; measured "
        "-9.2 % of a get's instructions, docs/performance.md), falling back to the public path by itself, logged "
        "once, when the installed psycopg lacks them; off = psycopg's public cursor only (the same rows and errors)")
    ledger_cache_ttl_s: float = Field(
        default=5.0, ge=0, description="API keys (SQLite only), collections and agents are served from memory for at most "
        "this long while the ledger reports no change (sidecar/ledger/cache.py); 0 = no cache")
    ledger_migrate_on_start: bool = Field(
        default=True, description="apply pending ledger migrations at start-up; false: refuse to start on an old schema")
    policies_dir: Path = Field(
        default_factory=default_policies_dir,
        description="directory with *.cedarschema and *.cedar; default: the policy set shipped in the package")
    invariants_dir: Path | None = Field(
        default=None, description="extra invariants (*.cedar) pinned from another source (e.g. a second ConfigMap), "
        "checked with the package's baseline and the policy directory's own invariants/")
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0, description="request body limit, bytes (413 above)")
    max_json_depth: int = Field(default=32, ge=2, le=1000, description="nesting depth of a JSON body at most (400 above)")
    max_filter_clauses: int = Field(default=256, ge=1, description="operators and conditions in one where/filters at most (400 above)")
    max_ids: int = Field(default=10_000, ge=1, description="ids named in one request at most (413 above)")
    max_row_bytes: int = Field(
        default=1024 * 1024, gt=0,
        description="one row of a write at most, bytes (413 above, nothing written): Chroma add/upsert/update, a row's "
        "document, uri and metadata (compact JSON); Mem0 add, each message's content with the metadata, and update, "
        "the text with the metadata (sidecar/rowsize.py); below backend_max_response_bytes")
    # -- connections (sidecar/server.py) ---------------------------------------------------------
    idle_timeout_s: float = Field(default=5.0, gt=0, description="a connection sending nothing for this long between requests is closed, seconds")
    header_timeout_s: float = Field(default=10.0, gt=0, description="request line and headers must arrive within this time, seconds (408)")
    max_head_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024,
                                description="a request line and headers longer than this are answered 431 and the "
                                            "connection closed, bytes")
    body_timeout_s: float = Field(default=30.0, gt=0, description="the whole request body must arrive within this time, seconds (408)")
    max_connections: int = Field(default=512, ge=1, description="open client connections at most; keep below the fd limit (ulimit -n)")
    max_inflight_requests: int = Field(default=256, ge=1, description="requests processed at once at most; more are answered 503")
    max_pipelined_requests: int = Field(
        default=16, ge=1, le=1024, description="requests of one connection begun and not yet answered at most; "
        "beyond, the connection's further bytes are held unparsed and reading stops until answers complete")
    max_unsent_bytes: int = Field(
        default=256 * 1024, ge=4096, le=64 * 1024 * 1024, description="unsent answer bytes queued on one connection "
        "before its answers wait for the client to read and the connection stops reading, bytes")
    write_timeout_s: float = Field(
        default=10.0, gt=0, le=3600, description="a connection whose output stays above max_unsent_bytes, or that "
        "is closing with output unsent, for this long is aborted, seconds")
    shutdown_drain_s: float = Field(
        default=5.0, ge=0, description="on SIGTERM: seconds the sidecar keeps serving, new requests too, while readyz "
        "answers 503, so load balancers take it out of rotation before it stops listening (sidecar/drain.py); 0 = none")
    shutdown_timeout_s: float = Field(
        default=30.0, gt=0, description="after the drain: seconds requests in flight get to finish before they are "
        "cancelled and the process exits")
    # -- TLS and client certificates (sidecar/tls.py) ------------------------------------------
    tls_cert: Path | None = Field(
        default=None, description="PEM certificate chain served on the API port (with tls_key): HTTPS, TLS 1.2 or "
        "later; unset = cleartext HTTP (bind 127.0.0.1 only, or put a TLS-terminating proxy in front)")
    tls_key: Path | None = Field(default=None, description="PEM private key of tls_cert (unencrypted)")
    tls_reload_interval_s: float = Field(
        default=10.0, ge=0, description="seconds between checks of tls_cert/tls_key for a change; a changed pair is "
        "loaded for new connections without a restart (SIGHUP too); 0 = SIGHUP only")
    tls_client_ca: Path | None = Field(
        default=None, description="PEM CA bundle that verifies client certificates (mTLS); only these CAs, never "
        "the system's; read at start-up")
    tls_client_auth: Literal["required", "optional"] = Field(
        default="required", description="with tls_client_ca: a connection without a verified client certificate "
        "fails its handshake (required), or is accepted and must then carry an API key or JWT (optional)")
    tls_client_principals: Path | None = Field(
        default=None, description="TOML file mapping a verified client certificate's SPIFFE URI SAN "
        "(spiffe://...) or subject CN (CN=name) to an agent principal: the certificate is then a credential "
        "(README 'TLS and identity')")
    # -- bearer JWTs (sidecar/jwtauth.py) --------------------------------------------------------
    jwt_issuer: str | None = Field(
        default=None, description="accept bearer JWTs whose iss is exactly this (beside API keys); unset = no JWTs")
    jwt_audience: str | None = Field(default=None, description="the aud a JWT must name (required with jwt_issuer)")
    jwt_jwks_file: Path | None = Field(default=None, description="JWKS (JSON) file of the issuer's public keys; re-read when it changes")
    jwt_jwks_url: HttpUrl | None = Field(
        default=None, description="JWKS URL of the issuer's public keys (instead of jwt_jwks_file), fetched and cached")
    jwt_jwks_ca: Path | None = Field(
        default=None, description="PEM CA bundle that verifies an https jwt_jwks_url (default: the system's trust store)")
    jwt_jwks_refresh_s: float = Field(
        default=300.0, gt=0, description="keys are re-read (file: if changed) or re-fetched (URL, in the background) "
        "when older than this, seconds")
    jwt_jwks_min_interval_s: float = Field(
        default=30.0, ge=0, description="a token naming an unknown kid triggers a JWKS re-read at most once per this "
        "many seconds (a rotation is picked up; a flood of made-up kids is not a flood of fetches)")
    jwt_algorithms: str = Field(
        default="RS256,ES256", pattern=r"^[A-Za-z0-9]+(,[A-Za-z0-9]+)*$",
        description="comma-separated signature algorithms accepted (RS256/384/512, PS256/384/512, ES256/384/512, "
        "EdDSA); 'none' and HS* (shared secrets) are refused")
    jwt_leeway_s: float = Field(default=30.0, ge=0, le=300, description="clock skew allowed on exp and nbf, seconds")
    jwt_claims: dict[str, str] = Field(
        default_factory=lambda: {"tenant": "tenant", "fleet": "fleet", "agent": "sub"},
        description="JSON object (or TOML table): principal attribute -> claim name (a.b for a nested claim); "
        "tenant, fleet, agent required, trust (0-3, default 0) and roles (list or space-separated, default none) "
        "optional; a token lacking a mapped claim is refused")
    jwt_cache_ttl_s: float = Field(
        default=60.0, ge=0, le=3600, description="a verified token sent again is answered from memory for at most this "
        "long (never past its exp, never after the JWKS changed), seconds; 0 = verify every request")
    jwt_max_token_bytes: int = Field(default=8192, ge=256, description="longer bearer JWTs are refused (401) unparsed, bytes")
    pushdown: Literal["scope", "tenant"] = Field(
        default="scope",
        description="visibility filter sent to the backend: the reference scope predicate "
        "(sound when policy-check proves Inv-Scope) or the tenant only",
    )
    deletion_closure: Literal["cascade", "redact"] = Field(
        default="cascade",
        description="rows derived from a deleted row: tombstoned too (cascade) or kept with the link "
        "shown as a redacted placeholder in lineage (redact); copies of the content are always tombstoned",
    )
    chroma_content_keys: str = Field(
        default="data", pattern=r"^[^,\s]*(,[^,\s]+)*$",
        description="Chroma: metadata keys (comma-separated, first non-empty string wins) holding a row's text when "
        "the row has no document — mem0's Memory keeps it in 'data' — compared for the forgotten-content rule and "
        "deletion closure as a document is; '' = documents only")
    reconcile_interval_s: float = Field(default=60.0, ge=0, description="seconds between reconciler runs; 0 = start-up only")
    erase_interval_s: float = Field(
        default=0.0, ge=0, description="Chroma: every this many seconds, when the backend confirmed deletes since the last "
        "purge, run Chroma's vacuum on erase_data_path (its log purge and SQLite VACUUM: sidecar/erase); 0 = no schedule "
        "(`memwarden erase` purges on demand)")
    erase_data_path: Path | None = Field(
        default=None, description="the backend's data directory on this host (Chroma: the directory of `chroma run --path`): "
        "purged by the erase schedule and `memwarden erase`, scanned by `memwarden erase --verify`")
    ledger_analyze_interval_s: float = Field(
        default=60.0, ge=0,
        description="PostgreSQL ledger: seconds between checks for tables with missing or stale planner statistics, "
        "which are then ANALYZEd (autovacuum's rule; also at start-up); 0 = never (leave it to autovacuum)")
    failpoints: str = Field(default="", description="testing only: comma-separated crash points (after-tombstone, activate, update-governance, register-collection)")
    query_plan: Literal["auto", "pushdown", "postfilter-first"] = Field(
        default="auto",
        description="query: choose per request from the ledger's statistics and the last over-fetches (auto), "
        "always AND the visibility filter (pushdown), or always first try one unfiltered over-fetch and refill "
        "under the pushdown only when it holds fewer than n_results readable rows (postfilter-first)",
    )
    overfetch_factor: int = Field(default=2, ge=1, description="query over-fetch multiple of n_results")
    id_pushdown_max: int = Field(
        default=1000, ge=0,
        description="reads under the visibility filter (query pushdown and refill, get without ids, count): when at "
        "most this many rows of the collection are admitted by it, the ledger lists them and the backend gets their "
        "ids instead of the metadata where filter, whose cost grows with everything the backend stores; 0 = always "
        "the where filter")
    id_pushdown_inline_max: int = Field(
        default=64, ge=0,
        description="PostgreSQL: a get without ids or a count under the id list, when the planner's counts say at most "
        "this many rows are admitted: the statement that lists them also reads them (with their owners and the key "
        "re-check), one ledger round trip instead of two; a query always reads the rows the backend returned after it "
        "answered; 0 = always two")
    max_scan_rows: int = Field(default=100_000, gt=0, description="cap on rows scanned for one filtered get/count")
    page_rows: int = Field(default=500, gt=0, description="page size of backend scans, rows")
    log_level: str = Field(
        default="INFO", description="level of the process log (debug, info, warning, error, critical; any case). "
        "It never filters the decision log, which has its own switch (decision_log)")
    metrics_host: str = Field(default="127.0.0.1", description="address of the Prometheus listener (not the API port)")
    metrics_port: int = Field(default=9464, ge=0, le=65535, description="port of the Prometheus listener; 0 = no listener")
    # -- operator features (probes, metrics, reload, shadow mode, decision-log sinks) ------------
    policy_watch_interval_s: float = Field(
        default=2.0, ge=0, description="seconds between checks of policies_dir for changes; 0 = no watching (SIGHUP still reloads)")
    policy_check_timeout_s: float = Field(
        default=120.0, gt=0, description="seconds the policy check may take, at start-up and on a reload")
    shadow_mode: Literal["off", "reads", "all"] = Field(
        default="off", description="dry run: Cedar denials within the tenant are logged and counted as would-deny "
        "instead of enforced — 'reads' (read, list, search: reads are widened to the tenant; writes, updates, "
        "redistributions and deletes stay enforced) or 'all' (every action: denied writes and deletes are carried "
        "out — data a policy protects can be overwritten or destroyed); legacy true = reads, false = off")
    shadow_mode_confirm: str = Field(default="", description="must be 'decisions-are-not-enforced' when shadow_mode is on")
    decision_log: Literal["on", "off"] = Field(
        default="on", description="the decision log (one event per request, the audit trail): on, or off to write "
        "none. Independent of log_level")
    decision_log_sink: Literal["stdout", "file"] = Field(default="stdout", description="where JSON log lines go")
    decision_log_path: Path = Field(default=Path(".memwarden/decisions.jsonl"), description="file sink path")
    decision_log_max_bytes: int = Field(default=100 * 1024 * 1024, gt=0, description="file sink: rotate above this size, bytes")
    decision_log_backups: int = Field(default=5, ge=0, description="file sink: rotated files kept")
    decision_log_mask: str = Field(
        default="", description="comma-separated log fields whose values are replaced by a keyed hash (e.g. principal,row_ids)")
    # -- decision-log shipping to an HTTP collector (sidecar/logship.py), besides the sink above --------
    decision_log_url: HttpUrl | None = Field(
        default=None, description="also POST decision events to this http(s) collector: batched, gzip-compressed, "
        "retried with backoff, from a bounded buffer (docs/decision-log.md 'Shipping to a collector'); unset = no shipping")
    decision_log_format: Literal["ndjson", "json"] = Field(
        default="ndjson", description="shipped body: ndjson (one event per line, application/x-ndjson) or json (one "
        "array, application/json, as OPA ships); gzip-compressed either way")
    decision_log_instance: str = Field(
        default="", max_length=256, description="the 'instance' field of every shipped event; '' = the host name (a pod's name)")
    decision_log_batch_max: int = Field(default=100, ge=1, description="shipping: events per POST at most")
    decision_log_flush_s: float = Field(
        default=5.0, gt=0, description="shipping: a partial batch is sent this many seconds after the previous flush")
    decision_log_buffer_max: int = Field(
        default=10_000, ge=1, description="shipping: events waiting at most (besides the batch being sent); a new "
        "event at a full buffer drops the oldest (counted: memwarden_decision_log_dropped_total{reason=\"buffer_full\"})")
    decision_log_timeout_s: float = Field(default=10.0, gt=0, description="shipping: timeout of one POST, seconds")
    decision_log_retry_base_s: float = Field(
        default=0.5, gt=0, description="shipping: first backoff step after a failed POST, seconds (doubling, jittered)")
    decision_log_retry_max_s: float = Field(default=30.0, gt=0, description="shipping: longest backoff, seconds")
    decision_log_shutdown_s: float = Field(
        default=5.0, ge=0, description="shipping: at shutdown, seconds to send what is buffered; the rest is counted dropped")
    decision_log_headers: dict[str, str] = Field(
        default_factory=dict, description="shipping: JSON object (or TOML table) of extra request headers, e.g. "
        "{\"X-Scope-OrgID\": \"acme\"}; not Content-*/Host; put credentials in decision_log_token_file instead")
    decision_log_token_file: Path | None = Field(
        default=None, description="shipping: file holding a bearer token, sent as Authorization: Bearer; re-read when "
        "it changes (a rotated, mounted token)")
    decision_log_ca_bundle: Path | None = Field(
        default=None, description="https collector: PEM CA bundle trusted for its certificate; unset: the system's trust store")
    decision_log_client_cert: Path | None = Field(
        default=None, description="https collector: PEM client certificate presented to it (mutual TLS), with its key "
        "unless decision_log_client_key names the key's file")
    decision_log_client_key: Path | None = Field(default=None, description="https collector: PEM key of decision_log_client_cert")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = os.environ.get("MEMWARDEN_CONFIG_FILE")
        if not path:
            return init_settings, env_settings, dotenv_settings, file_secret_settings
        if not Path(path).is_file():
            raise ValueError(f"MEMWARDEN_CONFIG_FILE={path}: no such file")
        return init_settings, env_settings, dotenv_settings, TomlConfigSettingsSource(settings_cls, Path(path)), file_secret_settings

    @model_validator(mode="before")
    @classmethod
    def _backend_auth_header_default(cls, data: object) -> object:
        """Mem0's REST server reads its admin key from ``X-API-Key`` and answers 401 to a Bearer token
        (compared against Mem0's own server, README); Chroma's token auth takes ``Authorization: Bearer``."""
        if isinstance(data, dict) and data.get("backend_auth_header") is None and data.get("backend") == "mem0":
            data = {**data, "backend_auth_header": "X-API-Key"}
        return data

    @field_validator("chroma_content_keys")
    @classmethod
    def _content_keys_not_governed(cls, v: str) -> str:
        if any(k.strip().startswith("mw_") for k in v.split(",")):
            raise ValueError("content keys may not be mw_* keys (those are governed metadata)")
        return v

    @model_validator(mode="after")
    def _erase_schedule_runnable(self) -> "Settings":
        """A purge schedule needs what it runs: Chroma (Mem0 offers no purge, sidecar/erase/mem0.py), its data
        directory on this host, and the `chroma` command."""
        if self.erase_interval_s > 0:
            from sidecar.erase import EraseError, chroma

            if self.backend != "chroma":
                raise ValueError("MEMWARDEN_ERASE_INTERVAL_S: Mem0 offers no purge of a deleted memory's history to run on a "
                                 "schedule (see README 'Erasure'); leave it 0")
            if self.erase_data_path is None:
                raise ValueError("MEMWARDEN_ERASE_INTERVAL_S needs MEMWARDEN_ERASE_DATA_PATH (the `chroma run --path` directory)")
            try:
                chroma.check_data_path(self.erase_data_path)
                chroma.cli()
            except EraseError as exc:
                raise ValueError(f"MEMWARDEN_ERASE_INTERVAL_S: {exc}") from None
        return self

    @field_validator("log_level", mode="before")
    @classmethod
    def _known_log_level(cls, v: object) -> object:
        """One of Python logging's five levels, any case, kept in upper case; anything else (``verbose``, a
        number) is refused, so a typo never silently changes what is logged."""
        if isinstance(v, str) and v.strip().upper() in LOG_LEVELS:
            return v.strip().upper()
        raise ValueError(f"unknown log level {str(v)[:40]!r}: use one of {', '.join(LOG_LEVELS).lower()}")

    @field_validator("decision_log", mode="before")
    @classmethod
    def _on_or_off(cls, v: object) -> object:
        if isinstance(v, str) and v.strip().lower() in ("on", "off"):
            return v.strip().lower()
        raise ValueError(f"{str(v)[:40]!r}: use on or off (the decision log is the audit trail: off writes none)")

    @field_validator("ledger_pg_direct", mode="before")
    @classmethod
    def _pg_direct_on_or_off(cls, v: object) -> object:
        if isinstance(v, str) and v.strip().lower() in ("on", "off"):
            return v.strip().lower()
        raise ValueError(f"{str(v)[:40]!r}: use on (psycopg's internals, sidecar/ledger/pg_direct.py) or off "
                         "(psycopg's public cursor only)")

    @field_validator("shadow_mode", mode="before")
    @classmethod
    def _shadow_mode_value(cls, v: object) -> object:
        """``off``, ``reads`` or ``all`` (any case); the legacy booleans: true (1, yes, on) = ``reads``, false
        (0, no, off) = ``off``."""
        if isinstance(v, bool):
            return "reads" if v else "off"
        if isinstance(v, str):
            text = v.strip().lower()
            if text in ("off", "reads", "all"):
                return text
            if text in ("true", "1", "yes", "on"):
                return "reads"
            if text in ("false", "0", "no", ""):
                return "off"
        raise ValueError(f"{str(v)[:40]!r}: use off, reads or all (true means reads)")

    @model_validator(mode="after")
    def _backend_tls_usable(self) -> "Settings":
        """The TLS files are for an ``https://`` backend, and each is there and what it says it is (read now, as
        every connection will: `sidecar.stages.http1.client_tls_context`)."""
        from sidecar.stages.http1 import client_tls_context

        files = {"backend_ca_bundle": self.backend_ca_bundle, "backend_client_cert": self.backend_client_cert,
                 "backend_client_key": self.backend_client_key}
        named = [name for name, path in files.items() if path is not None]
        if not named:
            return self
        if self.backend_url.scheme != "https":
            raise ValueError(f"{env_name(named[0])} is for an https:// backend, but MEMWARDEN_BACKEND_URL is "
                             f"{self.backend_url.scheme}://: use https:// or unset it")
        if self.backend_client_key is not None and self.backend_client_cert is None:
            raise ValueError("MEMWARDEN_BACKEND_CLIENT_KEY needs MEMWARDEN_BACKEND_CLIENT_CERT (the certificate of that key)")
        for name in named:
            if not files[name].is_file():  # type: ignore[union-attr]
                raise ValueError(f"{env_name(name)}={files[name]}: no such file")
        try:
            client_tls_context(self.backend_ca_bundle)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"MEMWARDEN_BACKEND_CA_BUNDLE={self.backend_ca_bundle}: not a PEM file of CA certificates "
                             f"({getattr(exc, 'reason', None) or exc})") from None
        try:
            client_tls_context(self.backend_ca_bundle, self.backend_client_cert, self.backend_client_key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"MEMWARDEN_BACKEND_CLIENT_CERT={self.backend_client_cert}"
                             + (f", MEMWARDEN_BACKEND_CLIENT_KEY={self.backend_client_key}" if self.backend_client_key else "")
                             + f": not a PEM certificate and its key ({getattr(exc, 'reason', None) or exc})") from None
        return self

    @model_validator(mode="after")
    def _row_fits_an_answer(self) -> "Settings":
        """A row must fit in one backend answer, or a read of it alone could never be served."""
        if self.max_row_bytes >= self.backend_max_response_bytes:
            raise ValueError(f"MEMWARDEN_MAX_ROW_BYTES ({self.max_row_bytes}) must be below "
                             f"MEMWARDEN_BACKEND_MAX_RESPONSE_BYTES ({self.backend_max_response_bytes}): a row must fit "
                             "in one backend answer")
        return self

    @model_validator(mode="after")
    def _tls_complete(self) -> "Settings":
        """TLS settings that make sense together: a certificate with its key; client verification only on a TLS
        listener; a certificate-to-principal map only with a CA that verifies the certificates."""
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("MEMWARDEN_TLS_CERT and MEMWARDEN_TLS_KEY go together (a certificate chain and its key)")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("MEMWARDEN_TLS_CLIENT_CA needs MEMWARDEN_TLS_CERT and MEMWARDEN_TLS_KEY (mTLS is TLS)")
        if self.tls_client_principals is not None and self.tls_client_ca is None:
            raise ValueError("MEMWARDEN_TLS_CLIENT_PRINCIPALS needs MEMWARDEN_TLS_CLIENT_CA (only a verified "
                             "client certificate can be a credential)")
        return self

    @model_validator(mode="after")
    def _jwt_complete(self) -> "Settings":
        """JWT settings that can verify a token: an issuer, an audience, exactly one key source, a claims map naming
        tenant, fleet and agent, and only asymmetric signature algorithms (`sidecar.jwtauth.check_algorithms`)."""
        from sidecar.jwtauth import CLAIM_FIELDS, check_algorithms

        others = [n for n in ("jwt_audience", "jwt_jwks_file", "jwt_jwks_url") if getattr(self, n) is not None]
        if self.jwt_issuer is None:
            if others:
                raise ValueError(f"{env_name(others[0])} needs MEMWARDEN_JWT_ISSUER (which turns bearer JWTs on)")
            return self
        if not self.jwt_audience:
            raise ValueError("MEMWARDEN_JWT_ISSUER needs MEMWARDEN_JWT_AUDIENCE (a token for another service is refused)")
        if (self.jwt_jwks_file is None) == (self.jwt_jwks_url is None):
            raise ValueError("MEMWARDEN_JWT_ISSUER needs exactly one of MEMWARDEN_JWT_JWKS_FILE and MEMWARDEN_JWT_JWKS_URL")
        check_algorithms(self.jwt_algorithms)
        unknown = sorted(set(self.jwt_claims) - set(CLAIM_FIELDS))
        missing = [f for f in ("tenant", "fleet", "agent") if f not in self.jwt_claims]
        if unknown or missing:
            raise ValueError(f"MEMWARDEN_JWT_CLAIMS maps {', '.join(CLAIM_FIELDS)} to claim names"
                             + (f"; unknown: {', '.join(unknown)}" if unknown else "")
                             + (f"; missing: {', '.join(missing)}" if missing else ""))
        if any(not c or any(not part for part in c.split(".")) for c in self.jwt_claims.values()):
            raise ValueError("MEMWARDEN_JWT_CLAIMS: a claim name is non-empty (a.b for a nested claim)")
        return self

    @model_validator(mode="after")
    def _decision_log_shipping(self) -> "Settings":
        """Shipping settings that can ship: the other decision_log_* shipping options only with a URL, a batch that
        fits the buffer, TLS files only for an https collector and readable, a token file that is there, no header
        the shipper sets itself (`sidecar.logship.Shipper`)."""
        from sidecar.logship import RESERVED_HEADERS

        optional = ("decision_log_headers", "decision_log_token_file", "decision_log_ca_bundle",
                    "decision_log_client_cert", "decision_log_client_key")
        if self.decision_log_url is None:
            named = [n for n in optional if getattr(self, n)]
            if named:
                raise ValueError(f"{env_name(named[0])} needs MEMWARDEN_DECISION_LOG_URL (the collector to ship to)")
            return self
        if self.decision_log_batch_max > self.decision_log_buffer_max:
            raise ValueError(f"MEMWARDEN_DECISION_LOG_BATCH_MAX ({self.decision_log_batch_max}) must not exceed "
                             f"MEMWARDEN_DECISION_LOG_BUFFER_MAX ({self.decision_log_buffer_max})")
        if self.decision_log_retry_max_s < self.decision_log_retry_base_s:
            raise ValueError("MEMWARDEN_DECISION_LOG_RETRY_MAX_S must be at least MEMWARDEN_DECISION_LOG_RETRY_BASE_S")
        reserved = sorted(h for h in self.decision_log_headers if h.lower() in RESERVED_HEADERS)
        if reserved:
            raise ValueError(f"MEMWARDEN_DECISION_LOG_HEADERS: {', '.join(reserved)} is set by the shipper")
        if any(h.lower() == "authorization" for h in self.decision_log_headers) and self.decision_log_token_file:
            raise ValueError("MEMWARDEN_DECISION_LOG_HEADERS names Authorization and MEMWARDEN_DECISION_LOG_TOKEN_FILE "
                             "is set: use one")
        tls = [n for n in ("decision_log_ca_bundle", "decision_log_client_cert", "decision_log_client_key")
               if getattr(self, n) is not None]
        if tls and self.decision_log_url.scheme != "https":
            raise ValueError(f"{env_name(tls[0])} is for an https:// collector, but MEMWARDEN_DECISION_LOG_URL is "
                             f"{self.decision_log_url.scheme}://")
        if self.decision_log_client_key is not None and self.decision_log_client_cert is None:
            raise ValueError("MEMWARDEN_DECISION_LOG_CLIENT_KEY needs MEMWARDEN_DECISION_LOG_CLIENT_CERT")
        for name in (*tls, "decision_log_token_file"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{env_name(name)}={path}: no such file")
        if tls:
            from sidecar.stages.http1 import client_tls_context

            try:
                client_tls_context(self.decision_log_ca_bundle, self.decision_log_client_cert, self.decision_log_client_key)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"{env_name(tls[0])}: not PEM certificates (and key) ({getattr(exc, 'reason', None) or exc})"
                                 ) from None
        return self

    @model_validator(mode="after")
    def _shadow_is_explicit(self) -> "Settings":
        if self.shadow_mode != "off" and self.shadow_mode_confirm != "decisions-are-not-enforced":
            raise ValueError(f"MEMWARDEN_SHADOW_MODE={self.shadow_mode} is refused unless "
                             "MEMWARDEN_SHADOW_MODE_CONFIRM=decisions-are-not-enforced")
        return self


ENV_PREFIX = "MEMWARDEN_"
# Variables of the MEMWARDEN_ namespace that are no setting but are read before the settings are.
NOT_SETTINGS = frozenset({"MEMWARDEN_CONFIG_FILE"})
# Settings that existed once: named with what replaced them.
REMOVED = {
    "MEMWARDEN_POLICY_RELOAD_CHECK": "removed: every policy set passes the policy check, at start-up and on reload",
}


class ConfigError(ValueError):
    """A configuration the sidecar refuses; the message is one line naming the key."""


def backend_tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context of an ``https://`` backend from ``BACKEND_CA_BUNDLE``, ``BACKEND_CLIENT_CERT`` and
    ``BACKEND_CLIENT_KEY`` (`sidecar.stages.http1.client_tls_context`: certificate and host name verification on;
    the files were checked when the settings were made); None for ``http://``. Used by ``serve`` (the forward
    stage) and ``memwarden adopt``. Raises what `client_tls_context` raises should the files have changed since."""
    if settings.backend_url.scheme != "https":
        return None
    from sidecar.stages.http1 import client_tls_context

    return client_tls_context(settings.backend_ca_bundle, settings.backend_client_cert, settings.backend_client_key)


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def dotenv_keys() -> set[str]:
    """The ``MEMWARDEN_*`` keys (upper case) of the .env file `Settings` reads (python-dotenv, as
    pydantic-settings reads it); empty when there is none or it cannot be read."""
    path = Path(DOTENV)
    try:
        if not path.is_file():
            return set()
        return {k.upper() for k in dotenv_values(path, encoding="utf-8") if k.upper().startswith(ENV_PREFIX)}
    except (OSError, ValueError):
        return set()


def _source(name: str, dotenv: set[str] | frozenset[str]) -> str:
    """`` in <file>`` when setting `name`'s value came from the .env file (set there and not in the
    environment, which takes precedence); else ""."""
    var = env_name(name)
    if var in dotenv and not any(k.upper() == var for k in os.environ):
        return f" in {Path(DOTENV).resolve()}"
    return ""


def _describe(err: Any, dotenv: set[str] | frozenset[str] = frozenset()) -> str:
    loc = ".".join(str(x) for x in err.get("loc", ()))
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        var = env_name(loc)
        if var in dotenv:
            return f"variable {var} in {Path(DOTENV).resolve()}: {REMOVED.get(var, 'not a memwarden setting')}"
        where = os.environ.get("MEMWARDEN_CONFIG_FILE")
        return f"unknown configuration key {loc!r}" + (f" in {where}" if where else "") + " (not a memwarden setting)"
    if not loc:
        return msg
    name = loc.split(".")[0]
    return f"{name} ({env_name(name)}{_source(name, dotenv)}): {msg}"


def unknown_environment(environ: dict[str, str] | None = None) -> list[str]:
    """``MEMWARDEN_*`` variables (any case, as pydantic-settings reads them) that name no setting."""
    env = os.environ if environ is None else environ
    known = {env_name(f) for f in Settings.model_fields} | NOT_SETTINGS
    return sorted(k for k in env if k.upper().startswith(ENV_PREFIX) and k.upper() not in known)


def load_settings(**overrides: Any) -> Settings:
    """`Settings` from the environment, .env and config file, with `overrides` (command-line options).
    Raises `ConfigError` (one line) for an unknown ``MEMWARDEN_*`` variable, an unknown config-file key,
    a missing config file or a bad value."""
    unknown = unknown_environment()
    if unknown:
        name = unknown[0].upper()
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise ConfigError(f"environment variable {unknown[0]}: {REMOVED.get(name, 'not a memwarden setting')}{more}")
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        dotenv = dotenv_keys()
        raise ConfigError("; ".join(_describe(e, dotenv) for e in exc.errors())) from None
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
