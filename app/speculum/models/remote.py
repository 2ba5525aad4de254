"""Files on the Hugging Face Hub: where they are, what they are, and their GGUF header.

Everything goes through huggingface_hub (its session, auth headers, HEAD metadata and
error types), so HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE behave as users expect. The
endpoint and offline flag are read from the environment on every call, because
huggingface_hub only reads them once, at import.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable
from urllib.parse import quote, unquote, urlsplit

import httpx2
from huggingface_hub import constants, get_hf_file_metadata
from huggingface_hub.errors import (
    GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled, RemoteEntryNotFoundError,
    RepositoryNotFoundError, RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff

from ..errors import SpeculumError
from .names import SHA256_RE, _shown, ref_problem
from .compat import Compatibility, check_headers, drafts_for_itself
from .gguf import VOCAB_KEYS, GGUFHeader, read_file_header, read_header

_TRUE = {"1", "on", "yes", "true"}
_SHA1 = re.compile(r"^[0-9a-f]{40}$")
LIBRARY_NAME = "speculum"


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def offline() -> bool:
    env = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return env.strip().lower() in _TRUE or constants.HF_HUB_OFFLINE


@dataclass(frozen=True)
class HubRef:
    """One file in a Hub repository. Refuses names that could escape the models folder."""

    repo: str
    path: str
    revision: str = "main"

    def __post_init__(self) -> None:
        why = ref_problem(self.repo, self.path, self.revision)
        if why:
            raise SpeculumError(f"Refusing the Hub file '{_shown(self.repo)}/{_shown(self.path)}' "
                                f"(revision '{_shown(self.revision)}'): {why}.")

    @property
    def filename(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def __str__(self) -> str:
        rev = "" if self.revision == "main" else f"@{self.revision}"
        return f"hf:{self.repo}{rev}/{self.path}"

    @classmethod
    def parse(cls, text: str) -> "HubRef | None":
        """``hf:OWNER/REPO[@REV]/PATH`` or a ``.../OWNER/REPO/(resolve|blob)/REV/PATH`` URL; None otherwise."""
        if text.startswith("hf:"):
            m = re.fullmatch(r"hf:([^/@]+)/([^/@]+)(?:@([^/]+))?/(.+)", text, re.DOTALL)
            if not m:
                raise SpeculumError(f"'{text}' is not a Hub file: write hf:OWNER/REPO/FILE.gguf.")
            return cls(f"{m.group(1)}/{m.group(2)}", m.group(4), m.group(3) or "main")
        if re.match(r"https?://", text):
            parts = [unquote(p) for p in urlsplit(text).path.strip("/").split("/")]
            if len(parts) >= 5 and parts[2] in ("resolve", "blob"):
                return cls(f"{parts[0]}/{parts[1]}", "/".join(parts[4:]), parts[3])
            raise SpeculumError(f"'{text}' is not a link to a file on the Hub (…/OWNER/REPO/resolve/main/FILE).")
        return None


@dataclass(frozen=True)
class RemoteFile:
    ref: HubRef
    url: str  # where the bytes are served (the CDN location after the Hub's redirect)
    size: int
    etag: str
    commit: str

    @property
    def sha256(self) -> str | None:
        """The Hub's LFS hash of the content: large files are LFS and their ETag is it."""
        return self.etag if SHA256_RE.match(self.etag) else None

    @property
    def git_sha1(self) -> str | None:
        return self.etag if _SHA1.match(self.etag) else None


def hub_error(exc: BaseException, ref: HubRef | None = None) -> SpeculumError:
    """One plain sentence for anything the Hub or the network can throw at us."""
    where = endpoint()
    what = f"{ref.path} in {ref.repo}" if ref else "the file"
    repo = ref.repo if ref else "the repository"
    if isinstance(exc, SpeculumError):
        return exc
    if isinstance(exc, OfflineModeIsEnabled):
        return SpeculumError(f"Offline mode is on (HF_HUB_OFFLINE=1), so {what} cannot be fetched from the Hub.")
    if isinstance(exc, GatedRepoError):
        who = ("the account of your HF_TOKEN has not been granted access yet" if os.environ.get("HF_TOKEN")
               else "then set HF_TOKEN to an access token of that account")
        return SpeculumError(f"{repo} is a gated repository: open {where}/{repo} and accept its licence "
                             f"with your Hugging Face account; {who}.")
    if isinstance(exc, RepositoryNotFoundError):
        return SpeculumError(f"The repository {repo} was not found on the Hub at {where}. Check the name; "
                             "if it is private, set HF_TOKEN to a token that can read it.")
    if isinstance(exc, RevisionNotFoundError):
        return SpeculumError(f"Revision '{ref.revision if ref else '?'}' of {repo} was not found on the Hub.")
    if isinstance(exc, RemoteEntryNotFoundError):
        return SpeculumError(f"{ref.path if ref else 'The file'} was not found in the repository {repo} on the Hub.")
    if isinstance(exc, HfHubHTTPError):
        code = exc.response.status_code if exc.response is not None else 0
        if code == 401:
            return SpeculumError(f"The Hub at {where} rejected the access token in HF_TOKEN; create a new one "
                                 "at https://huggingface.co/settings/tokens.")
        if code == 403:
            return SpeculumError(f"The Hub refused access to {what} (403); your token may lack read permission.")
        if code == 429:
            return SpeculumError("The Hub is rate-limiting this machine; wait a minute and run the download "
                                 "again: it resumes where it stopped.")
        if code >= 500:
            return SpeculumError(f"The Hub at {where} had a server problem ({code}); run the download again "
                                 "later: it resumes where it stopped.")
        return SpeculumError(f"The Hub answered {code} for {what}.")
    if isinstance(exc, httpx2.ProxyError):
        return SpeculumError(f"The proxy refused the connection to {where}; check HTTPS_PROXY.")
    if isinstance(exc, (httpx2.ConnectError, httpx2.TimeoutException, httpx2.NetworkError,
                        httpx2.RemoteProtocolError)):
        return SpeculumError(f"Cannot reach the Hugging Face Hub at {where}: no network, or the connection "
                             "dropped. Check your connection and try again (downloads resume where they "
                             "stopped), or set HF_HUB_OFFLINE=1 to use only the models on disk.")
    return SpeculumError(f"Talking to the Hub failed for {what}: {exc}")


