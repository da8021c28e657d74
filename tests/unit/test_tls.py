"""sidecar/tls.py without a server: the listener's context (TLS 1.2 at least, client certificates verified by the
configured CA alone), reloads that keep the pair in force when the new one is unusable, the client-certificate
identity (SPIFFE URI SAN, else CN) and its principal map, and the TLS settings that go together."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from sidecar.config import ConfigError, load_settings
from sidecar.tls import ClientPrincipals, ServerTls, TlsConfigError, peer_identity
from tests.tlsutil import CA


@pytest.fixture
def ca(tmp_path: Path) -> CA:
    return CA.make(tmp_path / "ca")


def test_the_context_is_tls_1_2_or_later_without_client_certificates(tmp_path: Path, ca: CA) -> None:
    pair = ca.issue(tmp_path, "s", "s", server=True)
    tls = ServerTls(pair.cert, pair.key)
    assert tls.context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert tls.context.verify_mode == ssl.CERT_NONE
    assert tls.context.options & ssl.OP_NO_COMPRESSION
    assert tls.loaded is not None and "TLS >= 1.2" in tls.describe() and "client certificates off" in tls.describe()


def test_client_certificates_are_verified_by_the_configured_ca_only(tmp_path: Path, ca: CA) -> None:
    pair = ca.issue(tmp_path, "s", "s", server=True)
    required = ServerTls(pair.cert, pair.key, client_ca=ca.path)
    assert required.context.verify_mode == ssl.CERT_REQUIRED
    # the bundle's one CA, and none of the system's (a public CA must not vouch for a client identity)
    assert required.context.cert_store_stats()["x509_ca"] == 1
    assert ServerTls(pair.cert, pair.key, client_ca=ca.path, client_auth="optional").context.verify_mode == ssl.CERT_OPTIONAL


def test_reload_loads_a_new_pair_and_keeps_the_old_one_when_the_new_one_is_unusable(tmp_path: Path, ca: CA) -> None:
    live = ca.issue(tmp_path / "live", "s", "s", server=True)
    tls = ServerTls(live.cert, live.key)
    first = tls.loaded
    assert tls.reload() is False  # nothing changed
    renewed = ca.issue(tmp_path / "next", "s", "s2", server=True)
    live.key.write_bytes(renewed.key.read_bytes())
    live.cert.write_bytes(renewed.cert.read_bytes())
    assert tls.reload() is True and tls.loaded != first and tls.reloads == 1
    second = tls.loaded
    other = ca.issue(tmp_path / "other", "s", "s3", server=True)
    live.key.write_bytes(other.key.read_bytes())  # the certificate's key replaced by another one
    assert tls.reload(force=True) is False and tls.failures == 1 and tls.loaded == second
    live.cert.write_text("not a certificate")
    assert tls.reload() is False and tls.failures == 2 and tls.loaded == second
    live.cert.unlink()
    assert tls.reload() is False and tls.failures == 3 and tls.loaded == second


def test_an_unusable_pair_at_start_up_is_refused_naming_the_files(tmp_path: Path, ca: CA) -> None:
    a, b = ca.issue(tmp_path, "a", "a", server=True), ca.issue(tmp_path, "b", "b", server=True)
    with pytest.raises(TlsConfigError, match="a.pem"):
        ServerTls(a.cert, b.key)
    with pytest.raises(TlsConfigError, match="No such file|FileNotFoundError"):
        ServerTls(tmp_path / "missing.pem", a.key)
    with pytest.raises(TlsConfigError, match="client CA bundle"):
        ServerTls(a.cert, a.key, client_ca=tmp_path / "missing-ca.pem")


def test_peer_identity_is_the_spiffe_id_else_the_common_name() -> None:
    spiffe = {"subject": ((("commonName", "agent-a1"),),),
              "subjectAltName": (("DNS", "x"), ("URI", "spiffe://example.org/ns/p/sa/a1"))}
    assert peer_identity(spiffe) == "spiffe://example.org/ns/p/sa/a1"
    assert peer_identity({"subject": ((("commonName", "agent-a1"),),)}) == "CN=agent-a1"
    assert peer_identity({"subject": ((("commonName", "a"),), (("commonName", "b"),))}) is None  # ambiguous
    two = {"subjectAltName": (("URI", "spiffe://e/a"), ("URI", "spiffe://e/b"))}
    assert peer_identity(two) is None  # an SVID has one SPIFFE ID
    assert peer_identity({"subjectAltName": (("URI", "https://e/a"),), "subject": ()}) is None
    assert peer_identity({}) is None and peer_identity(None) is None


def test_client_principals_map_identities_to_agents(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text('["spiffe://e/ns/p/sa/a1"]\ntenant = "t1"\nfleet = "red"\nagent = "a1"\ntrust = 2\nroles = ["b", "a"]\n'
                 '["CN=idx"]\ntenant = "t1"\nfleet = "ops"\nagent = "idx"\n')
    m = ClientPrincipals.load(f)
    p = m.principal({"subjectAltName": (("URI", "spiffe://e/ns/p/sa/a1"),)})
    assert p is not None and (p.tenant, p.fleet, p.agent, p.trust, p.roles) == ("t1", "red", "a1", 2, ("a", "b"))
    assert p.key_id == "cert:spiffe://e/ns/p/sa/a1" and p.describe() == "Agent::t1/red/a1"
    q = m.principal({"subject": ((("commonName", "idx"),),)})
    assert q is not None and q.trust == 0 and q.roles == ()
    assert m.principal({"subject": ((("commonName", "other"),),)}) is None


@pytest.mark.parametrize("text, problem", [
    ('["agent-a1"]\ntenant = "t"\nfleet = "f"\nagent = "a"\n', "spiffe://"),
    ('["CN=x"]\ntenant = "t"\nfleet = "f"\n', "strings"),
    ('["CN=x"]\ntenant = "t"\nfleet = "f"\nagent = "a"\ntrust = 7\n', "trust"),
    ('["CN=x"]\ntenant = "t/u"\nfleet = "f"\nagent = "a"\n', "tenant"),
    ('["CN=x"]\ntenant = "t"\nfleet = "f"\nagent = "a"\nkind = "admin"\n', "unknown field"),
    ('["CN=x"]\ntenant = "t"\nfleet = "f"\nagent = "a"\nroles = ["bad role"]\n', "role"),
    ("not toml = = 1", "TOMLDecodeError"),
])
def test_a_bad_principal_map_is_refused(tmp_path: Path, text: str, problem: str) -> None:
    f = tmp_path / "p.toml"
    f.write_text(text)
    with pytest.raises(TlsConfigError, match=problem):
        ClientPrincipals.load(f)


def test_tls_settings_that_go_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("TLS_CERT", "TLS_KEY", "TLS_CLIENT_CA", "TLS_CLIENT_PRINCIPALS"):
        monkeypatch.delenv(f"MEMWARDEN_{name}", raising=False)
    with pytest.raises(ConfigError, match="TLS_CERT and MEMWARDEN_TLS_KEY go together"):
        load_settings(tls_cert=tmp_path / "c.pem")
    with pytest.raises(ConfigError, match="TLS_CLIENT_CA needs"):
        load_settings(tls_client_ca=tmp_path / "ca.pem")
    with pytest.raises(ConfigError, match="TLS_CLIENT_PRINCIPALS needs MEMWARDEN_TLS_CLIENT_CA"):
        load_settings(tls_cert=tmp_path / "c.pem", tls_key=tmp_path / "k.pem", tls_client_principals=tmp_path / "p.toml")
    s = load_settings(tls_cert=tmp_path / "c.pem", tls_key=tmp_path / "k.pem")
    assert s.tls_client_auth == "required" and s.tls_reload_interval_s == 10.0
