"""The catalog of curated target/draft pairs (data in resources/catalog.json).

A pair is only worth listing when the draft shares the target's tokenizer, so every
entry names a tokenizer ``family`` and both models must belong to it. Models split by
llama.cpp's gguf-split (``-00001-of-00003.gguf``) list every shard; llama.cpp loads
the first one and finds the rest beside it.

An entry whose ``"draft"`` is the string ``"mtp"`` (``MTP``) is a target that drafts for
itself with its own multi-token prediction (NextN) layers: one model, no draft file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..errors import SpeculumError
from .names import SHA256_RE, ref_problem

FAMILIES = {
    # tokenizer family -> substrings one of which every repo/file name in it contains
    "qwen2": ("qwen2",),
    "qwen3": ("qwen3",),
    "llama3": ("llama-3",),
    "gemma3": ("gemma-3",),
    "qwen35": ("qwen3.5", "qwen3.6"),  # Qwen3.5 and 3.6 share one 248k-token vocabulary
}
# The draft of an entry whose target drafts with its own MTP head, in catalog.json and library.json.
MTP = "mtp"
# Families whose models' NextN layers this llama.cpp runs (architectures qwen35 and qwen35moe; glm4moe
# too, but no GLM entry is listed yet: its family comes with the first one, its vocabulary checked).
MTP_FAMILIES = ("qwen35",)
USES = ("code", "chat", "documents")
SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


@dataclass(frozen=True)
class CatalogFile:
    path: str  # path inside the Hub repo
    size: int
    sha256: str | None  # the Hub's LFS hash when known at curation time

    @property
    def filename(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class CatalogModel:
    name: str
    repo: str
    quantization: str
    params_b: float
    files: tuple[CatalogFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def first_file(self) -> CatalogFile:
        return self.files[0]


@dataclass(frozen=True)
class CatalogPair:
    id: str
    name: str
    family: str
    good_at: tuple[str, ...]
    summary: str
    memory_gb: float
    target: CatalogModel
    draft: CatalogModel | None  # None: the target drafts with its own MTP head (catalog.json says "mtp")
    offline: str | None = None  # key of a pair Speculum can assemble without the Hub
    source: str | None = None  # the page the files' names and sizes were read from
    memory_note: str | None = None  # how memory_gb was estimated, where it is not the usual sum

    @property
    def mtp(self) -> bool:
        return self.draft is None

    @property
    def models(self) -> tuple[CatalogModel, ...]:
        """What to download: the target, then the draft if there is one."""
        return (self.target,) if self.draft is None else (self.target, self.draft)

    @property
    def download_size(self) -> int:
        return sum(m.size for m in self.models)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 1e9)


def shard_names(filename: str) -> list[str] | None:
    """All shard names of a gguf-split file given any one of them, else None."""
    m = SHARD_RE.search(filename)
    if not m:
        return None
    total = int(m.group(2))
    stem = filename[: m.start()]
    return [f"{stem}-{i:05d}-of-{total:05d}.gguf" for i in range(1, total + 1)]


def _text(value) -> str | None:
    return None if value is None else str(value)


def _draft(raw, where: str) -> CatalogModel | None:
    if raw == MTP:
        return None
    if isinstance(raw, str):
        raise SpeculumError(f"The model catalog is damaged: {where} is '{raw}', neither a model nor '{MTP}'.")
    return _model(raw, where)


def _model(raw: dict, where: str) -> CatalogModel:
    try:
        files = tuple(CatalogFile(str(f["path"]), int(f["size"]), f.get("sha256")) for f in raw["files"])
        return CatalogModel(str(raw["name"]), str(raw["repo"]), str(raw["quantization"]),
                            float(raw["params_b"]), files)
    except (KeyError, TypeError, ValueError) as exc:
        raise SpeculumError(f"The model catalog is damaged: {where} lacks a valid field ({exc}).") from None


def validate(pair: CatalogPair) -> list[str]:
    """Problems with one entry, in plain words; empty when it is well formed."""
    problems = []
    if not re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", pair.id):
        problems.append(f"id '{pair.id}' must be lower-case letters, digits, dots and dashes")
    if pair.family not in FAMILIES:
        problems.append(f"family '{pair.family}' is not one of {sorted(FAMILIES)}")
    if not pair.good_at or any(u not in USES for u in pair.good_at):
        problems.append(f"good_at {list(pair.good_at)} must be taken from {list(USES)}")
    if pair.memory_gb * 1e9 < pair.download_size:
        problems.append("memory_gb is less than the weights themselves")
    if pair.source is not None and not re.match(r"https?://\S+$", pair.source):
        problems.append(f"source '{pair.source}' is not a web address")
    if pair.mtp:
        if pair.family not in MTP_FAMILIES:
            problems.append(f"draft '{MTP}' needs a family whose models carry NextN layers "
                            f"({', '.join(MTP_FAMILIES)}), not '{pair.family}'")
        if pair.offline:
            problems.append(f"the offline pairs are assembled with a draft file; a '{MTP}' entry cannot be one")
        if not pair.source:
            problems.append(f"a '{MTP}' entry names the page its file and size come from (source)")
    for role, model in zip(("target", "draft"), pair.models):
        if not re.fullmatch(r"[\w.\-]+/[\w.\-]+", model.repo):
            problems.append(f"{role} repo '{model.repo}' is not OWNER/NAME")
        for f in model.files:
            why = ref_problem(model.repo, f.path, "main")
            if why:
                problems.append(f"{role} file '{f.path}' of '{model.repo}' is unsafe: {why}")
        if not model.files:
            problems.append(f"{role} names no file")
        hints = FAMILIES.get(pair.family, ())
        if not any(h in model.repo.lower() for h in hints):
            problems.append(f"{role} repo '{model.repo}' does not look like a {pair.family} model")
        for f in model.files:
            if not f.path.endswith(".gguf"):
                problems.append(f"{role} file '{f.path}' is not a .gguf file")
            if f.size <= 0:
                problems.append(f"{role} file '{f.path}' has no size")
            if f.sha256 is not None and not SHA256_RE.match(f.sha256):
                problems.append(f"{role} file '{f.path}' has a malformed sha256")
            if not any(h in f.filename.lower() for h in hints):
                problems.append(f"{role} file '{f.filename}' does not look like a {pair.family} model")
        names = [f.filename for f in model.files]
        shards = shard_names(names[0]) if names else None
        if shards is not None and names != shards:
            problems.append(f"{role} is split but does not list all shards in order: expected {shards}")
        if shards is None and len(names) > 1:
            problems.append(f"{role} lists several files that are not gguf-split shards")
    if pair.draft is not None and pair.target.params_b <= pair.draft.params_b:
        problems.append("the draft must be smaller than the target")
    return problems


def load(path: str | Path | None = None) -> list[CatalogPair]:
    path = Path(path) if path else paths.resource("catalog.json")
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        raw_pairs = data["pairs"]
    except FileNotFoundError:
        raise SpeculumError(f"The model catalog {path} is missing; reinstall Speculum.") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpeculumError(f"The model catalog {path} cannot be read ({exc}).") from None
    pairs = []
    for i, raw in enumerate(raw_pairs):
        where = f"entry {i + 1}"
        try:
            pair = CatalogPair(
                id=str(raw["id"]), name=str(raw["name"]), family=str(raw["family"]),
                good_at=tuple(raw["good_at"]), summary=str(raw.get("summary", "")),
                memory_gb=float(raw["memory_gb"]),
                target=_model(raw["target"], f"{where} target"), draft=_draft(raw["draft"], f"{where} draft"),
                offline=raw.get("offline"), source=_text(raw.get("source")), memory_note=_text(raw.get("memory_note")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SpeculumError(f"The model catalog is damaged: {where} lacks a valid field ({exc}).") from None
        pairs.append(pair)
    return pairs


def find(pair_id: str, pairs: list[CatalogPair] | None = None) -> CatalogPair:
    pairs = load() if pairs is None else pairs
    for pair in pairs:
        if pair.id == pair_id:
            return pair
    known = ", ".join(p.id for p in pairs)
    raise SpeculumError(f"There is no pair '{pair_id}' in the catalog. Known pairs: {known}.")
