"""The window's settings, kept as JSON in ``config_dir()/settings.json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .. import paths
from ..engine.llama.cpu_settings import EXACT_BY_DEFAULT
from ..engine.vocabulary import Mode
from ..records import typed_fields

MAX_PROMPT_CACHE_MIB = 1 << 20  # 1 TiB: more than any machine this runs on has


@dataclass
class Settings:
    target: str = ""
    draft: str = ""
    mode: str = Mode.AUTO.value
    k: int = 0  # 0: adaptive; otherwise forced modes draft exactly k
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 0  # 0: until the answer ends or the context is full
    n_ctx: int = 4096
    target_gpu_layers: int = -1  # -1: all layers on the GPU when there is one
    draft_gpu_layers: int = -1
    rpc: str = ""  # RPC workers for the target, "host:port,host:port"
    prompt_cache_mib: int = -1  # saved states of recent prompts: -1 from free memory, 0 none
    ngram_memory: bool = True  # draft from what this machine wrote and read before
    exact: bool = EXACT_BY_DEFAULT  # the engine's row-invariance switch: speculation gives plain decoding's tokens
    exact_chosen: bool = False  # the user set ``exact``; else it follows this version's default
    conversation: str = ""  # the one open when the window closed
    plain_tokens_per_s: dict[str, float] = field(default_factory=dict)  # per target file, measured here
    geometry: str = ""  # the window's saved geometry, hex
    panes: list[float] = field(default_factory=list)  # each of the window's three columns' share of its width

    def prompt_cache_budget(self) -> int | None:
        """The prompt cache's budget for a load, in MiB (None: from the memory free then)."""
        return None if self.prompt_cache_mib < 0 else min(self.prompt_cache_mib, MAX_PROMPT_CACHE_MIB)

    @staticmethod
    def path():
        return paths.config_dir() / "settings.json"

    @classmethod
    def load(cls) -> "Settings":
        """The saved settings; a value of the wrong type goes back to its default, and a file of
        another shape is set aside (the window says so once)."""
        data = paths.read_json_object(cls.path())
        if data is None:
            return cls()
        kept, problems = typed_fields(cls, data)
        if not kept.get("exact_chosen"):  # (every field is saved: an earlier version's default is no choice)
            kept.pop("exact", None)
        if problems:
            paths.set_aside(cls.path(), "reset to defaults: " + "; ".join(problems), keep_original=True)
        return cls(**kept)

    def save(self) -> None:
        paths.write_json_atomic(self.path(), asdict(self))
