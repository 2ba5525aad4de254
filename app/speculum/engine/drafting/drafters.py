"""Drafters propose the next few tokens cheaply; the target verifies them in one pass.

Every drafter declares the whole ``Drafter`` interface (``draft.py``, as llama.cpp's
``common/speculative``): ``begin(context)`` before a generation, ``propose(context, k, choice,
sampling, rng)`` each cycle, ``accept(context)`` once the target has kept what it kept, and
what the decoder and the policy ask of some (``match``, ``behind``, ``read``, ...), with defaults.

- ``ModelDrafter`` (``modeldrafter.py``): a small model of the same tokenizer, its KV cache kept in step
  with the target (synced to the accepted context before every proposal).
- ``PromptLookup`` (``lookup.py``): copies the continuation of the latest earlier occurrence of the
  context's longest repeated suffix (a suffix automaton over prompt + generated tokens).
- ``MemoryLookup``: the same from what this machine wrote and read before (``ngrammemory``).
- ``MtpDrafter`` (``mtp.py``): the target's own multi-token prediction head.
- ``PredictionDrafter`` (``prediction.py``): the client's predicted output, kept aligned
  with what the target writes.
- ``GrammarDrafter`` (``grammardrafter.py``): the text the answer's grammar forces next.

``DRAFTERS`` maps each source to its class: a new drafter is one class with a ``build``
and one entry there; the decoder builds whichever the loaded models allow.
"""

from __future__ import annotations

from ..vocabulary import Source
from .draft import Drafter, DrafterInputs
from .grammardrafter import GrammarDrafter
from .lookup import MemoryLookup, PromptLookup
from .modeldrafter import ModelDrafter
from .mtp import MtpDrafter
from .prediction import PredictionDrafter


# Source -> drafter class. Order is the order drafters begin and accept in.
DRAFTERS: dict[Source, type[Drafter]] = {
    Source.MODEL: ModelDrafter,
    Source.LOOKUP: PromptLookup,
    Source.MEMORY: MemoryLookup,  # needs an n-gram memory
    Source.PREDICTION: PredictionDrafter,
    Source.MTP: MtpDrafter,  # needs a target with NextN layers
    Source.GRAMMAR: GrammarDrafter,  # drafts only where an answer has a grammar
}


def build_drafters(inputs: DrafterInputs) -> dict[Source, Drafter]:
    """Every registered drafter the inputs allow (the model drafter needs a draft model)."""
    built = {source: cls.build(inputs) for source, cls in DRAFTERS.items()}
    return {source: drafter for source, drafter in built.items() if drafter is not None}
