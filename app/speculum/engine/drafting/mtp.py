"""The MTP drafter: the target's own multi-token prediction (NextN) head drafts for it.

As llama.cpp's ``common_speculative_impl_draft_mtp`` (single trained head: Qwen3.5/3.6,
Qwen3-Next, GLM-4.5, DeepSeek V3): an MTP context on the target's weights has its own KV
cache; position p there holds the pair (token at p, the target's hidden state at p - 1),
whose output predicts the token at p + 1. The target hands over its NextN hidden states
after every pass (``listen_to_decodes``), including the verification pass; ``propose``
first catches the head up on the pairs the target has confirmed since, plus the pending
last token, in one batch (its logits are the first draft token), then drafts further
tokens each fed with the head's own hidden state.

Only pairs built from the target's hidden states stay in the head's cache between cycles:
draft positions, which used the head's own, are dropped at the next proposal even when
the target accepted their tokens.

Chained heads (several NextN blocks: Step-3.5, MiMo-V2, Hunyuan V3), as llama.cpp's
``chain_heads``: draft step i runs head i, so a draft has at most as many tokens as there are
heads. Every head's layer takes the catch-up pairs. Step i (i >= 1) cuts the draft rows and
has head i decode them again in its own layer: rows pos0 + j for j = 1..i, the j-th drafted
token paired with the hidden state head j - 1 gave at its last row. (Row pos0 pairs the
pending token with the target's hidden state, the same under every head, so it stays from
the catch-up: llama.cpp decodes it again with the rest, to the same K/V.)

A Gemma 4 assistant (``is_mem_shared`` in llama.cpp) reads the target's own KV cache, which
holds exactly the context before the pending token when a draft starts: nothing to catch up
on and nothing kept. Its first step takes (pending token, the target's last hidden state),
each next one (the drafted token, the assistant's hidden state), all at the pending token's
position, as llama.cpp and transformers' Gemma 4 assistant do.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from .draft import Choice, Draft, Drafter, DrafterInputs, draft_one_by_one
from ..sampling import SamplingParams
from ..vocabulary import Source


class MtpDrafter(Drafter):
    source = Source.MTP

    def __init__(self, target, head, clock=time.perf_counter):
        self.target = target
        self.head = head
        self.clock = clock
        self.n_embd = head.n_embd
        # Tokens of the pairs in the head's cache built from the target's hidden states.
        self.tokens: list[int] = []
        # The target's tokens and NextN hidden rows by position, from ``seen_start`` on.
        self.seen_start = 0
        self.seen_tokens: list[int] = []
        self._hidden = np.zeros((64, self.n_embd), np.float32)  # rows of seen_tokens, then spare room
        # Pairs held back at most this long: beyond it they go into the head's cache unasked
        # (cheap in a big batch), so a generation that never drafts with MTP holds little.
        self.max_pending = head.n_batch
        # Chained: one head per draft step; otherwise the one head drafts every step.
        self.n_heads = head.n_layers if head.chained else 1
        self.max_k = self.n_heads if head.chained else None  # the most tokens a draft can have (None: no cap)
        self.shared = head.shares_target_cache
        target.listen_to_decodes(self._on_target_decode)

    @classmethod
    def build(cls, inputs: DrafterInputs) -> "MtpDrafter | None":
        target = inputs.target
        if not target.has_mtp:
            return None
        return cls(target, target.open_mtp_head(), inputs.clock)

    # -- what the target hands over --------------------------------------------------------

    def _on_target_decode(self, tokens: Sequence[int], pos: int, hidden: np.ndarray) -> None:
        """The target decoded ``tokens`` from ``pos``: keep their hidden rows (what was seen
        from ``pos`` on is replaced)."""
        # The head's pairs from ``pos`` on stay valid only where the target decoded the same tokens.
        same = 0
        for old, new in zip(self.tokens[pos:], tokens):
            if old != new:
                break
            same += 1
        if same < len(tokens):
            del self.tokens[pos + same:]
        start, n_seen = self.seen_start, len(self.seen_tokens)
        if start <= pos <= start + n_seen:
            keep = pos - start
        else:  # a jump (a new context far back, or a gap): start over from here
            keep, self.seen_start = 0, pos
        self.seen_tokens[keep:] = list(tokens)
        need = keep + len(tokens)
        if need > len(self._hidden):  # grown by doubling: one copy per row, amortised
            grown = np.zeros((max(need, 2 * len(self._hidden)), self.n_embd), np.float32)
            grown[:keep] = self._hidden[:keep]
            self._hidden = grown
        self._hidden[keep:need] = hidden
        if self.shared:  # only the row before the next pending token is ever read: in this decode
            self._forget_before(pos)
            return
        self._forget_before(len(self.tokens) - 1)
        if pos - len(self.tokens) > self.max_pending:
            # Everything before ``pos`` is in the target's cache: confirmed, it can go in.
            self._catch_up(self.seen_tokens[len(self.tokens) - self.seen_start:pos - self.seen_start]
                           if len(self.tokens) >= self.seen_start else [], logits=False)

    def _forget_before(self, pos: int) -> None:
        drop = min(max(0, pos - self.seen_start), len(self.seen_tokens))
        if drop:
            self.seen_start += drop
            del self.seen_tokens[:drop]
            self._hidden[:len(self.seen_tokens)] = self._hidden[drop:drop + len(self.seen_tokens)]

    def _hidden_before(self, first: int, end: int) -> np.ndarray:
        """The target's hidden rows at positions first-1 .. end-2 (what pairs first..end-1 take);
        zeros where none was seen (the first position, or one lost to a jump)."""
        out = np.zeros((end - first, self.n_embd), np.float32)
        lo, hi = max(first - 1, self.seen_start), min(end - 1, self.seen_start + len(self.seen_tokens))
        if lo < hi:
            out[lo - (first - 1):hi - (first - 1)] = self._hidden[lo - self.seen_start:hi - self.seen_start]
        return out

    def _catch_up(self, tokens: Sequence[int], logits: bool):
        """Pairs for ``tokens`` at the positions after ``self.tokens``, in batches; with ``logits``
        the last one's (logits, hidden)."""
        first = len(self.tokens)
        hidden = self._hidden_before(first, first + len(tokens))
        out = None
        step = self.head.n_batch
        for i in range(0, len(tokens), step):
            last = i + step >= len(tokens)
            for layer in reversed(range(self.n_heads)):  # head 0 last: its logits are the first draft token
                out = self.head.decode(tokens[i:i + step], hidden[i:i + step], first + i,
                                       logits=logits and last and layer == 0, layer=layer)
            self.tokens.extend(tokens[i:i + step])
        return out

    # -- the Drafter calls -----------------------------------------------------------------

    def begin(self, context: Sequence[int]) -> None:
        """Nothing to prepare: ``propose`` catches the head up on what the target confirmed."""

    def propose(self, context: Sequence[int], k: int, choice: Choice, sampling: SamplingParams,
                rng: np.random.Generator) -> Draft:
        """Up to k tokens following ``context``; stops early below ``choice.min_confidence``."""
        pos0 = len(context) - 1  # the pending last token's position: the target has all before it
        k = min(k, self.head.n_ctx - pos0)
        if self.max_k is not None:
            k = min(k, self.max_k)  # one head per step
        if k <= 0 or pos0 < 0:
            return Draft(source=self.source)
        start = self.clock()
        if self.shared:
            if self.target.n_past != pos0:  # it would read a cache that is not this context's
                return Draft(source=self.source)
            logits, hidden = self.head.decode([context[pos0]], self._hidden_before(pos0, pos0 + 1), pos0, logits=True)
        else:
            logits, hidden = self._catch_up_to(context, pos0)

        drafted: list[int] = []
        chain = [hidden]  # chain[j]: the hidden state row pos0 + 1 + j pairs with its token

        def next_logits(i: int, tok: int) -> np.ndarray:
            """Logits after the (i+1)-th drafted token, paired with the last step's hidden state."""
            drafted.append(tok)
            # One head: only the new row (its cache holds the rest). Chained: head i+1 rebuilds
            # every draft row in its own layer.
            first, layer = (0, i + 1) if self.head.chained else (i, 0)
            pos = pos0 if self.shared else pos0 + 1 + first  # the assistant drafts at one position
            out, h = self.head.decode(drafted[first:], np.stack(chain[first:]), pos, logits=True, layer=layer)
            chain.append(h)
            return out

        try:
            tokens, q, conf, first_s, steps = draft_one_by_one(logits, k, next_logits, choice, sampling, rng,
                                                               start, self.clock, len(context))
        finally:
            self.head.use(0)  # as llama.cpp leaves it: decodes outside drafting run the first head
        return Draft(tokens, self.source, q, conf, first_s=first_s, steps=steps)

    def _catch_up_to(self, context: Sequence[int], pos0: int) -> tuple[np.ndarray, np.ndarray]:
        """The head's pairs agree with the context up to n; pairs n..pos0 go in as one batch:
        the last one's (logits, hidden)."""
        n = 0
        limit = min(len(self.tokens), pos0)
        if self.tokens[:limit] == list(context[:limit]):
            n = limit
        else:
            while self.tokens[n] == context[n]:
                n += 1
        del self.tokens[n:]
        out = self._catch_up(list(context[n:pos0 + 1]), logits=True)
        self._forget_before(pos0 - 1)
        return out

    def accept(self, context: Sequence[int]) -> None:
        """Nothing: the next ``propose`` drops the draft positions and catches up."""
