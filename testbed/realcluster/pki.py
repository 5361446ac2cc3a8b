"""Certificates and kubeconfigs for a throwaway cluster: one CA signs everything.

The API server serves TLS on loopback, authenticates clients by certificates this CA signed
(admin: ``system:masters``; the kubelet: ``system:node:<name>`` in ``system:nodes``, so the Node
authorizer and NodeRestriction treat it as a real node), and signs service-account tokens with
an RSA key made here.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=2)  # a test cluster lives minutes; two days covers clock skew


@dataclass(frozen=True)
class CertFiles:
    """Paths of one PEM certificate and its PEM private key."""

    cert: str
    key: str


def _write(path: str, data: bytes, mode: int = 0o600) -> None:
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class Pki:
    """A CA in ``directory`` and the certificates a cluster needs, signed by it."""

    def __init__(self, directory: str) -> None:
        """Make a fresh CA (P-256) in ``directory``."""
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuready-e2e-ca")])
        now = datetime.datetime.now(datetime.UTC)
        self._ca_cert = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(self._ca_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca = CertFiles(os.path.join(directory, "ca.crt"), os.path.join(directory, "ca.key"))
        _write(self.ca.cert, self._ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
        _write(self.ca.key, _key_pem(self._ca_key))

    @property
    def ca_pem(self) -> bytes:
        """The CA certificate, PEM."""
        return self._ca_cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, name: str, common_name: str, organizations: tuple[str, ...] = (),
              dns: tuple[str, ...] = (), ips: tuple[str, ...] = (), server: bool = False,
              client: bool = False) -> CertFiles:
        """Sign a leaf certificate; write ``<name>.crt`` and ``<name>.key`` and return their paths."""
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = datetime.datetime.now(datetime.UTC)
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
            [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
        builder = (
            x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(self._ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        files = CertFiles(os.path.join(self.directory, f"{name}.crt"), os.path.join(self.directory, f"{name}.key"))
        _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
        _write(files.key, _key_pem(key))
        return files

    def service_account_keys(self) -> CertFiles:
        """An RSA key pair for service-account tokens: ``cert`` is the public key, ``key`` the private."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        files = CertFiles(os.path.join(self.directory, "sa.pub"), os.path.join(self.directory, "sa.key"))
        _write(files.cert, key.public_key().public_bytes(serialization.Encoding.PEM,
                                                         serialization.PublicFormat.SubjectPublicKeyInfo), 0o644)
        _write(files.key, _key_pem(key))
        return files

    def kubeconfig(self, path: str, server: str, user: str, creds: CertFiles) -> str:
        """Write a kubeconfig for ``server`` authenticating with ``creds``; return its path."""
        config = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority": self.ca.cert}}],
            "users": [{"name": user, "user": {"client-certificate": creds.cert, "client-key": creds.key}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
            "current-context": "e2e",
        }
        # JSON (which is YAML too): the plugin then reads it without loading PyYAML, as it would read
        # its in-cluster service account in a real DaemonSet, so figures taken here carry no YAML cost.
        _write(path, json.dumps(config, indent=1).encode())
        return path
