"""TLS (server-only and mutual) over real sockets, certificates from `gandiva tls
init`, and the refusal to serve an open address without TLS and tokens."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from gandiva_cli.main import main
from protos.gandiva.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler.transport import SecurityError, ServerTls, check_exposure

from .conftest import make_token


def _tls(certs: Path, mutual: bool = False) -> ServerTls:
    return ServerTls(str(certs / "server.pem"), str(certs / "server-key.pem"),
                     str(certs / "ca.pem") if mutual else "")


def test_tls_with_tokens(make_scheduler, sqlite_url, certs, connect) -> None:  # type: ignore[no-untyped-def]
    sched = make_scheduler(sqlite_url, auth="token", tls=_tls(certs), listen="localhost:0")
    token = make_token(sqlite_url, "alice")
    ok = scheduler_pb2_grpc.SchedulerStub(connect(sched.address, token, ca=str(certs / "ca.pem")))
    assert list(ok.ListJobs(scheduler_pb2.ListJobsRequest()).jobs) == []
    plain = scheduler_pb2_grpc.SchedulerStub(connect(sched.address, token))
    with pytest.raises(grpc.RpcError) as err:
        plain.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=3)
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_mutual_tls_needs_a_client_certificate(make_scheduler, sqlite_url, certs, connect) -> None:  # type: ignore[no-untyped-def]
    sched = make_scheduler(sqlite_url, tls=_tls(certs, mutual=True), listen="localhost:0")
    ca = str(certs / "ca.pem")
    with_cert = scheduler_pb2_grpc.SchedulerStub(
        connect(sched.address, ca=ca, cert=str(certs / "alice.pem"), key=str(certs / "alice-key.pem")))
    assert list(with_cert.ListJobs(scheduler_pb2.ListJobsRequest()).jobs) == []
    without = scheduler_pb2_grpc.SchedulerStub(connect(sched.address, ca=ca))
    with pytest.raises(grpc.RpcError) as err:
        without.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=3)
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0", "10.1.2.3:50051", "gpu-head:50051"])
def test_an_open_address_without_tls_and_auth_is_refused(listen: str, certs: Path) -> None:
    for tls, auth in ((None, False), (_tls(certs), False), (None, True)):
        with pytest.raises(SecurityError) as err:
            check_exposure(listen, tls, auth, insecure=False, what="the scheduler")
        assert "--insecure" in str(err.value)
        assert ("--tls-cert" in str(err.value)) == (tls is None)
        assert ("--auth token" in str(err.value)) == (not auth)
    assert check_exposure(listen, _tls(certs), True, insecure=False, what="x") == ""
    assert "WITHOUT" in check_exposure(listen, None, False, insecure=True, what="x")


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "localhost:50051", "[::1]:0"])
def test_loopback_may_run_open_and_says_so(listen: str) -> None:
    assert "loopback" in check_exposure(listen, None, False, insecure=False, what="the scheduler")


@pytest.mark.parametrize(("host", "loopback"), [
    ("localhost", True), ("LOCALHOST", True), ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True),
    ("::ffff:127.0.0.1", True), ("0.0.0.0", False), ("::", False), ("10.0.0.1", False), ("::ffff:10.0.0.1", False),
    ("gpu1", False), ("localhost.example", False), ("127.0.0.1.nip.io", False)])
def test_the_grpc_servers_and_the_dashboard_agree_on_what_loopback_is(host: str, loopback: bool) -> None:
    """Two functions said it (the gRPC servers' exposure check, the dashboard's Host check)
    and disagreed: LOCALHOST was loopback to the dashboard only, and ::ffff:127.0.0.1 (IPv4's
    loopback as a dual-stack socket names it) to neither. Both now ask one."""
    from scheduler.observe.http import HttpServer
    from scheduler.transport import is_loopback

    listen = f"[{host}]:0" if ":" in host else f"{host}:0"
    assert (is_loopback(listen), HttpServer(listen, {}).loopback) == (loopback, loopback)


def test_a_dashboard_other_machines_reach_without_tokens_needs_the_names_it_is_asked_by(tmp_path: Path) -> None:
    """`--http-listen 0.0.0.0:9100` without --auth token served every user's jobs to any web
    page a browser of that network opened that had its own name resolve to this address (DNS
    rebinding: only requests on loopback were held to known names). Now it is refused at once,
    before the database is made, saying what to give; the names given hold every request
    (test_hostile_requests.py -k rebinding_page)."""
    db = tmp_path / "x.db"
    # As `gandiva demo --http-listen 0.0.0.0:9100` starts it (it said only "see its log").
    from scheduler.cli.local_cluster import LocalCluster

    demo = LocalCluster(tmp_path, f"sqlite+aiosqlite:///{db}", [], 1, http_listen="0.0.0.0:0")
    try:
        with pytest.raises(RuntimeError, match=r"exited with status 2: gandiva scheduler: refusing --http-listen "
                           r"0\.0\.0\.0:0 without --auth token: .* Give --http-allow-host NAME"):
            demo.start_scheduler()  # (before: it served)
    finally:
        demo.stop()
    assert not db.exists()


def test_the_demo_takes_the_names_its_dashboard_is_asked_by(tmp_path: Path) -> None:
    """`gandiva demo --http-listen 0.0.0.0:9100` is refused as above, saying "Give --http-allow-host
    NAME", which `gandiva demo` did not take (an unknown argument): a demo's page could not be
    reached from another machine at all. Now it takes the names and gives them to its scheduler,
    whose start then passes (the names at work: test_hostile_requests.py -k rebinding_page)."""
    from gandiva_cli.main import build_parser
    from scheduler.cli.demo import local_cluster
    from scheduler.observe.http import check_dashboard_exposure

    args = build_parser().parse_args(["demo", "--http-listen", "0.0.0.0:9100", "--http-allow-host", "demo.example"])
    demo = local_cluster(args, tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'x.db'}", [])
    sched = build_parser().parse_args(["scheduler", "--http-listen", demo.http_listen, *demo.scheduler_args])
    assert sched.http_allow_host == ["demo.example"], demo.scheduler_args
    assert check_dashboard_exposure(sched.http_listen, sched.auth == "token", sched.http_allow_host,
                                    sched.insecure) == ""


def test_the_scheduler_command_refuses_an_open_address(tmp_path: Path) -> None:
    db = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    out = subprocess.run(
        [sys.executable, "-m", "gandiva_cli.main", "scheduler", "--listen", "0.0.0.0:0", "--db", db],
        check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "refusing to listen on 0.0.0.0:0" in out.stdout + out.stderr
    assert not (tmp_path / "x.db").exists()  # refused before touching anything


def test_an_open_also_listen_address_is_refused_first_and_warned_of_with_insecure(tmp_path: Path) -> None:
    db = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    out = subprocess.run(
        [sys.executable, "-m", "gandiva_cli.main", "scheduler", "--listen", "127.0.0.1:0", "--db", db,
         "--also-listen", "0.0.0.0:0"],
        check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "refusing to listen on 0.0.0.0:0" in out.stdout + out.stderr
    assert not (tmp_path / "x.db").exists()  # refused before touching anything
    # With --insecure it serves, and says so for that address too.
    proc = subprocess.Popen(
        [sys.executable, "-m", "gandiva_cli.main", "scheduler", "--listen", "127.0.0.1:0", "--db", db,
         "--also-listen", "0.0.0.0:0", "--insecure"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "scheduler listening on" in line:
                break
        # Named with the port bound, not the `:0` asked for.
        assert any(re.search(r"0\.0\.0\.0:[1-9][0-9]* WITHOUT", line) for line in lines), lines
    finally:
        proc.terminate()
        proc.wait(30)


def test_tls_init_writes_a_usable_cluster_pki(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gandiva_cli.main", "tls", "init", str(tmp_path / "pki"),
         "--host", "head.example", "--host", "10.0.0.1", "--client", "alice"],
        check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    names = {p.name for p in (tmp_path / "pki").iterdir()}
    assert names == {"ca.pem", "ca-key.pem", "server.pem", "server-key.pem", "alice.pem", "alice-key.pem"}
    assert (tmp_path / "pki" / "server-key.pem").stat().st_mode & 0o077 == 0
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((tmp_path / "pki" / "server.pem").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "head.example" in sans.get_values_for_type(x509.DNSName)
    again = subprocess.run(
        [sys.executable, "-m", "gandiva_cli.main", "tls", "init", str(tmp_path / "pki"), "--host", "x"],
        check=False, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "--force" in again.stderr


async def test_a_helper_agent_refuses_an_open_address_without_mtls(tmp_path: Path, monkeypatch, certs: Path) -> None:  # type: ignore[no-untyped-def]
    from migration_helper.config import HelperConfig
    from migration_helper.daemon import HelperDaemon

    monkeypatch.setenv("GANDIVA_FORCE_VIRTUAL_GPUS", "1")
    for tls in (None, _tls(certs)):  # TLS without client certificates is not enough either
        config = HelperConfig(server_name="s1", scheduler="127.0.0.1:9", listen="0.0.0.0:0", gpus=1,
                              ramdisk=tmp_path / "rd", log_dir=tmp_path / "logs", tls=tls)
        with pytest.raises(SecurityError) as err:
            await HelperDaemon(config).start()
        assert "--insecure" in str(err.value) and "--tls-client-ca" in str(err.value)


@pytest.mark.parametrize(("where", "hosts", "message"), [
    ("file", ["h"], "exists and is not a directory"),
    ("/proc/gandiva-tls", ["h"], "gandiva tls: cannot write /proc/gandiva-tls ("),
    ("pki", [""], "--host '' is empty"),
    ("pki", ["a b/c"], "--host 'a b/c' is neither an IP address nor a valid DNS name"),
    ("pki", ["-x.example"], "is neither an IP address nor a valid DNS name"),
    ("pki", ["a" * 40 + "." + "b" * 40], "is longer than 64 characters, the most a certificate's common name"),
])
def test_tls_init_refuses_a_bad_dir_or_host_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        where: str, hosts: list[str], message: str) -> None:
    """A DIR that is a file or cannot be created gave FileExistsError/FileNotFoundError
    tracebacks; an empty or long --host cryptography's ValueError; "a b/c" was accepted."""
    (tmp_path / "file").write_text("")
    target = tmp_path / where if not where.startswith("/") else Path(where)
    argv = ["tls", "init", str(target)] + [f"--host={h}" for h in hosts]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "pki").exists()


