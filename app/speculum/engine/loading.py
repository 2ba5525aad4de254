"""Loading a target (and optional draft) into a Decoder, refusing incompatible pairs first."""

from __future__ import annotations

import os
from typing import Callable

from ..errors import SpeculumError
from ..models.compat import check_headers
from ..models.gguf import VOCAB_KEYS, check_gguf_file
from .decoder import Decoder
from .drafting.ngrammemory import NgramMemory
from .promptcache import MIB, PromptCache
from .settings import LoadOptions
from .vocabulary import Role


def load_decoder(target: str | os.PathLike, draft: str | os.PathLike | None = None,
                 options: LoadOptions | None = None,
                 progress: Callable[[Role, float], bool] | None = None) -> Decoder:
    """Check both files, check the pair shares a vocabulary, then load them.

    ``progress(role, fraction)`` returning False cancels the load.
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

    def stage(role: Role):
        return (lambda f: progress(role, f)) if progress else None

    # A Gemma 4 assistant reads the target's cache as llama.cpp lays it out by default: the
    # target is then left to llama.cpp's flash-attention choice.
    assistant = draft_header is not None and bool(draft_header.assistant_for)
    t = LlamaModel(target, options, role=Role.TARGET, header=target_header, verifies=not assistant,
                   progress=stage(Role.TARGET))
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
            d = LlamaModel(draft, options, role=Role.DRAFT, header=draft_header, progress=stage(Role.DRAFT))
        except BaseException:
            t.close()
            raise
    budget = None if options.prompt_cache_mib is None else options.prompt_cache_mib * MIB
    memory = NgramMemory.for_model(t) if options.ngram_memory else None
    return Decoder(t, d, prompt_cache=PromptCache(budget) if budget != 0 else None, memory=memory)
