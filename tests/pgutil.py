"""PostgreSQL for tests: a fresh database per test session (dropped at the end), a fresh schema per test.

The server is the one on 127.0.0.1:5432 (trust auth), or ``MW_TEST_PG_URL`` (a URL of a
database the test user may ``CREATE DATABASE`` from). `.ci/run` starts the local cluster if it is
down. Nothing here skips: an unreachable server fails the tests that need it.
"""

from __future__ import annotations

import os
import uuid
from typing import Iterator

import psycopg
import pytest

ADMIN_URL = os.environ.get("MW_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def _with_db(url: str, dbname: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{dbname}"


def create_database() -> str:
    """Create ``mw_test_<pid>_<hex>`` and return its URL."""
    name = f"mw_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    return _with_db(ADMIN_URL, name)


def drop_database(url: str) -> None:
    name = url.rpartition("/")[2]
    with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


def fresh_schema() -> str:
    return f"s_{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """URL of a database created for this test session."""
    url = create_database()
    yield url
    drop_database(url)
