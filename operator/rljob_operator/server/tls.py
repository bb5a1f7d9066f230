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
import json
import os
import ssl
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

#: Bound on the child that mints a certificate (an interpreter's start and one EC key: under a second).
MINT_TIMEOUT_SECONDS = 60


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
    """A self-signed certificate (its own CA) for ``hosts`` (DNS names and IP addresses), minted by a child
    interpreter (``python -m rljob_operator.server.tls``): the cryptography library it takes is about 10 MiB
    the operator would otherwise hold all its life for a certificate it makes once. The key comes back
    through the child's stdout, never a file."""
    answer = subprocess.run([sys.executable, "-m", "rljob_operator.server.tls", "--days", str(days), "--", *hosts],
                            capture_output=True, text=True, timeout=MINT_TIMEOUT_SECONDS,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    if answer.returncode != 0:
        raise RuntimeError(f"minting the status API's self-signed certificate failed (python -m "
                           f"rljob_operator.server.tls, exit {answer.returncode}): {answer.stderr.strip()[-2000:]}")
    minted = json.loads(answer.stdout)
    return ServingCert(minted["cert"], minted["key"])


def mint(hosts: list[str], days: int = 3650) -> ServingCert:
    """``self_signed``'s certificate, made in this interpreter."""
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


def main(argv: list[str] | None = None) -> None:
    """``python -m rljob_operator.server.tls [--days N] -- HOST...``: a certificate and its key, as JSON on stdout."""
    import argparse

    parser = argparse.ArgumentParser(description="Mint the status API's self-signed certificate (JSON on stdout).")
    parser.add_argument("--days", type=int, default=3650)
    parser.add_argument("hosts", nargs="+")
    args = parser.parse_args(argv)
    try:
        cert = mint(args.hosts, args.days)
    except Exception as e:  # one line for the operator's error, not a traceback
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    json.dump({"cert": cert.cert_pem, "key": cert.key_pem}, sys.stdout)


if __name__ == "__main__":
    main()
