"""Worker addresses as the user writes them: ``HOST:PORT`` (the plain link) or the pairing
string a worker prints, ``HOST:PORT/FINGERPRINT/TOKEN`` (the secure link).

Everything here is typed by a person or pasted from elsewhere: each mistake is one sentence
that shows what was written (shortened, control characters escaped), never a traceback.
No llama.cpp here: the window checks addresses with it.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Sequence

from ...errors import SpeculumError

DEFAULT_PORT = 50052
_PORT = re.compile(r"[0-9]{1,5}")  # ASCII only: int() would take '５００５２' or '50_052'
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?")  # RFC 1035 letters, digits, hyphens
_B64URL = re.compile(r"[A-Za-z0-9_-]+")
FINGERPRINT_CHARS = 43  # a SHA-256 in unpadded base64url
TOKEN_CHARS = 22  # 128 random bits in unpadded base64url
MAX_HOST = 253  # RFC 1035: a name's text, without the final dot
MAX_LABEL = 63
_MAX_SHOWN = 60
_EXAMPLE = f"write HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}, or the pairing string the worker printed"


@dataclass(frozen=True)
class WorkerAddress:
    host: str  # an IPv4 or IPv6 address or a DNS name, without brackets
    port: int
    fingerprint: str = ""  # SHA-256 of the worker's certificate (base64url): the secure link when set
    token: str = ""  # the worker's secret, presented after the certificate checks out

    @property
    def name(self) -> str:
        """HOST:PORT, IPv6 in brackets: how the worker is named to the user (never the token)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def secure(self) -> bool:
        return bool(self.fingerprint)

    def text(self) -> str:
        """As written on the command line: the pairing string, or HOST:PORT."""
        return f"{self.name}/{self.fingerprint}/{self.token}" if self.secure else self.name


def shown(text: str) -> str:
    """What the user wrote, safe for one line of a terminal: short, control characters escaped."""
    cut = text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN - 1] + "…"
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in cut)


def check_port(text: str, name: str = "The port", where: str = "") -> int:
    """A TCP port written in ASCII digits, 1-65535; ``where`` the text it came from, for the message."""
    if not _PORT.fullmatch(text) or not 0 < int(text) < 65536:
        plain = text.isdigit() and not text.isascii()
        context = f" (in '{shown(where)}')" if where else ""
        raise SpeculumError(f"{name} '{shown(text)}'{context} " + ("is written in non-ASCII digits: use 0-9." if plain
                            else "is not a port: write a number from 1 to 65535."))
    return int(text)


def check_host(host: str, item: str) -> str:
    """An IP address or a DNS name as RFC 1035 allows it (253 characters, labels of 63)."""
    if not host:
        raise SpeculumError(f"'{shown(item)}' names no host: {_EXAMPLE}.")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not host.isascii():
        raise SpeculumError(f"The host name '{shown(host)}' has non-ASCII characters: write its ASCII (xn--) form.")
    name = host[:-1] if host.endswith(".") else host
    if len(name) > MAX_HOST:
        raise SpeculumError(f"The host name '{shown(host)}' is {len(name)} characters long; "
                            f"a DNS name has at most {MAX_HOST}.")
    labels = name.split(".")
    for label in labels:
        if len(label) > MAX_LABEL:
            raise SpeculumError(f"The host name '{shown(host)}' has a part of {len(label)} characters; "
                                f"each part between dots has at most {MAX_LABEL}.")
        if not _LABEL.fullmatch(label):
            raise SpeculumError(f"'{shown(host)}' is not a host name: letters, digits, hyphens and dots only, "
                                "no empty parts.")
    if all(label.isdigit() for label in labels):
        raise SpeculumError(f"'{shown(host)}' is not an IPv4 address.")
    return name.lower()


def parse_worker(item: str) -> WorkerAddress:
    """One worker: ``HOST:PORT``, ``[IPv6]:PORT``, or a pairing string ``ADDRESS/FINGERPRINT/TOKEN``."""
    address, *secret = item.split("/")
    if secret and len(secret) != 2:
        raise SpeculumError(f"'{shown(item)}' is not a pairing string: it has the form HOST:PORT/FINGERPRINT/TOKEN; "
                            "copy the whole line the worker printed.")
    if address.startswith("["):
        host, bracket, rest = address[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise SpeculumError(f"'{shown(address)}' is not a worker address: write [IPv6]:PORT, e.g. "
                                f"[::1]:{DEFAULT_PORT}.")
        port_text = rest[1:]
        try:
            host = str(ipaddress.IPv6Address(host))
        except ValueError:
            raise SpeculumError(f"'{shown(host)}' in brackets is not an IPv6 address.") from None
    else:
        host, sep, port_text = address.rpartition(":")
        if not sep:
            raise SpeculumError(f"'{shown(item)}' is not a worker address: {_EXAMPLE}.")
        if ":" in host:
            raise SpeculumError(f"'{shown(address)}' is ambiguous: write an IPv6 address in brackets, "
                                f"e.g. [::1]:{DEFAULT_PORT}.")
        host = check_host(host, item)
    port = check_port(port_text, where=address)
    if not secret:
        return WorkerAddress(host, port)
    fingerprint, token = secret
    for part, size, what in ((fingerprint, FINGERPRINT_CHARS, "certificate fingerprint"),
                             (token, TOKEN_CHARS, "token")):
        if len(part) != size or not part.isascii() or not _B64URL.fullmatch(part):
            raise SpeculumError(f"The {what} in the pairing string for {WorkerAddress(host, port).name} is damaged "
                                f"('{shown(part)}'): copy the whole line the worker printed.")
    return WorkerAddress(host, port, fingerprint, token)


def parse_workers(text: str | Sequence[str]) -> tuple[WorkerAddress, ...]:
    """'A,B,...' (or a list of them), each as ``parse_worker``; SpeculumError when one is malformed."""
    items = text.split(",") if isinstance(text, str) else [i for t in text for i in str(t).split(",")]
    workers: list[WorkerAddress] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        worker = parse_worker(item)
        if any(w.name == worker.name for w in workers):
            raise SpeculumError(f"The worker {worker.name} is listed twice.")
        workers.append(worker)
    if not workers:
        raise SpeculumError(f"No RPC worker given: {_EXAMPLE}.")
    return tuple(workers)
