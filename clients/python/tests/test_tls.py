"""`relay+wss://`: the relay behind a TLS-terminating front, trusted through `ca_file`."""

from __future__ import annotations

import datetime
import ipaddress
import ssl

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import execrelay
from fault_proxy import FaultProxy

from conftest import upstream_of


def self_signed(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "execrelay test relay")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "relay.pem", tmp_path / "relay.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def test_relay_wss_with_ca_file(relay_url, creds, tmp_path):
    cert, key = self_signed(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    front = FaultProxy(*upstream_of(relay_url), ssl_context=ctx)
    try:
        env = relay_url.rsplit("/", 1)[1]
        url = f"relay+wss://127.0.0.1:{front.port}/{env}"
        with execrelay.connect(url, ca_file=cert, **creds) as c:
            assert c.run("echo over-tls").stdout == b"over-tls\n"
        # The same through a host alias whose entry names the CA file.
        cfg = tmp_path / "config.toml"
        cfg.write_text(f'[hosts.tls]\nurl = "{url}"\nca_file = "{cert}"\n'
                       f'server_key = "{creds["server_key"]}"\nkey = "{creds["key"]}"\n')
        import os
        old = os.environ.get("EXECRELAY_CONFIG")
        os.environ["EXECRELAY_CONFIG"] = str(cfg)
        try:
            with execrelay.connect("tls") as c:
                assert c.run("echo alias-tls").stdout == b"alias-tls\n"
        finally:
            if old is None:
                del os.environ["EXECRELAY_CONFIG"]
            else:
                os.environ["EXECRELAY_CONFIG"] = old
        # Without the CA the certificate is not trusted: a clear connect error.
        with pytest.raises(execrelay.ConnectError, match="CERTIFICATE_VERIFY_FAILED|certificate"):
            execrelay.connect(url, **creds)
    finally:
        front.close()