def _origin(url: str) -> tuple[str, str, int | None]:
    s = urlsplit(url)
    return s.scheme, s.hostname or "", s.port


def request_headers(url: str) -> dict[str, str]:
    """huggingface_hub's headers (user agent, HF_TOKEN), without the token for CDN hosts."""
    headers = build_hf_headers(library_name=LIBRARY_NAME)
    if _origin(url) != _origin(endpoint()):
        headers.pop("authorization", None)
    return headers


def resolve(ref: HubRef) -> RemoteFile:
    """HEAD the file on the Hub: size, LFS hash, commit and the URL its bytes come from."""
    if offline():
        raise hub_error(OfflineModeIsEnabled("offline"), ref)
    # huggingface_hub's hf_hub_url() bakes in the endpoint it saw at import; build the same URL now
    url = f"{endpoint()}/{ref.repo}/resolve/{quote(ref.revision, safe='')}/{quote(ref.path)}"
    try:
        meta = get_hf_file_metadata(url, endpoint=endpoint(), library_name=LIBRARY_NAME)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one sentence
        raise hub_error(exc, ref) from None
    if not meta.commit_hash or not meta.etag:
        raise SpeculumError(f"{endpoint()} does not answer like the Hugging Face Hub (no commit or ETag for "
                            f"{ref.path}); check HF_ENDPOINT.")
    if meta.size is None:
        raise SpeculumError(f"The Hub did not report the size of {ref.path} in {ref.repo}.")
    return RemoteFile(ref, meta.location, int(meta.size), meta.etag, meta.commit_hash)


class RangeReader:
    """``read_at(offset, size)`` over HTTP range requests."""

    def __init__(self, remote: RemoteFile):
        self.remote = remote

    def read_at(self, offset: int, size: int) -> bytes:
        if offset >= self.remote.size or size <= 0:
            return b""
        end = min(offset + size, self.remote.size) - 1
        headers = {**request_headers(self.remote.url), "Range": f"bytes={offset}-{end}",
                   "Accept-Encoding": "identity"}
        try:
            with http_stream_backoff("GET", self.remote.url, headers=headers,
                                     timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT, max_retries=2) as resp:
                hf_raise_for_status(resp)
                if resp.status_code != 206 and offset > 0:
                    raise SpeculumError(f"The server of {self.remote.ref.path} does not answer range requests, "
                                        "so its header cannot be read without downloading it.")
                want = end - offset + 1
                out = bytearray()
                for chunk in resp.iter_bytes():
                    out += chunk
                    if len(out) >= want:  # a server that ignored Range at offset 0: stop early
                        break
        except SpeculumError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise hub_error(exc, self.remote.ref) from None
        return bytes(out[:want])


def read_remote_header(ref: HubRef, keep_arrays: Iterable[str] = VOCAB_KEYS) -> GGUFHeader:
    """The GGUF header of a Hub file, fetched with range requests (a few MB of a many-GB file)."""
    remote = resolve(ref)
    reader = RangeReader(remote)
    return read_header(reader.read_at, source=str(ref), keep_arrays=keep_arrays)  # counts bytes_read


def parse_source(text: str | os.PathLike) -> HubRef | Path:
    """A Hub reference (hf:… or a Hub URL) or a local path."""
    if isinstance(text, HubRef):
        return text
    ref = HubRef.parse(str(text))
    return ref if ref is not None else Path(text)


def read_any_header(source: HubRef | Path) -> GGUFHeader:
    if isinstance(source, HubRef):
        return read_remote_header(source)
    return read_file_header(source, VOCAB_KEYS)


def check_sources(target: HubRef | Path, draft: HubRef | Path | None,
                  on_header: Callable[[HubRef | Path, GGUFHeader], None] | None = None) -> Compatibility:
    """Compatibility of any mix of local files and Hub files; Hub files are not downloaded.
    No draft: whether the target drafts for itself (NextN layers)."""
    headers = []
    for source in (target, draft) if draft is not None else (target,):
        header = read_any_header(source)
        if on_header:
            on_header(source, header)
        headers.append(header)
    if draft is None:
        return drafts_for_itself(headers[0])
    verdict = check_headers(*headers)
    if verdict and headers[0].nextn_layers:
        return Compatibility(True, f"{verdict.reason} The target also drafts for itself with its "
                                   f"{headers[0].nextn_layers} NextN (MTP) layer(s): --mode mtp needs no draft.")
    return verdict
