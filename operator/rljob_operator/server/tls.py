"""The status API's serving certificate.

Given ``--tls-cert-file``/``--tls-key-file`` (for example from cert-manager) the operator
serves those. Otherwise it makes a self-signed certificate for its Service names; with
``--tls-secret NAMESPACE/NAME`` the first replica stores it in that Secret and every other
replica (and every restart) reuses it, so the CA the trainers were given stays valid.
Trainers trust the certificate through the job's ConfigMap (key ``status-ca.crt``).
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import ssl
import tempfile
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException


@dataclass(frozen=True)
class ServingCert:
    cert_pem: str
    key_pem: str

    def ssl_context(self) -> ssl.SSLContext:
        folder = tempfile.mkdtemp(prefix="rljob-tls-")
        cert, key = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
        with open(cert, "w", encoding="utf-8") as f:
            f.write(self.cert_pem)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(self.key_pem)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        os.unlink(key)
        return context


def self_signed(hosts: list[str], days: int = 3650) -> ServingCert:
    """A self-signed certificate (its own CA) for ``hosts`` (DNS names and IP addresses)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rljob-operator")])  # names live in the SANs
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, key_encipherment=False,
                          content_commitment=False, data_encipherment=False, key_agreement=False,
                          crl_sign=False, encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return ServingCert(
        cert.public_bytes(serialization.Encoding.PEM).decode(),
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode(),
    )


def from_files(cert_file: str, key_file: str) -> ServingCert:
    with open(cert_file, encoding="utf-8") as c, open(key_file, encoding="utf-8") as k:
        return ServingCert(c.read(), k.read())


def shared_self_signed(kube: Any, namespace: str, name: str, hosts: list[str]) -> ServingCert:
    """Read the self-signed certificate from Secret ``namespace/name``, creating it first if absent."""
    path = f"/api/v1/namespaces/{namespace}/secrets"
    for _ in range(3):
        try:
            secret = kube.request("GET", f"{path}/{name}")
            data = secret.get("data") or {}
            return ServingCert(
                base64.b64decode(data["tls.crt"]).decode(), base64.b64decode(data["tls.key"]).decode()
            )
        except ApiException as e:
            if e.status != 404:
                raise
        cert = self_signed(hosts)
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "rljob-operator"}},
            "data": {
                "tls.crt": base64.b64encode(cert.cert_pem.encode()).decode(),
                "tls.key": base64.b64encode(cert.key_pem.encode()).decode(),
            },
        }
        try:
            kube.request("POST", path, body, count_write=False)
            return cert
        except ApiException as e:
            if e.status != 409:  # another replica won the race: read theirs
                raise
    raise RuntimeError(f"cannot read or create Secret {namespace}/{name}")
