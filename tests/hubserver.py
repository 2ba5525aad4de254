"""A local stand-in for the Hugging Face Hub's file endpoint, on 127.0.0.1 only.

It answers the way huggingface.co does for LFS files, so the real huggingface_hub
client runs unchanged against it (through HF_ENDPOINT):

* ``HEAD|GET /{owner}/{repo}/resolve/{revision}/{path}`` on the "hub" port answers
  302 with ``X-Repo-Commit``, ``X-Linked-Etag`` (the file's sha256) and
  ``X-Linked-Size``, redirecting to the "cdn" port (another origin, like the Hub's
  CDN, so the client stops there and drops the token). Errors carry the Hub's
  ``X-Error-Code`` header: RepoNotFound (401), GatedRepo (403), EntryNotFound (404),
  RevisionNotFound (404).
* ``HEAD|GET /blobs/{sha256}`` on the "cdn" port serves the bytes with ``Range``
  support (206 + Content-Range).

Faults for tests: drop the connection once after N bytes, serve a corrupted body,
an outage (503), and a slow link. Every request is logged with what was sent.
"""

from __future__ import annotations

import hashlib
import random
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

CHUNK = 64 * 1024


def make_gguf(size: int, seed: int = 0, name: str = "synthetic", vocab: int = 64, nextn: int = 0) -> bytes:
    """A valid GGUF file of exactly ``size`` bytes: a small BPE vocabulary (the same for every
    seed, so any two are a compatible pair) and one int8 tensor of random bytes. ``nextn``: a
    qwen35 header that says the model carries that many NextN (MTP) layers."""
    def string(s: str) -> bytes:
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    arch = "qwen35" if nextn else "llama"
    kv = b""
    for key, value in (("general.architecture", arch), ("general.name", name), ("tokenizer.ggml.model", "gpt2")):
        kv += string(key) + struct.pack("<I", 8) + string(value)
    if nextn:
        kv += string(f"{arch}.nextn_predict_layers") + struct.pack("<II", 4, nextn)
    kv += string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, vocab)
    kv += b"".join(string(f"tok{i}") for i in range(vocab))
    for key, value in (("tokenizer.ggml.bos_token_id", 1), ("tokenizer.ggml.eos_token_id", 2)):
        kv += string(key) + struct.pack("<II", 4, value)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 6 + bool(nextn)) + kv
    head += string("blob") + struct.pack("<I", 1)
    shape_at = len(head)
    head += struct.pack("<Q", 0) + struct.pack("<I", 24) + struct.pack("<Q", 0)  # shape, I8, offset 0
    data_offset = (len(head) + 31) // 32 * 32
    n = size - data_offset
    assert n > 0, "size too small for a GGUF"
    head = head[:shape_at] + struct.pack("<Q", n) + head[shape_at + 8:]
    body = random.Random(seed).randbytes(n)
    return head + b"\0" * (data_offset - len(head)) + body


@dataclass
class Blob:
    size: int
    sha256: str
    data: bytes | None = None
    path: Path | None = None

    def read(self, start: int, end: int) -> bytes:
        if self.data is not None:
            return self.data[start:end]
        with open(self.path, "rb") as f:  # type: ignore[arg-type]
            f.seek(start)
            return f.read(end - start)


@dataclass
class Request:
    port: str  # "hub" or "cdn"
    method: str
    path: str
    range: str | None
    authorization: str | None
    status: int = 0
    sent: int = 0


@dataclass
class HubServer:
    repos: dict[str, dict[str, Blob]] = field(default_factory=dict)
    commits: dict[str, str] = field(default_factory=dict)
    gated: set[str] = field(default_factory=set)
    tokens: set[str] = field(default_factory=set)
    log: list[Request] = field(default_factory=list)
    drop_after: dict[str, int] = field(default_factory=dict)  # sha256 -> bytes, once
    corrupt: set[str] = field(default_factory=set)  # sha256 of blobs served with one byte flipped
    outage: bool = False
    delay: float = 0.0  # seconds per 64 kB chunk
    _servers: list[ThreadingHTTPServer] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---- content ---------------------------------------------------------------------------

    def add_bytes(self, repo: str, path: str, data: bytes) -> Blob:
        blob = Blob(len(data), hashlib.sha256(data).hexdigest(), data=data)
        self._add(repo, path, blob)
        return blob

    def add_file(self, repo: str, path: str, source: Path, sha256: str) -> Blob:
        """Serve a file from disk (hashing a GB file per test would be slow: pass its known hash)."""
        blob = Blob(source.stat().st_size, sha256, path=source)
        self._add(repo, path, blob)
        return blob

    def _add(self, repo: str, path: str, blob: Blob) -> None:
        self.repos.setdefault(repo, {})[path] = blob
        self.commits.setdefault(repo, hashlib.sha1(repo.encode()).hexdigest())

    def blob(self, sha256: str) -> Blob | None:
        for files in self.repos.values():
            for blob in files.values():
                if blob.sha256 == sha256:
                    return blob
        return None

    # ---- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._servers[0].server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self._servers[1].server_address[1]}"

    def start(self) -> "HubServer":
        for role in ("hub", "cdn"):
            server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, role))
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self._servers.append(server)
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def requests(self, method: str | None = None, port: str | None = None) -> list[Request]:
        return [r for r in self.log if (method is None or r.method == method) and (port is None or r.port == port)]

    def bytes_sent(self, sha256: str) -> int:
        return sum(r.sent for r in self.log if r.port == "cdn" and r.path.endswith(sha256))


