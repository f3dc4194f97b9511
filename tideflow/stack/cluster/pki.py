"""Certificates for the local control plane: one CA, serving and client certs, all for 127.0.0.1.

Each file is written once into the cluster's home and reused on the next start,
so a restarted control plane keeps trusting the kubeconfigs it handed out.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK = ipaddress.ip_address("127.0.0.1")
# The API server's first service IP: in-cluster clients reach "kubernetes.default" there.
SERVICE_IP = ipaddress.ip_address("10.96.0.1")
VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def _name(common: str, org: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    if org:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(parts)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


def ca(home: Path) -> Pair:
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    pair = Pair(home / "ca.crt", home / "ca.key")
    if pair.cert.exists() and pair.key.exists():
        return pair
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("tideflow-local-ca"))
        .issuer_name(_name("tideflow-local-ca"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write_key(pair.key, key)
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return pair


def issue(
    home: Path,
    authority: Pair,
    name: str,
    *,
    common: str,
    org: str | None = None,
    server: bool = False,
    dns: tuple[str, ...] = (),
) -> Pair:
    """A leaf certificate signed by ``authority``: for serving on 127.0.0.1 or as a client."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    pair = Pair(home / f"{name}.crt", home / f"{name}.key")
    if pair.cert.exists() and pair.key.exists():
        return pair
    signer = _load_key(authority.key)
    issuer = x509.load_pem_x509_certificate(authority.cert.read_bytes()).subject
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common, org))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if server:
        names: list[x509.GeneralName] = [x509.IPAddress(LOOPBACK), x509.IPAddress(SERVICE_IP)]
        names += [x509.DNSName(d) for d in ("localhost", *dns)]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(signer, hashes.SHA256())
    _write_key(pair.key, key)
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return pair


def service_account_key(home: Path) -> Pair:
    """The key the API server signs service-account tokens with, and its public half,
    which verifies them (``cert`` holds the public key here, not a certificate)."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    pair = Pair(home / "sa.pub", home / "sa.key")
    if not pair.key.exists():
        _write_key(pair.key, ec.generate_private_key(ec.SECP256R1()))
    public = _load_key(pair.key).public_key()
    pair.cert.write_bytes(
        public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pair
