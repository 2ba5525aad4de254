"""Can this draft speculate for this target? The rules llama.cpp applies, from GGUF headers.

Same tokenizer type, same BOS/EOS handling, vocabulary sizes within 128, and identical
token texts from id 5 on. Works on any header source: a local file, or a remote file
read through HTTP range requests (see ``remote``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .gguf import VOCAB_KEYS, GGUFHeader, read_file_header

MAX_VOCAB_DIFFERENCE = 128
CHECK_FROM_TOKEN = 5


@dataclass(frozen=True)
class Compatibility:
    ok: bool
    reason: str  # why not, or a short confirmation

    def __bool__(self) -> bool:
        return self.ok


def describe_vocab(header: GGUFHeader, label: str) -> str:
    tok = header.get("tokenizer.ggml.model", "?")
    name = header.name or header.architecture
    return f"{label} {name} ({header.architecture}, {tok} tokenizer, {header.vocab_size:,} tokens)"


def _special(header: GGUFHeader, key: str):
    """A tokenizer setting as llama.cpp sees it: an absent add_bos/add_eos flag takes its default
    (SentencePiece vocabularies add BOS, others do not; none adds EOS)."""
    value = header.get(key)
    if value is None and key == "tokenizer.ggml.add_bos_token":
        return header.get("tokenizer.ggml.model") == "llama"
    if value is None and key == "tokenizer.ggml.add_eos_token":
        return False
    return value


def check_headers(target: GGUFHeader, draft: GGUFHeader) -> Compatibility:
    """Both headers must have been read with ``keep_arrays=VOCAB_KEYS``."""
    t_desc, d_desc = describe_vocab(target, "target"), describe_vocab(draft, "draft")

    def refuse(why: str) -> Compatibility:
        return Compatibility(False, f"The draft cannot speculate for the target: {why}. "
                                    f"The {t_desc} and the {d_desc} must share one vocabulary.")

    if target.assistant_for:
        return Compatibility(False, f"{target.name or target.architecture} is a Gemma 4 assistant: it drafts for a "
                                    f"{target.assistant_for} target and cannot be one.")
    if draft.assistant_for and not target.architecture.startswith(draft.assistant_for):
        return Compatibility(False, f"{draft.name or draft.architecture} is a Gemma 4 assistant: it drafts only "
                                    f"for a {draft.assistant_for} target, and the target is '{target.architecture}'.")
    t_model, d_model = target.get("tokenizer.ggml.model"), draft.get("tokenizer.ggml.model")
    if t_model != d_model:
        return refuse(f"tokenizer types differ ('{t_model}' vs '{d_model}')")
    for key, what in (("tokenizer.ggml.add_bos_token", "adds BOS"), ("tokenizer.ggml.add_eos_token", "adds EOS"),
                      ("tokenizer.ggml.bos_token_id", "BOS token"), ("tokenizer.ggml.eos_token_id", "EOS token")):
        if _special(target, key) != _special(draft, key):
            return refuse(f"{what} differs ({_special(target, key)} vs {_special(draft, key)})")
    diff = abs(target.vocab_size - draft.vocab_size)
    if diff > MAX_VOCAB_DIFFERENCE:
        return refuse(f"vocabulary sizes differ by {diff:,} tokens "
                      f"({target.vocab_size:,} vs {draft.vocab_size:,}; at most {MAX_VOCAB_DIFFERENCE} allowed)")
    t_tokens = target.get("tokenizer.ggml.tokens") or []
    d_tokens = draft.get("tokenizer.ggml.tokens") or []
    if not t_tokens or not d_tokens:
        return refuse("a vocabulary is missing from the GGUF metadata")
    for i in range(CHECK_FROM_TOKEN, min(len(t_tokens), len(d_tokens))):
        if t_tokens[i] != d_tokens[i]:
            return refuse(f"token {i} is {t_tokens[i]!r} in the target but {d_tokens[i]!r} in the draft")
    shared = f"{min(target.vocab_size, draft.vocab_size):,} shared tokens"
    if draft.assistant_for:
        return Compatibility(True, f"Compatible: the draft is the target's Gemma 4 assistant ({shared}); it drafts "
                                   "in MTP mode (--mode mtp), on the target's own KV cache.")
    return Compatibility(True, f"Compatible: both use the {t_model} tokenizer with {shared}.")


def drafts_for_itself(target: GGUFHeader) -> Compatibility:
    """A target with multi-token prediction (NextN) layers is a complete pair on its own."""
    name = target.name or target.architecture
    if target.assistant_for:
        return Compatibility(False, f"{name} ({target.architecture}) is a Gemma 4 assistant: it drafts for a "
                                    f"{target.assistant_for} target (given as its draft, --mode mtp), not for itself.")
    n = target.nextn_layers
    if n:
        return Compatibility(True, f"{name} ({target.architecture}) carries {n} NextN (MTP) layer{'s' * (n > 1)}: "
                                   "it drafts for itself, no draft model needed (draft: Built-in (MTP)).")
    return Compatibility(False, f"{name} ({target.architecture}) has no NextN (MTP) layers: it needs a draft "
                                "model of the same vocabulary, or lookup drafts.")


def check_files(target: str | os.PathLike, draft: str | os.PathLike) -> Compatibility:
    """Raises SpeculumError when either file is unreadable or not GGUF."""
    return check_headers(read_file_header(target, VOCAB_KEYS), read_file_header(draft, VOCAB_KEYS))