def _handler(hub: HubServer, role: str):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # keep pytest output clean
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            entry = Request(role, self.command, unquote(urlsplit(self.path).path), self.headers.get("Range"),
                            self.headers.get("Authorization"))
            with hub._lock:
                hub.log.append(entry)
            try:
                if role == "hub":
                    self._resolve(entry, body)
                else:
                    self._blob(entry, body)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _reply(self, entry: Request, status: int, headers: dict[str, str], payload: bytes = b"",
                   body: bool = True) -> None:
            entry.status = status
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if body and payload:
                self.wfile.write(payload)

        def _error(self, entry: Request, status: int, code: str, message: str, body: bool,
                   extra: dict[str, str] | None = None) -> None:
            self._reply(entry, status, {"X-Error-Code": code, "X-Error-Message": message,
                                        "Content-Type": "application/json", **(extra or {})},
                        ('{"error": "%s"}' % message).encode(), body)

        def _resolve(self, entry: Request, body: bool) -> None:
            m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", entry.path)
            if not m:
                return self._error(entry, 404, "RepoNotFound", "Not found", body)
            repo, revision, path = m.groups()
            files = hub.repos.get(repo)
            if files is None:
                return self._error(entry, 401, "RepoNotFound", "Repository not found", body)
            token = (entry.authorization or "").removeprefix("Bearer ")
            if repo in hub.gated and token not in hub.tokens:
                return self._error(entry, 403, "GatedRepo", f"Access to model {repo} is restricted. You must "
                                   "have access to it and be authenticated to access it. Please log in.", body)
            commit = hub.commits[repo]
            if revision not in ("main", commit):
                return self._error(entry, 404, "RevisionNotFound", "Invalid rev id", body)
            blob = files.get(path)
            if blob is None:
                return self._error(entry, 404, "EntryNotFound", "Entry not found", body,
                                   {"X-Repo-Commit": commit})
            self._reply(entry, 302, {
                "Location": f"{hub.cdn_url}/blobs/{blob.sha256}",
                "X-Repo-Commit": commit,
                "X-Linked-Etag": f'"{blob.sha256}"',
                "X-Linked-Size": str(blob.size),
                "ETag": f'"{hashlib.sha1(blob.sha256.encode()).hexdigest()}"',  # the LFS pointer's git hash
                "Accept-Ranges": "bytes",
            }, body=body)

        def _blob(self, entry: Request, body: bool) -> None:
            m = re.fullmatch(r"/blobs/([0-9a-f]{64})", entry.path)
            blob = hub.blob(m.group(1)) if m else None
            if blob is None:
                return self._reply(entry, 404, {}, b"not found", body)
            if hub.outage:
                return self._reply(entry, 503, {"Retry-After": "0"}, b"unavailable", body)
            start, end, status = 0, blob.size, 200
            if entry.range:
                rm = re.fullmatch(r"bytes=(\d+)-(\d*)", entry.range)
                if not rm or int(rm.group(1)) >= blob.size:
                    return self._reply(entry, 416, {"Content-Range": f"bytes */{blob.size}"}, b"", body)
                start = int(rm.group(1))
                end = min(int(rm.group(2)) + 1, blob.size) if rm.group(2) else blob.size
                status = 206
            entry.status = status
            self.send_response(status)
            self.send_header("Content-Length", str(end - start))
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{blob.sha256}"')
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{blob.size}")
            self.end_headers()
            if not body:
                return
            drop = hub.drop_after.pop(blob.sha256, None) if self.command == "GET" else None
            pos = start
            while pos < end:
                piece = blob.read(pos, min(pos + CHUNK, end))
                if blob.sha256 in hub.corrupt and pos <= blob.size // 2 < pos + len(piece):
                    i = blob.size // 2 - pos
                    piece = piece[:i] + bytes([piece[i] ^ 0xFF]) + piece[i + 1:]
                if drop is not None and entry.sent + len(piece) >= drop:
                    piece = piece[: drop - entry.sent]
                    self.wfile.write(piece)
                    entry.sent += len(piece)
                    self.wfile.flush()
                    # the connection dies mid-body, as on a flaky link
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self.wfile.write(piece)
                entry.sent += len(piece)
                pos += len(piece)
                if hub.delay:
                    time.sleep(hub.delay)

    return Handler


def point_hub(monkeypatch, url: str) -> None:
    """Point huggingface_hub at ``url`` through HF_ENDPOINT, with no token and not offline.

    huggingface_hub copies HF_ENDPOINT into ``constants.ENDPOINT`` once, at import, and
    uses that copy for its own background calls; mirror the variable there too, so not
    one request leaves 127.0.0.1.
    """
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", url)
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    # never read a token from the developer's own ~/.cache/huggingface
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", "/nonexistent/speculum-test-token")


@pytest.fixture
def hub(monkeypatch):
    """A running local Hub with huggingface_hub pointed at it."""
    server = HubServer().start()
    point_hub(monkeypatch, server.url)
    yield server
    server.stop()


def closed_port_url() -> str:
    """An address on 127.0.0.1 where nothing listens: the network is 'down'."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