def _tls_init_on_a_full_disk(pki: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """`gandiva tls init PKI` where no file may grow past 1 KiB (RLIMIT_FSIZE: writes fail
    with EFBIG, as on a full disk): ca.pem (~540 bytes) fits, a server.pem for 40 names does not.

    The child writes no bytecode (-B): Python does not check the length of its .pyc writes, so
    a module this child compiled first (a fresh clone, a source just edited) got a .pyc cut at
    1 KiB with a valid header, and every later import of it, in any process, failed with
    "EOFError: marshal data too short" (scheduler/cli/output.py's in this test's own main()
    below; dozens of such files across scheduler/ in one run), until the source changed again."""
    import resource

    hosts = [f"--host=host{i}.example.org" for i in range(40)]
    return subprocess.run(
        [sys.executable, "-B", "-m", "gandiva_cli.main", "tls", "init", str(pki), *hosts, *flags],
        check=False, capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024)))


def test_tls_init_that_cannot_write_every_file_leaves_the_directory_as_it_was(tmp_path: Path) -> None:
    """A full disk (or a Ctrl-C) half-way through `tls init` left a partial set: in a new
    DIR a ca.pem without server.pem (the rerun then said "ca.pem exists; pass --force"),
    and under --force a new CA beside the old server certificate, which it did not sign."""
    pki = tmp_path / "pki"
    failed = _tls_init_on_a_full_disk(pki)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr
    assert failed.stderr == (f"gandiva tls: cannot write {pki / 'server.pem'} (File too large); no certificate "
                             "was written or replaced; give a directory you can create and write\n")
    assert sorted(p.name for p in pki.iterdir()) == []  # no ca.pem, no temporaries
    assert main(["tls", "init", str(pki), "--host", "head", "--client", "alice"]) == 0  # no --force needed
    before = {p.name: p.read_bytes() for p in pki.iterdir()}
    assert _tls_init_on_a_full_disk(pki, "--force").returncode == 2
    assert {p.name: p.read_bytes() for p in pki.iterdir()} == before  # the old set, whole


