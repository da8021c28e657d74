"""The stateful machines use the session's real servers (`tests.servers`: `chroma run`, our Mem0 REST test server
and `memwarden serve` in front of each), registered for every directory by tests/conftest.py."""
