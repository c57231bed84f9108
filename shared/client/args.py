"""The client commands' way to a frontend (`nanoserve generate`, `tokenize`, `detokenize`): the
connection flags (address, deadline, TLS, bearer token) -> nanoserve.client.Client keywords, and
`Connection`, the same flags spelled out for `nanoserve serve`'s "try:" hint.
"""

import argparse
import os
import shlex
import sys
from dataclasses import dataclass
from typing import Any

from nanoserve.client import DEFAULT_ADDRESS
from nanoserve.errors import ServiceError
from nanoserve.security import is_loopback

# The Node client's variables too (clients/node/README.md): one environment serves both clients.
TOKEN_ENV = "NANOSERVE_TOKEN"
CA_ENV = "NANOSERVE_CA_FILE"
HINT_PROMPT = "Hello"


def pem_file(path: str) -> bytes:
    """An argparse type: the bytes of a PEM file, read once while parsing, so that a missing file
    is a usage error naming its flag."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {e.strerror}") from None


def add_client_args(parser: argparse.ArgumentParser) -> None:
    """The connection flags, in their own section of `parser`'s help."""
    group = parser.add_argument_group("connection")
    group.add_argument(
        "--address",
        default=DEFAULT_ADDRESS,
        help=f"frontend host:port (default: {DEFAULT_ADDRESS})",
    )
    group.add_argument(
        "--timeout", type=float, metavar="SECONDS", help="deadline of the call (default: none)"
    )
    group.add_argument(
        "--tls",
        action="store_true",
        help="connect over TLS, trusting the system's root certificates (implied by the other "
        "--tls-* flags)",
    )
    group.add_argument(
        "--tls-ca-file",
        type=pem_file,
        metavar="FILE",
        default=os.environ.get(CA_ENV) or None,
        help="connect over TLS, trusting this PEM CA bundle (or the frontend's own certificate: "
        f"the file it serves as --tls-cert-file) (env {CA_ENV})",
    )
    group.add_argument(
        "--tls-client-cert-file",
        type=pem_file,
        metavar="FILE",
        help="PEM client certificate, for a frontend that requires one (mutual TLS: its "
        "--tls-client-ca-file signed it)",
    )
    group.add_argument(
        "--tls-client-key-file", type=pem_file, metavar="FILE", help="PEM key of the client cert"
    )
    # The default comes from the environment; argparse shows no default here, so the help text
    # never prints a token.
    group.add_argument(
        "--token",
        metavar="KEY",
        default=os.environ.get(TOKEN_ENV) or None,
        help="bearer token (one of the frontend's api keys), sent as `authorization: Bearer KEY` "
        f"(env {TOKEN_ENV}: prefer it, a command line is visible to other users)",
    )


def client_kwargs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """nanoserve.client.Client keywords from the connection flags; a pair given by half is a
    usage error, and a token about to cross a non-loopback network in plaintext is warned about."""
    if (args.tls_client_cert_file is None) != (args.tls_client_key_file is None):
        parser.error("--tls-client-cert-file and --tls-client-key-file go together")
    kwargs: dict[str, Any] = {"address": args.address, "timeout": args.timeout}
    if args.tls_ca_file is not None:
        kwargs["root_certificates"] = args.tls_ca_file
    elif args.tls or args.tls_client_cert_file is not None:
        kwargs["root_certificates"] = True  # the system's roots
    if args.tls_client_cert_file is not None:
        kwargs["client_cert"] = args.tls_client_cert_file
        kwargs["client_key"] = args.tls_client_key_file
    if args.token:
        kwargs["token"] = args.token
        host = args.address.rsplit(":", 1)[0]
        if "root_certificates" not in kwargs and not is_loopback(host):
            print(
                f"warning: the token goes to {args.address} in plaintext (give --tls-ca-file)",
                file=sys.stderr,
            )
    return kwargs


def print_error(error: ServiceError) -> int:
    """The refusal on stderr as `error: CODE: message` (the message names the field); exit 1."""
    print(f"error: {error.code.name}: {error.message}", file=sys.stderr)
    return 1


@dataclass(frozen=True)
class Connection:
    """What a client needs to reach one frontend, for the hint `nanoserve serve` prints. The token
    is only said to be needed (KEY stands for it): a hint never prints a key."""

    address: str
    ca_file: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None
    needs_token: bool = False

    def flags(self) -> list[str]:
        """The connection flags of the client commands, the token left out."""
        argv = ["--address", self.address]
        for flag, path in (
            ("--tls-ca-file", self.ca_file),
            ("--tls-client-cert-file", self.client_cert_file),
            ("--tls-client-key-file", self.client_key_file),
        ):
            if path is not None:
                argv += [flag, path]
        return argv

    def command(self) -> str:
        """A `nanoserve generate` shell command line."""
        env = f"{TOKEN_ENV}=KEY " if self.needs_token else ""
        return env + shlex.join(["nanoserve", "generate", *self.flags()]) + f' "{HINT_PROMPT}"'

    def python(self) -> str:
        """The same call as a `python -c` line (Python literals inside shell double quotes)."""
        kwargs = "".join(
            f", {name}={value!r}"
            for name, value in (
                ("root_certificates", self.ca_file),
                ("client_cert", self.client_cert_file),
                ("client_key", self.client_key_file),
            )
            if value is not None
        )
        if self.needs_token:
            kwargs += f", token=os.environ[{TOKEN_ENV!r}]"
        imports = "import os; " if self.needs_token else ""
        env = f"{TOKEN_ENV}=KEY " if self.needs_token else ""
        return (
            f'{env}python -c "{imports}from nanoserve import Client; '
            f'print(Client({self.address!r}{kwargs}).generate({HINT_PROMPT!r}).text)"'
        )
