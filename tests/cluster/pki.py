"""Certificates, keys and kubeconfigs for a throwaway control plane.

One self-signed CA signs the kube-apiserver serving certificate and every client
certificate; the client identities are the ones the bootstrap RBAC policy knows
(system:kube-controller-manager, system:kube-scheduler) plus system:masters for
the admin and for kwok. ECDSA P-256 keys, because generating them is instant.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The first address of the service range; pods reach the API at kubernetes.default.
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"

_VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class CertPair:
    """Paths of a PEM certificate and its private key."""

    cert: Path
    key: Path


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common_name: str, organization: str | tuple[str, ...] | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    # Each O is one group of the user to the API server.
    for org in (organization,) if isinstance(organization, str) else organization or ():
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attributes)


class ClusterPKI:
    """A CA in ``directory`` (new, or the one there with ``existing``) and the certificates a control plane needs."""

    def __init__(self, directory: Path, *, existing: bool = False) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.ca = CertPair(directory / "ca.crt", directory / "ca.key")
        if existing:  # the CA of a running control plane, to issue more client certificates
            self._ca_cert = x509.load_pem_x509_certificate(self.ca.cert.read_bytes())
            key = serialization.load_pem_private_key(self.ca.key.read_bytes(), password=None)
            assert isinstance(key, ec.EllipticCurvePrivateKey)
            self._ca_key = key
            return
        self._ca_key = _new_key()
        now = dt.datetime.now(dt.UTC)
        self._ca_cert = (
            x509.CertificateBuilder()
            .subject_name(_name("rljob-test-ca"))
            .issuer_name(_name("rljob-test-ca"))
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._ca_key, hashes.SHA256())
        )
        _write_cert(self._ca_cert, self.ca.cert)
        _write_key(self._ca_key, self.ca.key)

    def issue(
        self,
        name: str,
        common_name: str,
        organization: str | tuple[str, ...] | None = None,
        *,
        server_names: tuple[str, ...] = (),
    ) -> CertPair:
        """Sign a client certificate, or a serving one when ``server_names`` is given."""
        key = _new_key()
        now = dt.datetime.now(dt.UTC)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organization))
            .issuer_name(self._ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if server_names:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
            alt_names: list[x509.GeneralName] = []
            for entry in server_names:
                try:
                    alt_names.append(x509.IPAddress(ipaddress.ip_address(entry)))
                except ValueError:
                    alt_names.append(x509.DNSName(entry))
            builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        pair = CertPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        _write_cert(cert, pair.cert)
        _write_key(key, pair.key)
        return pair

    def service_account_keys(self) -> CertPair:
        """Key pair that signs service-account tokens (``cert`` is the public key)."""
        key = _new_key()
        pair = CertPair(self.directory / "sa.pub", self.directory / "sa.key")
        pair.cert.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        _write_key(key, pair.key)
        return pair


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(
    path: Path,
    server: str,
    ca_cert: Path,
    *,
    user: str,
    client: CertPair | None = None,
    token: str | None = None,
    namespace: str | None = None,
) -> Path:
    """Write a self-contained kubeconfig (credentials embedded) for one identity."""
    credentials: dict[str, str] = {}
    if client is not None:
        credentials["client-certificate-data"] = _b64(client.cert)
        credentials["client-key-data"] = _b64(client.key)
    if token is not None:
        credentials["token"] = token
    context: dict[str, str] = {"cluster": "rljob-test", "user": user}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "rljob-test",
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_cert)},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "rljob-test", "context": context}],
        "current-context": "rljob-test",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def rsa_webhook_authority(ca_name: str, server_names: tuple[str, ...]) -> dict[str, bytes]:
    """A CA named ``ca_name`` (also its DNS name) and a serving certificate it signed, as PEM.

    RSA with a PKCS#1 CA key: the shape of the Secret that open-policy-agent's cert-controller
    (Kueue's internal certificate management) reads and keeps when it is valid: ``ca.crt``,
    ``ca.key``, ``tls.crt``, ``tls.key``.
    """
    from cryptography.hazmat.primitives.asymmetric import rsa

    now = dt.datetime.now(dt.UTC)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(ca_name, ca_name))
        .issuer_name(_name(ca_name, ca_name))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(ca_name)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = _new_key()
    alt_names: list[x509.GeneralName] = []
    for entry in server_names:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(entry)))
        except ValueError:
            alt_names.append(x509.DNSName(entry))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(server_names[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return {
        "ca.crt": ca_cert.public_bytes(serialization.Encoding.PEM),
        "ca.key": ca_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()),
        "tls.crt": cert.public_bytes(serialization.Encoding.PEM),
        "tls.key": key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()),
    }