def test_tls_client_names_whose_files_are_anothers_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`tls init DIR --client ca-key` wrote its certificate over the CA's key (exit 2, "no
    certificate was written or replaced", beside a ca.pem, server.pem and server-key.pem
    that were); `server-key`, `bob` with `bob-key`, or `bob` twice likewise over another's
    files; a name with escapes was written as a file name and printed raw."""
    pki, new = tmp_path / "pki", tmp_path / "new"
    assert main(["tls", "init", str(pki), "--host", "head"]) == 0
    before = {p.name: p.read_bytes() for p in pki.iterdir()}
    for clients in (["ca-key"], ["server-key"], ["bob", "bob-key"], ["bob", "bob"], ["a\x1b[2Jb"], ["a b"]):
        capsys.readouterr()
        assert main(["tls", "init", str(new), "--host", "head", *[f"--client={c}" for c in clients]]) == 2
        assert main(["tls", "client", str(pki), *clients, "--force"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 2 and "\x1b" not in err, err
        assert ("would take the place of another's" in err or "is given twice" in err
                or "use a plain name" in err), err
        assert not new.exists()
        assert {p.name: p.read_bytes() for p in pki.iterdir()} == before
    assert main(["tls", "client", str(pki), "bob@example.com", "alice.smith", "monkey"]) == 0


def test_tls_days_past_the_year_9999_are_refused_in_one_line(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """`--days 100000000` (or any count ending after 9999-12-31, the last day a certificate
    can name) was an OverflowError traceback ("date value out of range") from init and client."""
    pki, new = tmp_path / "pki", tmp_path / "new"
    assert main(["tls", "init", str(pki), "--host", "head"]) == 0
    before = {p.name: p.read_bytes() for p in pki.iterdir()}
    capsys.readouterr()
    for days in ("100000000", "1" + "0" * 40):
        assert main(["tls", "init", str(new), "--host", "head", "--days", days]) == 2
        assert main(["tls", "client", str(pki), "bob", "--days", days]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 2, err
        assert err.count(": a certificate cannot be valid past the year 9999; give at most ") == 2, err
        assert not new.exists() and {p.name: p.read_bytes() for p in pki.iterdir()} == before
    assert "--days 10000000... (41 digits): " in err


def test_tls_keys_go_only_into_a_directory_no_one_else_may_write(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`tls init DIR` into a DIR another user had made (`/tmp/pki`), or one every user may
    write in, wrote the cluster's CA and keys there, exit 0: that user could then replace
    ca.pem and server.pem with their own."""
    open_to_all, sticky, theirs = tmp_path / "open", tmp_path / "sticky", tmp_path / "theirs"
    group = tmp_path / "group"  # a umask of 002 makes 775: its group's members replaced ca.pem
    for d in (open_to_all, sticky, theirs, group):
        d.mkdir()
    open_to_all.chmod(0o777)
    group.chmod(0o775)
    sticky.chmod(0o1777)  # like /tmp: no one may replace another's files there
    cases = [(open_to_all, "may be written by every user (mode 777)"),
             (group, (f"may be written by its group (mode 775), who could replace the certificates written "
                      f"there; make it its owner's to write: chmod go-w {group}"))]
    if os.geteuid() == 0:
        os.chown(theirs, 65534, -1)
        cases.append((theirs, "belongs to another user (uid 65534; this is uid 0)"))
    for d, said in cases:
        capsys.readouterr()
        assert main(["tls", "init", str(d), "--host", "head"]) == 2
        assert main(["tls", "client", str(d), "bob"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count(said) == 2 and err.count("\n") == 2, err
        assert list(d.iterdir()) == []
    assert main(["tls", "init", str(sticky), "--host", "head"]) == 0


def test_a_tls_file_others_may_write_or_a_key_all_may_read_is_refused_naming_the_chmod(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A scheduler (and a helper) served a --tls-key or --tls-cert its group could write, and
    trusted a --tls-client-ca anyone could replace: one of them could put in their own CA or
    key. A key every user could read was served too. Now each is refused at start, naming the
    file and the chmod that makes it safe; a group-readable key (0640) is still taken."""
    from scheduler.transport import SecurityError, ServerTls

    pki = tmp_path / "pki"
    assert main(["tls", "init", str(pki), "--host", "localhost"]) == 0
    cert, key, ca = pki / "server.pem", pki / "server-key.pem", pki / "ca.pem"
    for path, mode, said in ((key, 0o660, f"--tls-key {key} may be written by its group (mode 660)"),
                             (cert, 0o664, f"--tls-cert {cert} may be written by its group (mode 664)"),
                             (ca, 0o646, f"--tls-client-ca {ca} may be written by every user (mode 646)"),
                             (key, 0o604, f"--tls-key {key} is a private key every user may read (mode 604)")):
        before = path.stat().st_mode & 0o777
        path.chmod(mode)
        with pytest.raises(SecurityError) as refused:
            ServerTls.from_flags(str(cert), str(key), str(ca))
        assert said in str(refused.value), refused.value
        assert f"chmod {'600' if 'private key' in said else 'go-w'} {path}" in str(refused.value)
        path.chmod(before)
    key.chmod(0o640)
    assert ServerTls.from_flags(str(cert), str(key), str(ca)) is not None


def test_a_tls_file_in_a_directory_others_may_write_is_refused(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """TLS files of modes 644 and 600 under a directory every user (or its group) may write
    were taken: any of them could rename the pki directory away and put their own CA and key
    in its place. A directory with the sticky bit (/tmp's 1777) is fine."""
    from scheduler.transport import SecurityError, ServerTls

    top = tmp_path / "shared"
    pki = top / "pki"
    top.mkdir()
    assert main(["tls", "init", str(pki), "--host", "localhost"]) == 0
    cert, key, ca = pki / "server.pem", pki / "server-key.pem", pki / "ca.pem"
    for mode, who in ((0o777, "every user"), (0o775, "its group")):
        top.chmod(mode)
        with pytest.raises(SecurityError) as refused:
            ServerTls.from_flags(str(cert), str(key), str(ca))
        said = f"its directory {top} may be written by {who} (mode {mode:o})"
        assert said in str(refused.value) and f"chmod go-w {top}" in str(refused.value), refused.value
    top.chmod(0o1777)
    assert ServerTls.from_flags(str(cert), str(key), str(ca)) is not None


def test_tls_init_takes_names_addresses_and_wildcards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    long_name = "a" * 40 + "." + "b" * 40  # longer than a common name: fine after the first
    assert main(["tls", "init", str(tmp_path / "pki"), "--host", "head-1.example.", "--host", "::1",
                 "--host", "*.example.org", "--host", long_name]) == 0, capsys.readouterr().err


def test_a_certificate_and_key_that_are_not_a_pair_are_refused_naming_both(tmp_path: Path, certs: Path) -> None:
    """--tls-key of another certificate (or the certificate given twice): gRPC took the PEM
    files and failed only when binding, so the scheduler said `--listen ...: the address is
    in use`. Now exit 2 naming --tls-cert and --tls-key, before any database is made."""
    db = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    wrong = [
        ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "ca-key.pem")],
        ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.pem")],
    ]
    for flags in wrong:
        out = subprocess.run(
            [sys.executable, "-m", "gandiva_cli.main", "scheduler", "--listen", "127.0.0.1:0", "--db", db, *flags],
            check=False, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, out.stderr
        assert (f"--tls-cert {flags[1]} and --tls-key {flags[3]} are not a certificate and its "
                "unencrypted private key") in out.stderr
        assert "in use" not in out.stderr and "Traceback" not in out.stderr
    with pytest.raises(SecurityError, match="--tls-client-ca .*server-key.pem: not a CA certificate"):
        ServerTls.from_flags(str(certs / "server.pem"), str(certs / "server-key.pem"), str(certs / "server-key.pem"))
    assert ServerTls.from_flags(str(certs / "server.pem"), str(certs / "server-key.pem"), str(certs / "ca.pem"))
    assert not (tmp_path / "x.db").exists()


def test_a_client_speaking_the_wrong_tls_is_told_which_flag_to_fix(  # type: ignore[no-untyped-def]
        make_scheduler, sqlite_url, certs, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Each was "cannot reach the scheduler at ADDR (Socket closed|OK); start it with `gandiva
    # scheduler` ...", while it ran; a CA given to a plaintext scheduler also printed gRPC's
    # own "I1205 ... Handshake failed ..." line before it.
    tls = make_scheduler(sqlite_url, tls=_tls(certs), listen="localhost:0")
    plain = make_scheduler(f"sqlite+aiosqlite:///{tmp_path / 'plain.db'}")
    from scheduler.cli.tls import make_certificates

    make_certificates(tmp_path / "other", ["localhost"], [])

    def error_of(*argv: str) -> str:
        assert main(["get", "jobs", *argv]) == 2
        # In-process, stderr may also hold other threads' log noise (a test run's other
        # schedulers): the command's own line is the one that counts. The subprocess below
        # checks that nothing else is printed.
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("gandiva: error: ")]
        assert len(errors) == 1, errors
        return errors[0]

    assert "pass --tls-ca FILE or set GANDIVA_TLS_CA" in error_of("--scheduler", tls.address)
    assert "TLS with the scheduler at" in error_of("--scheduler", tls.address, "--tls-ca",
                                                   str(tmp_path / "other" / "ca.pem"))
    mutual = make_scheduler(f"sqlite+aiosqlite:///{tmp_path / 'mutual.db'}", tls=_tls(certs, mutual=True),
                            listen="localhost:0")
    assert "pass --tls-cert and --tls-key" in error_of("--scheduler", mutual.address, "--tls-ca", str(certs / "ca.pem"))
    out = subprocess.run([sys.executable, "-m", "gandiva_cli.main", "get", "jobs", "--scheduler", plain.address,
                          "--tls-ca", str(certs / "ca.pem")], check=False, capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"})
    assert out.returncode == 2
    assert out.stderr.splitlines() == [(f"gandiva: error: the scheduler at {plain.address} does not speak TLS (it "
                                        "runs without --tls-cert): leave out --tls-ca (and GANDIVA_TLS_CA), or "
                                        "check the address")], out.stderr


def test_a_client_certificate_is_added_later_without_replacing_the_ca(  # type: ignore[no-untyped-def]
        make_scheduler, sqlite_url, certs, connect, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Under mutual TLS a new user needed a client pair, and `gandiva tls init` could only
    # replace the whole cluster's certificates (--force): every server and user re-keyed.
    import shutil

    pki = tmp_path / "pki"
    shutil.copytree(certs, pki)
    ca_before = (pki / "ca.pem").read_bytes()
    assert main(["tls", "client", str(pki), "bob"]) == 0
    assert (pki / "ca.pem").read_bytes() == ca_before
    assert (pki / "bob-key.pem").stat().st_mode & 0o077 == 0
    sched = make_scheduler(sqlite_url, tls=_tls(pki, mutual=True), listen="localhost:0")
    bob = scheduler_pb2_grpc.SchedulerStub(
        connect(sched.address, ca=str(pki / "ca.pem"), cert=str(pki / "bob.pem"), key=str(pki / "bob-key.pem")))
    assert list(bob.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10).jobs) == []
    capsys.readouterr()
    assert main(["tls", "client", str(pki), "bob"]) == 2  # not replaced without --force
    assert "bob.pem exists; pass --force" in capsys.readouterr().err
    assert main(["tls", "client", str(tmp_path / "nothing-here"), "carol"]) == 2
    assert "has no ca.pem and ca-key.pem" in capsys.readouterr().err
    assert not (tmp_path / "nothing-here").exists()
