"""A throw-away certificate authority for tests of TLS to the backend, made with the ``openssl`` command line
(`make_certs`): the CA, a server certificate for ``localhost`` / ``127.0.0.1``, one for another host name, a
client certificate (mutual TLS), and a second CA nobody trusts. EC P-256 keys, valid for two days."""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    ca: Path  # the CA certificate (PEM): the bundle a client trusts
    server_cert: Path  # names DNS:localhost and IP:127.0.0.1
    server_key: Path
    other_name_cert: Path  # names DNS:backend.invalid only (a host name mismatch for localhost)
    other_name_key: Path
    client_cert: Path  # for mutual TLS (extendedKeyUsage clientAuth)
    client_key: Path
    stranger_ca: Path  # another CA, trusted by nobody
    stranger_cert: Path  # names localhost, issued by `stranger_ca`
    stranger_key: Path

    def server_context(self, cert: Path | None = None, key: Path | None = None, *,
                       require_client_cert: bool = False) -> ssl.SSLContext:
        """A server-side context presenting `cert`/`key` (default: the localhost certificate); with
        `require_client_cert`, clients must present a certificate issued by `ca`."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert or self.server_cert, key or self.server_key)
        if require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(self.ca)
        return context


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
             "-out", cert, "-days", "2", "-subj", f"/CN=memwarden test {name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=directory)
    return cert, key


def _leaf(directory: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    key, csr, cert, ext = (directory / f"{name}.key", directory / f"{name}.csr", directory / f"{name}.pem",
                           directory / f"{name}.ext")
    ext.write_text(extensions + "\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n")
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
             "-out", csr, "-subj", f"/CN={name}", cwd=directory)
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial", "-out", cert,
             "-days", "2", "-extfile", ext, cwd=directory)
    return cert, key


def make_certs(directory: Path) -> Certs:
    """Every certificate of `Certs`, written to `directory` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "ca")
    stranger = _ca(directory, "stranger-ca")
    server = _leaf(directory, "server", ca, "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth")
    other = _leaf(directory, "other-name", ca, "subjectAltName=DNS:backend.invalid\nextendedKeyUsage=serverAuth")
    client = _leaf(directory, "client", ca, "extendedKeyUsage=clientAuth")
    stranger_leaf = _leaf(directory, "stranger-server", stranger,
                          "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth")
    return Certs(ca[0], *server, *other, *client, stranger[0], *stranger_leaf)
