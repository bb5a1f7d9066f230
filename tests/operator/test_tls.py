"""The status API's self-signed certificate, minted by a child interpreter (``rljob_operator.server.tls``)."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading

import pytest
from rljob_operator.server import tls


def _handshake(cert: tls.ServingCert, server_name: str) -> None:
    """A TLS handshake on loopback: the server with ``cert``, a client that trusts only ``cert`` and asks for
    ``server_name``; raises what the client's handshake raises."""
    server_context = cert.ssl_context()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            try:
                with server_context.wrap_socket(conn, server_side=True) as tls_conn:
                    tls_conn.recv(1)
            except (ssl.SSLError, OSError):
                pass

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        client = ssl.create_default_context(cadata=cert.cert_pem)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                    client.wrap_socket(raw, server_hostname=server_name) as conn:
                conn.sendall(b"x")
        finally:
            thread.join(timeout=10)


def test_the_certificate_is_minted_in_a_child_and_serves_its_hosts_only() -> None:
    """Its DNS names and IP addresses are in the certificate a client trusts (its own CA); another name is
    refused. The minting process is a child: this one imports no cryptography for it."""
    before = {m for m in sys.modules if m.split(".")[0] == "cryptography"}
    cert = tls.self_signed(["rljob-operator.rljob-system.svc", "127.0.0.1"])
    assert cert.cert_pem.startswith("-----BEGIN CERTIFICATE-----") and "PRIVATE KEY" in cert.key_pem
    assert {m for m in sys.modules if m.split(".")[0] == "cryptography"} == before
    _handshake(cert, "rljob-operator.rljob-system.svc")
    _handshake(cert, "127.0.0.1")
    with pytest.raises(ssl.SSLCertVerificationError, match="match"):
        _handshake(cert, "other.rljob-system.svc")


def test_a_child_that_cannot_mint_is_an_error_naming_it() -> None:
    with pytest.raises(RuntimeError, match=r"certificate failed \(python -m rljob_operator\.server\.tls, exit 1\): "
                                           r"ValueError: The not valid after date must be after"):
        tls.self_signed(["a.example"], days=-1)


def test_the_child_prints_only_json() -> None:
    out = subprocess.run([sys.executable, "-m", "rljob_operator.server.tls", "--", "a.example"],
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith('{"cert": "-----BEGIN CERTIFICATE-----') and out.endswith("}")
