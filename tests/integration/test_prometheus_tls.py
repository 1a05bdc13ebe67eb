"""Secure connections: the real Prometheus behind TLS and basic auth (its --web.config.file),
and bearer tokens checked by a small server, since Prometheus itself does not check those."""

from __future__ import annotations

import datetime
import ipaddress
import json
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import bcrypt
import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from gpusizer.settings import PrometheusSettings
from gpusizer.signals.prometheus import PrometheusSource
from gpusizer.vocabulary import Reason

from tests.support import free_port, start_prometheus, wait_for

USER, PASSWORD = "gpusizer", "s3cret-pw"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _server_cert(
    ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("prometheus"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _pem(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


@dataclass(frozen=True)
class SecurePrometheus:
    url: str
    ca_file: str
    wrong_ca_file: str


@pytest.fixture(scope="module")
def secure_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecurePrometheus]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed: run `make prometheus`")
    work = tmp_path_factory.mktemp("secure-prometheus")
    ca_key, ca = _ca("gpusizer test CA")
    _, wrong_ca = _ca("some other CA")
    key, cert = _server_cert(ca_key, ca)
    (work / "server.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    _pem(work / "server.crt", cert)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    (work / "web.yml").write_text(
        json.dumps(
            {
                "tls_server_config": {
                    "cert_file": str(work / "server.crt"),
                    "key_file": str(work / "server.key"),
                },
                "basic_auth_users": {USER: hashed},
            }
        )
    )
    (work / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    proc, port = start_prometheus(binary, work, f"--web.config.file={work / 'web.yml'}")
    url = f"https://127.0.0.1:{port}"
    ca_file = str(_pem(work / "ca.crt", ca))

    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"prometheus exited; see {work / 'prometheus.log'}")
        try:
            response = requests.get(
                f"{url}/-/ready", verify=ca_file, auth=(USER, PASSWORD), timeout=1
            )
        except requests.RequestException:
            return False
        return response.status_code == 200

    wait_for(ready, 60, "prometheus /-/ready over TLS")
    yield SecurePrometheus(url, ca_file, str(_pem(work / "wrong-ca.crt", wrong_ca)))
    proc.terminate()
    proc.wait(timeout=20)


async def ask(settings: PrometheusSettings) -> tuple[float | None, Reason | None, str]:
    value, problem = await PrometheusSource(settings).scalar("vector(1)")
    return value, problem.reason if problem else None, problem.message if problem else ""


async def test_right_ca_and_credentials_work(secure_prometheus: SecurePrometheus) -> None:
    got = await ask(
        PrometheusSettings(
            url=secure_prometheus.url,
            ca_file=secure_prometheus.ca_file,
            basic_auth=(USER, PASSWORD),
        )
    )
    assert got == (1.0, None, "")


async def test_wrong_ca_is_unreachable_naming_tls(secure_prometheus: SecurePrometheus) -> None:
    value, reason, message = await ask(
        PrometheusSettings(
            url=secure_prometheus.url,
            ca_file=secure_prometheus.wrong_ca_file,
            basic_auth=(USER, PASSWORD),
        )
    )
    assert (value, reason) == (None, Reason.PROMETHEUS_UNREACHABLE)
    assert "TLS" in message and "--prometheus-ca-file" in message
    assert "CERTIFICATE_VERIFY_FAILED" in message


async def test_system_trust_store_does_not_trust_a_private_ca(
    secure_prometheus: SecurePrometheus,
) -> None:
    _, reason, message = await ask(
        PrometheusSettings(url=secure_prometheus.url, basic_auth=(USER, PASSWORD))
    )
    assert reason == Reason.PROMETHEUS_UNREACHABLE and "TLS" in message


async def test_insecure_skip_verify_skips_verification(
    secure_prometheus: SecurePrometheus,
) -> None:
    got = await ask(
        PrometheusSettings(
            url=secure_prometheus.url, insecure_skip_verify=True, basic_auth=(USER, PASSWORD)
        )
    )
    assert got == (1.0, None, "")


@pytest.mark.parametrize(
    "credentials", [None, (USER, "wrong"), ("nobody", PASSWORD)], ids=["missing", "wrong", "user"]
)
async def test_missing_or_wrong_credentials_are_unauthorized(
    secure_prometheus: SecurePrometheus, credentials: tuple[str, str] | None
) -> None:
    value, reason, message = await ask(
        PrometheusSettings(
            url=secure_prometheus.url, ca_file=secure_prometheus.ca_file, basic_auth=credentials
        )
    )
    assert (value, reason) == (None, Reason.PROMETHEUS_UNAUTHORIZED)
    assert "401" in message and "credentials" in message


class TokenServer:
    """Answers the query API like Prometheus when the bearer token is the expected one,
    401 otherwise, and records every Authorization header it saw."""

    def __init__(self) -> None:
        self.expected = ""
        self.seen: list[str | None] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                header = self.headers.get("Authorization")
                outer.seen.append(header)
                ok = header == f"Bearer {outer.expected}"
                body = (
                    {"status": "success", "data": {"resultType": "scalar", "result": [0, "1"]}}
                    if ok
                    else {"status": "error", "error": "unauthorized"}
                )
                data = json.dumps(body).encode()
                self.send_response(200 if ok else 401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def token_server() -> Iterator[TokenServer]:
    server = TokenServer()
    yield server
    server.server.shutdown()


async def test_bearer_token_is_sent_and_reread_after_rotation(
    token_server: TokenServer, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("first-token\n")
    source = PrometheusSource(
        PrometheusSettings(url=token_server.url, bearer_token_file=str(token))
    )
    token_server.expected = "first-token"
    assert await source.scalar("vector(1)") == (1.0, None)

    token.write_text("rotated-token\n")
    token_server.expected = "rotated-token"
    assert await source.scalar("vector(1)") == (1.0, None)
    assert token_server.seen == ["Bearer first-token", "Bearer rotated-token"]


async def test_rejected_or_unreadable_token_is_unauthorized(
    token_server: TokenServer, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("stale-token")
    token_server.expected = "current-token"
    source = PrometheusSource(
        PrometheusSettings(url=token_server.url, bearer_token_file=str(token))
    )
    value, problem = await source.scalar("vector(1)")
    assert value is None and problem is not None
    assert problem.reason == Reason.PROMETHEUS_UNAUTHORIZED and "401" in problem.message

    token.unlink()
    value, problem = await source.scalar("vector(1)")
    assert value is None and problem is not None
    assert problem.reason == Reason.PROMETHEUS_UNAUTHORIZED
    assert "bearer token" in problem.message and str(token) in problem.message
