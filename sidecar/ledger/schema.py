"""The ledger's schema, one text for both dialects (`migrations`): each entry migrates from version i to i+1 and
is applied in order at open. A time column (UTC µs) is the dialect's `Dialect.time_type` (SQLite INTEGER,
PostgreSQL BIGINT); version 3 (operator keys) is the one migration each dialect writes its own way (SQLite cannot
drop a NOT NULL constraint and rebuilds the table), and PostgreSQL's version 1 has one more index.
"""

from __future__ import annotations

from sidecar.ledger.dialect import Dialect


def _v1(t: str, extra: str) -> str:
    return f"""
    CREATE TABLE api_keys (
        key_id TEXT PRIMARY KEY, salt TEXT NOT NULL, hash TEXT NOT NULL, kind TEXT NOT NULL,
        tenant TEXT NOT NULL, fleet TEXT, agent TEXT, trust INTEGER NOT NULL,
        created_at {t} NOT NULL, revoked_at {t}
    );
    CREATE TABLE agents (
        agent_uid TEXT PRIMARY KEY, tenant TEXT NOT NULL, fleet TEXT NOT NULL, agent TEXT NOT NULL,
        trust INTEGER NOT NULL, roles TEXT NOT NULL DEFAULT '[]'
    );
    CREATE TABLE collections (
        backend TEXT NOT NULL, collection_id TEXT NOT NULL, tenant TEXT NOT NULL, database TEXT NOT NULL,
        name TEXT NOT NULL, created_by TEXT NOT NULL, created_at {t} NOT NULL, deleted_at {t},
        PRIMARY KEY (backend, collection_id)
    );
    CREATE TABLE rows (
        backend TEXT NOT NULL, collection_id TEXT NOT NULL, row_id TEXT NOT NULL,
        tenant TEXT NOT NULL, fleet TEXT NOT NULL, owner TEXT NOT NULL, scope TEXT NOT NULL,
        readers TEXT NOT NULL, labels TEXT NOT NULL, status TEXT NOT NULL, writer TEXT NOT NULL,
        created_at {t} NOT NULL, updated_at {t} NOT NULL, request_id TEXT NOT NULL,
        subject TEXT, predicate TEXT, object TEXT, extra TEXT NOT NULL DEFAULT '{{}}',
        PRIMARY KEY (backend, collection_id, row_id)
    );
    CREATE TABLE tombstones (
        backend TEXT NOT NULL, collection_id TEXT NOT NULL, row_id TEXT NOT NULL,
        deleted_at {t} NOT NULL, deleted_by TEXT NOT NULL, request_id TEXT NOT NULL,
        backend_deleted_at {t},
        PRIMARY KEY (backend, collection_id, row_id)
    );
    CREATE INDEX tombstones_pending ON tombstones (backend) WHERE backend_deleted_at IS NULL;
    {extra}"""


# Version 2: provenance (source, lineage), supersession (one active row per single-valued
# (backend, tenant, subject, predicate), enforced by a partial unique index) and content closure.
def _v2(t: str) -> str:
    return f"""
    ALTER TABLE rows ADD COLUMN source TEXT NOT NULL DEFAULT '';
    ALTER TABLE rows ADD COLUMN single_valued INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE rows ADD COLUMN supersedes_collection TEXT;
    ALTER TABLE rows ADD COLUMN supersedes_id TEXT;
    ALTER TABLE rows ADD COLUMN superseded_by_collection TEXT;
    ALTER TABLE rows ADD COLUMN superseded_by TEXT;
    ALTER TABLE rows ADD COLUMN superseded_at {t};
    ALTER TABLE rows ADD COLUMN content_hmac TEXT;
    CREATE UNIQUE INDEX rows_one_active_fact ON rows (backend, tenant, subject, predicate)
        WHERE status = 'active' AND single_valued = 1;
    CREATE INDEX rows_content ON rows (backend, tenant, content_hmac) WHERE content_hmac IS NOT NULL;
    CREATE TABLE lineage (
        backend TEXT NOT NULL, collection_id TEXT NOT NULL, row_id TEXT NOT NULL,
        parent_collection_id TEXT NOT NULL, parent_row_id TEXT NOT NULL,
        PRIMARY KEY (backend, collection_id, row_id, parent_collection_id, parent_row_id)
    );
    CREATE INDEX lineage_parent ON lineage (backend, parent_collection_id, parent_row_id);
    CREATE TABLE forgotten_content (
        tenant TEXT NOT NULL, content_hmac TEXT NOT NULL, deleted_at {t} NOT NULL,
        PRIMARY KEY (tenant, content_hmac)
    );
    CREATE TABLE ledger_secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


# Version 4: supersession per visibility partition (governance.fact_partition): one active single-valued
# row per (backend, tenant, collection, partition, subject, predicate) instead of per tenant. Existing rows
# get their partition from scope, owner, fleet and readers; the tenant-wide unique index is replaced.
def _v4(readers_sorted: str) -> str:
    return f"""
    ALTER TABLE rows ADD COLUMN fact_partition TEXT;
    UPDATE rows SET fact_partition = CASE scope
        WHEN 'agent' THEN 'agent:' || owner
        WHEN 'fleet' THEN 'fleet:' || tenant || '/' || fleet
        WHEN 'tenant' THEN 'tenant'
        ELSE 'restricted:' || owner || '|' || COALESCE({readers_sorted}, '') END
        WHERE single_valued = 1;
    DROP INDEX rows_one_active_fact;
    CREATE UNIQUE INDEX rows_one_active_fact ON rows (backend, tenant, collection_id, fact_partition, subject, predicate)
        WHERE status = 'active' AND single_valued = 1;
