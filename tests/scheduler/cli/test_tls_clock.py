"""Certificates made by `gandiva tls init` (and `tls add-client`) on one machine and used on
a host whose wall clock runs behind it: a helper's clock ten minutes slow (NTP not yet synced
after a boot) must still complete its TLS handshakes. The helper's side runs under
libfaketime (its process's clock only; tests/multihost/conftest.py WallClock)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from scheduler.cli.tls import add_clients, make_certificates

from ...multihost.conftest import WallClock

HANDSHAKE = """
import sys, grpc
from pathlib import Path
d = Path(sys.argv[1])
creds = grpc.ssl_channel_credentials((d / "ca.pem").read_bytes(), (d / "late-key.pem").read_bytes(),
                                     (d / "late.pem").read_bytes())
channel = grpc.secure_channel(sys.argv[2], creds)
try:
    grpc.channel_ready_future(channel).result(timeout=10)
    print("connected")
except grpc.FutureTimeoutError:
    print("no connection")
"""


def test_a_host_whose_clock_is_ten_minutes_behind_completes_the_mutual_tls_handshake(tmp_path: Path) -> None:
    """Before, every certificate was valid from the moment it was made: the slow host's
    handshakes all failed ("CERTIFICATE_VERIFY_FAILED: certificate is not yet valid", seen
    only at gRPC's debug verbosity) and its helper could reach neither the scheduler nor a
    peer until its clock caught up; now they are valid from a day before."""
    clock = WallClock(tmp_path)  # skips, saying why, without libfaketime
    clock.set(-600)
    pki = tmp_path / "pki"
    make_certificates(pki, ["127.0.0.1"], [])
    add_clients(pki, ["late"])  # the client pair of a helper added later, as a user would
    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    creds = grpc.ssl_server_credentials(
        [((pki / "server-key.pem").read_bytes(), (pki / "server.pem").read_bytes())],
        root_certificates=(pki / "ca.pem").read_bytes(), require_client_auth=True)
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    try:
        offset = clock.offset_seen()
        assert -700 < offset < -500, f"the late host's clock is {offset:.0f}s off, not -600s"
        got = subprocess.run([sys.executable, "-c", HANDSHAKE, str(pki), f"127.0.0.1:{port}"],
                             env={**os.environ, **clock.env()}, capture_output=True, text=True, timeout=60,
                             check=False)
        assert got.stdout.strip() == "connected", (got.stdout, got.stderr[-2000:])
    finally:
        server.stop(0)
