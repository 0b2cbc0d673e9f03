"""The command lines: `gandiva-submit` and the `gandiva` subcommands."""

import os

# gRPC's core printed its own INFO lines on stderr before this package's one-line errors
# ("I1205 ... ssl_transport_security.cc:2563] Handshake failed ..." for a --tls-ca given to a
# plaintext scheduler), and into `--log-format json` logs. Set before grpc is first imported
# (every CLI entry point imports this package first); GRPC_VERBOSITY in the environment wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