"""


# Version 5: roles of agent keys (``Agent.roles``, `memwarden keys create --role`), a sorted JSON list per
# key; existing keys have none. The agents table already had the column (its roles follow the newest key).
_V5_ROLES = """
    ALTER TABLE api_keys ADD COLUMN roles TEXT NOT NULL DEFAULT '[]';
"""
# Version 6: adopted rows (`memwarden adopt`). A backend that lists rows by its own entity ids (Mem0's
# agent_id/user_id/run_id) keeps, per tenant, the ids under which that tenant's adopted rows are found.
_V6_LISTING_KEYS = """
    CREATE TABLE listing_keys (
        backend TEXT NOT NULL, collection_id TEXT NOT NULL, tenant TEXT NOT NULL, field TEXT NOT NULL, value TEXT NOT NULL,
        PRIMARY KEY (backend, collection_id, tenant, field, value)
    );
"""


# Version 7: collection creates in flight (`CollectionIntent`): recorded before the backend's create, resolved
# (registered, or dropped) after it, so a crash in between never leaves a collection nobody may open.
def _v7(t: str) -> str:
    return f"""
    CREATE TABLE collection_intents (
        backend TEXT NOT NULL, nonce TEXT NOT NULL, tenant TEXT NOT NULL, database TEXT NOT NULL, name TEXT NOT NULL,
        created_by TEXT NOT NULL, created_at {t} NOT NULL,
        PRIMARY KEY (backend, nonce)
    );
    CREATE INDEX collection_intents_name ON collection_intents (backend, tenant, database, name);
"""


# Version 8: the rows the visibility filter admits in a collection (`visible_row_ids`), found per scope — tenant
# rows, an owner's agent rows, a fleet's fleet rows, restricted rows — instead of by reading every row of the
# collection. One partial index per scope (together about the size of one index on rows), each holding what the
# statement reads but readers, so only restricted rows are read from the table; and no index another scope's
# branch could pick by mistake when the planner has no statistics yet.
_V8_VISIBILITY = """
    CREATE INDEX rows_visible_tenant ON rows (backend, collection_id, tenant, status, row_id) WHERE scope = 'tenant';
    CREATE INDEX rows_visible_agent ON rows (backend, collection_id, owner, tenant, status, row_id) WHERE scope = 'agent';
    CREATE INDEX rows_visible_fleet ON rows (backend, collection_id, fleet, tenant, status, row_id) WHERE scope = 'fleet';
    CREATE INDEX rows_visible_restricted ON rows (backend, collection_id, tenant, status, row_id) WHERE scope = 'restricted';
"""


# Version 9: per-row update markers (`begin_update`: one update of a row at a time) and the governance each version
# of a row was written under (`row_versions`: Mem0's history entries are each served under their own). Existing Mem0
# rows get a ``baseline`` version, the governance they have now, which matches none of their past history events
# (what those were written under is not known, so they are served only where every known governance allows).
def _v9(t: str) -> str:
    return f"""
    CREATE TABLE row_updates (
        backend TEXT NOT NULL, collection_id TEXT NOT NULL, row_id TEXT NOT NULL,
        request_id TEXT NOT NULL, started_at {t} NOT NULL,
        PRIMARY KEY (backend, collection_id, row_id)
    );
    CREATE TABLE row_versions (
        backend TEXT NOT NULL, collection_id TEXT NOT NULL, row_id TEXT NOT NULL, version INTEGER NOT NULL,
        kind TEXT NOT NULL, event_id TEXT, tenant TEXT NOT NULL, fleet TEXT NOT NULL, owner TEXT NOT NULL,
        scope TEXT NOT NULL, readers TEXT NOT NULL, labels TEXT NOT NULL, written_at {t} NOT NULL,
        request_id TEXT NOT NULL,
        PRIMARY KEY (backend, collection_id, row_id, version)
    );
    INSERT INTO row_versions (backend, collection_id, row_id, version, kind, event_id, tenant, fleet, owner, scope,
                              readers, labels, written_at, request_id)
        SELECT backend, collection_id, row_id, 0, 'baseline', NULL, tenant, fleet, owner, scope, readers, labels,
               updated_at, request_id FROM rows WHERE backend = 'mem0' AND status IN ('active', 'superseded')
"""


# Version 10: API key hygiene (`memwarden keys create --expires-in`, `keys rotate`, `keys list`): when a key stops
# authenticating (NULL: never), when it last authenticated (written at most once a minute per key), and the key a
# rotation replaced it with. Self-contained (three added, nullable columns; nothing rewritten), so it can be
# renumbered when merged after another migration.
def _v10(t: str) -> str:
    return f"""
    ALTER TABLE api_keys ADD COLUMN expires_at {t};
    ALTER TABLE api_keys ADD COLUMN last_used_at {t};
    ALTER TABLE api_keys ADD COLUMN rotated_to TEXT;
"""


def migrations(d: Dialect, *, operator_keys: str, first_extra: str = "") -> list[str]:
    """The migrations of dialect `d`, version 1 first: `operator_keys` is the dialect's version 3 (operator keys:
    kind ``operator``, no tenant), `first_extra` statements appended to version 1."""
    t = d.time_type
    return [_v1(t, first_extra), _v2(t), operator_keys, _v4(d.readers_sorted), _V5_ROLES, _V6_LISTING_KEYS, _v7(t),
            _V8_VISIBILITY, _v9(t), _v10(t)]
