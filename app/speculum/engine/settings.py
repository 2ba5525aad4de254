"""How a pair of models is loaded: one type, ``LoadOptions``, made once by the window or the
command line and passed whole down to each model (``LlamaModel``), the engine profile applied
on the way (``llama/profiles.Profile.apply``). The window's ``LoadRequest`` carries it to the
engine process, pickled as it is: nothing here loads llama.cpp."""

from __future__ import annotations

from dataclasses import dataclass

from .vocabulary import Role


@dataclass(frozen=True)
class LoadOptions:
    n_ctx: int = 4096
    n_threads: int | None = None  # None: the usable cores, at most 16
    target_gpu_layers: int | None = None  # None: all layers on the GPU when there is one
    draft_gpu_layers: int | None = None
    flash_attn: bool | None = None  # None: Speculum's choice (cpu_settings.attention)
    extra_buffer_types: bool = True  # off in the safe engine profile
    rpc: tuple[str, ...] = ()  # RPC workers (HOST:PORT) for the target's layers; the draft stays local
    tensor_split: tuple[float, ...] | None = None  # the target's proportions per device: workers, then local GPUs
    prompt_cache_mib: int | None = None  # saved states of recent prompts (None: from free memory; 0: none)
    ngram_memory: bool = True  # draft from what this machine wrote and read before (ngrammemory)

    def gpu_layers(self, role: Role) -> int | None:
        """The layers ``role``'s model puts on the GPU (None: all, where there is one)."""
        return self.target_gpu_layers if role == Role.TARGET else self.draft_gpu_layers

    def workers(self, role: Role) -> tuple[str, ...]:
        """The RPC workers taking ``role``'s layers: the target's only (a draft's passes are too
        small to pay a network round trip each)."""
        return self.rpc if role == Role.TARGET else ()

    def split(self, role: Role) -> tuple[float, ...] | None:
        """``role``'s proportions per device (the target's only, as ``workers``)."""
        return self.tensor_split if role == Role.TARGET else None
