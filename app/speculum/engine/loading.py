"""Loading a target (and optional draft) into a Decoder, refusing incompatible pairs first."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from ..errors import SpeculumError
from ..models.compat import check_headers
from ..models.gguf import VOCAB_KEYS, check_gguf_file
from .decoder import Decoder
from .drafting.ngrammemory import NgramMemory
from .promptcache import MIB, PromptCache


@dataclass
class LoadOptions:
    n_ctx: int = 4096
    n_threads: int | None = None
    target_gpu_layers: int | None = None  # None: all layers on the GPU when there is one
    draft_gpu_layers: int | None = None
    flash_attn: bool | None = None  # None: Speculum's choice (cpu_settings.attention)
    extra_buffer_types: bool = True  # off in the safe engine profile
    rpc: tuple[str, ...] = ()  # RPC workers (HOST:PORT) for the target's layers; the draft stays local
    tensor_split: tuple[float, ...] | None = None  # the target's proportions per device: workers, then local GPUs
    prompt_cache_mib: int | None = None  # saved states of recent prompts (None: from free memory; 0: none)
    ngram_memory: bool = True  # draft from what this machine wrote and read before (ngrammemory)


def load_decoder(target: str | os.PathLike, draft: str | os.PathLike | None = None,
                 options: LoadOptions | None = None,
                 progress: Callable[[str, float], bool] | None = None) -> Decoder:
    """Check both files, check the pair shares a vocabulary, then load them.

    ``progress(stage, fraction)`` returning False cancels the load.
    """
    from .llama.model import LlamaModel

    options = options or LoadOptions()
    # Each header is read once: for the checks here, the pair's vocabularies, and LlamaModel's facts.
    target_header = check_gguf_file(target, VOCAB_KEYS if draft is not None else ())
    draft_header = None
    if draft is not None:
        draft_header = check_gguf_file(draft, VOCAB_KEYS)
        verdict = check_headers(target_header, draft_header)
        if not verdict:
            raise SpeculumError(verdict.reason)

    def stage(name: str):
        return (lambda f: progress(name, f)) if progress else None

    # A Gemma 4 assistant reads the target's cache as llama.cpp lays it out by default: the
    # target is then left to llama.cpp's flash-attention choice.
    assistant = draft_header is not None and bool(draft_header.assistant_for)
    t = LlamaModel(target, header=target_header, n_ctx=options.n_ctx, n_gpu_layers=options.target_gpu_layers,
                   n_threads=options.n_threads, flash_attn=options.flash_attn, verifies=not assistant,
                   progress=stage("target"),
                   extra_buffer_types=options.extra_buffer_types, rpc=options.rpc,
                   tensor_split=options.tensor_split)
    d = None
    if assistant:
        # A Gemma 4 assistant is no draft model: it runs on the target's KV cache, as its MTP head.
        try:
            t.attach_assistant(draft, draft_header)
        except BaseException:
            t.close()
            raise
    elif draft is not None:
        try:
            d = LlamaModel(draft, header=draft_header, n_ctx=options.n_ctx, n_gpu_layers=options.draft_gpu_layers,
                           n_threads=options.n_threads, flash_attn=options.flash_attn, progress=stage("draft"),
                              extra_buffer_types=options.extra_buffer_types)
        except BaseException:
            t.close()
            raise
    budget = None if options.prompt_cache_mib is None else options.prompt_cache_mib * MIB
    memory = NgramMemory.for_model(t) if options.ngram_memory else None
    return Decoder(t, d, prompt_cache=PromptCache(budget) if budget != 0 else None, memory=memory)
