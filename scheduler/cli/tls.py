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


def _key():  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, data: bytes, secret: bool = False) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.rename(path)


def _pem_key(key) -> bytes:  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_certificates(out: Path, hosts: list[str], clients: list[str], days: int = 825) -> list[Path]:
    """Write the CA, server and client files; returns the paths written."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    until = now + datetime.timedelta(days=days)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Gandiva cluster CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))

    def leaf(cn: str, sans: list[x509.GeneralName], usage: list[x509.ObjectIdentifier]):  # type: ignore[no-untyped-def]
        key = _key()
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
                   .issuer_name(ca_name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now).not_valid_after(until)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usage), critical=False))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return key, builder.sign(ca_key, hashes.SHA256())

    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    out.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    written = []
    files = [("ca.pem", ca.public_bytes(pem), False), ("ca-key.pem", _pem_key(ca_key), True)]
    # Also a client certificate: a helper presents it to the scheduler and its peers (mTLS).
    skey, scert = leaf(hosts[0], sans, [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    files += [("server.pem", scert.public_bytes(pem), False), ("server-key.pem", _pem_key(skey), True)]
    for name in clients:
        ckey, ccert = leaf(name, [], [ExtendedKeyUsageOID.CLIENT_AUTH])
        files += [(f"{name}.pem", ccert.public_bytes(pem), False), (f"{name}-key.pem", _pem_key(ckey), True)]
    for fname, data, secret in files:
        _write(out / fname, data, secret)
        written.append(out / fname)
    return written


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


def run(args: argparse.Namespace) -> int:
    bad = [c for c in args.client if not c or "/" in c or c.startswith(".") or c in ("ca", "server")]
    if bad:
        print(f"gandiva tls: --client {bad[0]!r}: use a plain name (not ca or server)", file=sys.stderr)
        return 2
    long_client = [c for c in args.client if len(c) > MAX_COMMON_NAME]
    if long_client:
        print(f"gandiva tls: --client {long_client[0][:20]!r}...: longer than {MAX_COMMON_NAME} "
              "characters, the most a certificate's common name may have", file=sys.stderr)
        return 2
    for i, host in enumerate(args.host):
        why = check_host(host, first=i == 0)
        if why:
            print(f"gandiva tls: --host {host!r} {why}", file=sys.stderr)
            return 2
    if args.days < 1:
        print(f"gandiva tls: --days must be 1 or more, got {args.days}", file=sys.stderr)
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
        print(f"gandiva tls: cannot write {exc.filename or args.dir} ({exc.strerror or exc}); give "
              "a directory you can create and write", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    print(f"scheduler: gandiva scheduler --tls-cert {args.dir}/server.pem --tls-key "
          f"{args.dir}/server-key.pem ...; clients: --tls-ca {args.dir}/ca.pem "
          "(or GANDIVA_TLS_CA)", file=sys.stderr)
    return 0
