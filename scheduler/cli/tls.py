"""`gandiva tls init DIR`: a small cluster's certificates, made with `cryptography`.

Writes ca.pem and ca-key.pem (keep the key offline), server.pem and
server-key.pem valid for every --host (names or IP addresses; the scheduler and
every helper may share this pair), and one NAME.pem / NAME-key.pem client pair
per --client for mutual TLS. Keys are written readable by their owner only.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import re
import sys
from pathlib import Path

from scheduler.inputfile import writers_besides_owner


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tls", help="make TLS certificates for a small cluster")
    actions = p.add_subparsers(dest="tls_action", metavar="ACTION", required=True)
    init = actions.add_parser(
        "init", help="write a CA, a server certificate and client certificates into DIR",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    init.add_argument("dir", type=Path, metavar="DIR", help="directory to write the CA, server and client certificates and keys into (made if missing)")
    init.add_argument("--host", action="append", default=[], required=True, metavar="NAME_OR_IP",
                      help="a name or address clients use to reach the scheduler or a helper "
                      "(repeatable)")
    init.add_argument("--client", action="append", default=[], metavar="NAME",
                      help="also make a client certificate for NAME (repeatable), for mTLS")
    init.add_argument("--days", type=int, default=825, help="validity in days (default 825)")
    init.add_argument("--force", action="store_true", help="overwrite existing files")
    init.set_defaults(func=run)
    client = actions.add_parser(
        "client", help="add client certificates (mutual TLS) signed by DIR's existing CA",
        description="Write NAME.pem and NAME-key.pem for each NAME, signed by the CA that "
        "`gandiva tls init` wrote into DIR (its ca.pem and ca-key.pem): a user added "
        "later, without replacing the cluster's certificates.")
    client.add_argument("dir", type=Path, metavar="DIR", help="the directory `gandiva tls init` wrote")
    client.add_argument("clients", nargs="+", metavar="NAME", help="whom each certificate is for")
    client.add_argument("--days", type=int, default=825,
                        help="validity in days (default 825; never past the CA's own)")
    client.add_argument("--force", action="store_true", help="replace a NAME.pem that exists")
    client.set_defaults(func=run_client)


def _key():  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


class NotWritten(OSError):
    """A file of the set could not be written; none of them was (named by its final path)."""


def _write_set(out: Path, files: list[tuple[str, bytes, bool]]) -> list[Path]:
    """Write every file of a set or none of them (secret ones readable by their owner only).

    Each is written to a temporary beside it first; only once all are there are they renamed
    into place, with Ctrl-C held off for those few renames. Before, a full disk or a Ctrl-C
    half-way left a partial set (a new ca.pem beside the old server.pem under --force: a
    mismatched cluster; in a new DIR a ca.pem that made the rerun ask for --force)."""
    import signal
    import threading

    temps: list[Path] = []
    name = ""
    try:
        for name, data, secret in files:
            tmp = out / f".{name}.tmp"
            tmp.unlink(missing_ok=True)  # left by a run killed outright: made afresh, mode and all
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if secret else 0o644)
            temps.append(tmp)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
    except BaseException as exc:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):  # named as the user knows it, not by its temporary
            raise NotWritten(exc.errno, exc.strerror, str(out / name)) from exc
        raise
    interrupted: list[int] = []
    held = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGINT, lambda signum, _frame: interrupted.append(signum)) if held else None
    try:
        for (name, _, _), tmp in zip(files, temps):
            tmp.rename(out / name)
    finally:
        if held:
            signal.signal(signal.SIGINT, before)
    if interrupted:
        raise KeyboardInterrupt
    return [out / name for name, _, _ in files]


def _pem_key(key) -> bytes:  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


# Certificates are valid from a day before they are made. Made valid from "now", a host whose
# clock ran behind the machine that made them (by seconds: NTP not yet synced after a boot, a
# drifting clock) refused them as "certificate is not yet valid" in every TLS handshake: its
# helper could not reach the scheduler, nor the scheduler accept it under mutual TLS, until its
# clock caught up, the helper retrying with no word of why but at gRPC's debug verbosity
# (tests/scheduler/cli/test_tls_clock.py). Backdating is what CAs commonly do for it.
BACKDATE = datetime.timedelta(days=1)


def make_certificates(out: Path, hosts: list[str], clients: list[str], days: int = 825) -> list[Path]:
    """Write the CA, server and client files; returns the paths written."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    until = now + datetime.timedelta(days=days)
    since = now - BACKDATE
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Gandiva cluster CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(since).not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))

    def leaf(cn: str, sans: list[x509.GeneralName], usage: list[x509.ObjectIdentifier]):  # type: ignore[no-untyped-def]
        return _leaf(ca_key, ca_name, cn, sans, usage, since, until)

    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    out.mkdir(mode=0o755, parents=True, exist_ok=True)  # not 775 under a umask of 002: see _not_own_dir
    pem = serialization.Encoding.PEM
    files = [("ca.pem", ca.public_bytes(pem), False), ("ca-key.pem", _pem_key(ca_key), True)]
    # Also a client certificate: a helper presents it to the scheduler and its peers (mTLS).
    skey, scert = leaf(hosts[0], sans, [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    files += [("server.pem", scert.public_bytes(pem), False), ("server-key.pem", _pem_key(skey), True)]
    for name in clients:
        ckey, ccert = leaf(name, [], [ExtendedKeyUsageOID.CLIENT_AUTH])
        files += [(f"{name}.pem", ccert.public_bytes(pem), False), (f"{name}-key.pem", _pem_key(ckey), True)]
    return _write_set(out, files)


def _leaf(ca_key, ca_name, cn, sans, usage, since, until):  # type: ignore[no-untyped-def]
    """A key and its certificate for ``cn``, signed by the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    key = _key()
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
               .issuer_name(ca_name).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(since).not_valid_after(until)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usage), critical=False))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def add_clients(out: Path, clients: list[str], days: int = 825) -> list[Path]:
    """Client pairs signed by the CA already in ``out`` (its ca.pem and ca-key.pem): a user
    added under mutual TLS without replacing the cluster's certificates."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID

    ca = x509.load_pem_x509_certificate((out / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((out / "ca-key.pem").read_bytes(), password=None)
    now = datetime.datetime.now(datetime.timezone.utc)
    until = min(now + datetime.timedelta(days=days), ca.not_valid_after_utc)
    files = []
    for name in clients:
        key, cert = _leaf(ca_key, ca.subject, name, [], [ExtendedKeyUsageOID.CLIENT_AUTH], now - BACKDATE, until)
        files += [(f"{name}.pem", cert.public_bytes(serialization.Encoding.PEM), False),
                  (f"{name}-key.pem", _pem_key(key), True)]
    return _write_set(out, files)


# A DNS name as certificates carry it: labels of letters, digits and hyphens (not at
# either end), dot-separated; a leading "*." for a wildcard. 253 characters at most,
# and the first name is also the certificate's common name, which X.509 bounds to 64.
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
MAX_COMMON_NAME = 64


def check_host(host: str, first: bool = False) -> str | None:
    """Why ``host`` cannot be a certificate's name or address, or None when it can."""
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    if not host:
        return "is empty; give the name or IP address clients use to reach the server"
    name = host.removesuffix(".")
    labels = name.split(".")
    if labels[0] == "*":
        labels = labels[1:]
    if not labels or len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        return ("is neither an IP address nor a valid DNS name (letters, digits and hyphens, "
                "in dot-separated parts)")
    if first and len(host) > MAX_COMMON_NAME:
        return (f"is longer than {MAX_COMMON_NAME} characters, the most a certificate's common "
                "name may have; give a shorter --host first (later ones may be longer)")
    return None


# A client's files are NAME.pem and NAME-key.pem beside ca(-key).pem and server(-key).pem.
_CLIENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]*$")


def _bad_client(clients: list[str], flag: str) -> str:
    """Why a client name cannot be a file name and common name ("" when all can).

    Names whose files are another's are refused: `--client ca-key` wrote its certificate
    over the CA's key (and `server-key`, `bob-key` beside `bob`, or `bob` twice: over
    another key or pair), then said "no certificate was written or replaced"."""
    bad = [c for c in clients if not _CLIENT.match(c)]
    if bad:
        return (f"{flag}{bad[0]!r}: use a plain name (letters, digits and '_.@+-', starting with a "
                "letter or digit)")
    taken = [c for c in clients if c in ("ca", "server") or c.endswith("-key")]
    if taken:
        return (f"{flag}{taken[0]!r}: its files would take the place of another's (NAME.pem and "
                "NAME-key.pem beside ca.pem, ca-key.pem, server.pem, server-key.pem); use another "
                "name (not ca or server, not ending in -key)")
    twice = sorted({c for c in clients if clients.count(c) > 1})
    if twice:
        return f"{flag}{twice[0]!r} is given twice; give each name once"
    long_client = [c for c in clients if len(c) > MAX_COMMON_NAME]
    if long_client:
        return (f"{flag}{long_client[0][:20]!r}...: longer than {MAX_COMMON_NAME} "
                "characters, the most a certificate's common name may have")
    return ""


def _not_own_dir(path: Path) -> str:
    """Why the keys must not go into ``path`` ("" when they may): a directory of another
    user's, or one every user or its group may write in (no sticky bit), lets them replace ca.pem and
    server.pem later (their own CA, trusted by every client given it). `tls init /tmp/pki`
    into a /tmp/pki another user had made wrote the cluster's keys there, exit 0."""
    try:
        st = path.stat()
    except OSError:
        return ""  # made by us, or refused for what it is below
    if not path.is_dir():
        return ""
    if st.st_uid != os.geteuid():
        return (f"{path} belongs to another user (uid {st.st_uid}; this is uid {os.geteuid()}), who could "
                "replace the certificates written there; give a directory of your own")
    # Its group too: a directory of mode 775 (a umask of 002, usual where each user has a
    # group of their own, and then shared) let its group's members replace ca.pem.
    if who := writers_besides_owner(st.st_mode, sticky_ok=True):
        return (f"{path} may be written by {who} (mode {st.st_mode & 0o7777:o}), who could replace the "
                f"certificates written there; make it its owner's to write: chmod go-w {path} (or give "
                "a directory of your own)")
    return ""


# The last moment an X.509 certificate can name (RFC 5280's GeneralizedTime has four digits
# of year), and Python's datetime too.
LAST_VALID = datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=datetime.timezone.utc)


def _bad_days(days: int) -> str:
    """Why --days cannot be a certificate's validity ("" when it can)."""
    if days < 1:
        return f"--days must be 1 or more, got {days}"
    most = (LAST_VALID - datetime.datetime.now(datetime.timezone.utc)).days
    if days > most:
        # (It was an OverflowError traceback: "date value out of range".)
        shown = str(days) if len(str(days)) <= 24 else f"{str(days)[:8]}... ({len(str(days))} digits)"
        return (f"--days {shown}: a certificate cannot be valid past the year 9999; give at most {most:,} "
                "(the default 825 is about two years)")
    return ""


def run_client(args: argparse.Namespace) -> int:
    why = _bad_client(args.clients, "NAME ") or _not_own_dir(args.dir) or _bad_days(args.days)
    if not why and not ((args.dir / "ca.pem").is_file() and (args.dir / "ca-key.pem").is_file()):
        why = (f"{args.dir} has no ca.pem and ca-key.pem; give the directory `gandiva tls init` wrote "
               "(with its CA key), or make one with gandiva tls init")
    taken = [c for c in args.clients if (args.dir / f"{c}.pem").exists()]
    if not why and taken and not args.force:
        why = f"{args.dir / (taken[0] + '.pem')} exists; pass --force to replace it"
    if why:
        print(f"gandiva tls: {why}", file=sys.stderr)
        return 2
    try:
        written = add_clients(args.dir, args.clients, args.days)
    except NotWritten as exc:
        print(f"gandiva tls: cannot write {exc.filename} ({exc.strerror}); no certificate was written "
              "or replaced", file=sys.stderr)
        return 2
    except (OSError, ValueError, TypeError) as exc:  # unreadable, not PEM, an encrypted key
        print(f"gandiva tls: cannot use the CA in {args.dir} ({exc}); give the directory `gandiva "
              "tls init` wrote", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def run(args: argparse.Namespace) -> int:
    why = _bad_client(args.client, "--client ") or _not_own_dir(args.dir)
    if why:
        print(f"gandiva tls: {why}", file=sys.stderr)
        return 2
    for i, host in enumerate(args.host):
        host_why = check_host(host, first=i == 0)
        if host_why:
            print(f"gandiva tls: --host {host!r} {host_why}", file=sys.stderr)
            return 2
    if days_why := _bad_days(args.days):
        print(f"gandiva tls: {days_why}", file=sys.stderr)
        return 2
    if args.dir.exists() and not args.dir.is_dir():
        print(f"gandiva tls: {args.dir} exists and is not a directory; give a directory to "
              "write the certificates into", file=sys.stderr)
        return 2
    existing = [p for p in ("ca.pem", "server.pem") if (args.dir / p).exists()]
    if existing and not args.force:
        print(f"gandiva tls: {args.dir / existing[0]} exists; pass --force to replace the "
              "cluster's certificates", file=sys.stderr)
        return 2
    try:
        written = make_certificates(args.dir, args.host, args.client, args.days)
    except OSError as exc:
        print(f"gandiva tls: cannot write {exc.filename or args.dir} ({exc.strerror or exc}); no "
              "certificate was written or replaced; give a directory you can create and write", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    print(f"scheduler: gandiva scheduler --tls-cert {args.dir}/server.pem --tls-key "
          f"{args.dir}/server-key.pem ...; clients: --tls-ca {args.dir}/ca.pem "
          "(or GANDIVA_TLS_CA)", file=sys.stderr)
    return 0
