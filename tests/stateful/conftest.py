"""The stateful machines reuse the integration fixtures (real `chroma run`, our Mem0 REST test server and
`memwarden serve` in front of each).

Fixtures defined under tests/integration are only visible there, so they are imported here. When
tests/integration and tests/stateful run in one session, pytest treats these as separate fixture
definitions: each directory gets its own session-scoped servers.
"""

from tests.integration.conftest import chroma_server, stack  # noqa: F401
from tests.integration.mem0.conftest import mem0_server, mem0_stack  # noqa: F401
