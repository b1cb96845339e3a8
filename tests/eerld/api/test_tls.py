"""TCP is served only with mutual TLS: a client without a certificate signed by the client CA is refused."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import grpc
import pytest
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from tests.eerld.conftest import open_session


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(d: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
            "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))  # fmt: skip
    ext = d / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))  # fmt: skip
        openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
                "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "1", "-extfile", str(ext),
                "-out", str(d / f"{name}.pem"))  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_tcp_accepts_a_client_certificate_signed_by_the_client_ca_and_refuses_a_client_without_one(
    sock_dir, start_daemon
):
    make_pki(sock_dir)
    address = f"127.0.0.1:{free_port()}"
    with start_daemon(
        listen=address,
        tls_cert=sock_dir / "server.pem",
        tls_key=sock_dir / "server.key",
        tls_client_ca=sock_dir / "ca.pem",
    ):
        ca = (sock_dir / "ca.pem").read_bytes()
        with_cert = grpc.ssl_channel_credentials(
            ca, (sock_dir / "client.key").read_bytes(), (sock_dir / "client.pem").read_bytes()
        )
        with grpc.secure_channel(address, with_cert) as channel:
            assert open_session(pb_grpc.PhaseServiceStub(channel), 0).session_id
        with grpc.secure_channel(address, grpc.ssl_channel_credentials(ca)) as channel:
            with pytest.raises(grpc.RpcError) as e:
                pb_grpc.PhaseServiceStub(channel).Heartbeat(
                    pb.HeartbeatRequest(session_id="x" * 32), timeout=10
                )
            assert e.value.code() is grpc.StatusCode.UNAVAILABLE
