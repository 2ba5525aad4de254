"""llama.cpp's MTP context: a target's own NextN heads, or a Gemma 4 assistant's, as one object
the MTP drafter decodes with (``drafting/mtp.py``); ``LlamaModel`` opens them."""

from __future__ import annotations

import ctypes
from typing import Sequence

import numpy as np

from ...errors import SpeculumError
from . import llama_ext
from .native import clear_log, lc, recent_log_error


class MtpHead:
    """llama.cpp's MTP context (``LLAMA_CONTEXT_TYPE_MTP``) on a target's own weights, or on
    the weights of the Gemma 4 assistant attached to it.

    It has its own KV cache (the NextN blocks' layers). Each position p takes the token at p
    and the hidden state that predicted it (the target's at p - 1, or a head's own while
    drafting); its logits there are for the token at p + 1.

    With several NextN blocks (Step-3.5, MiMo-V2, Hunyuan V3) each is a trained head of its
    own, ``layer`` 0 .. n_layers - 1, chosen per decode with ``llama_set_nextn_layer_offset``.
    They share the cache's cells, one K/V tensor per layer: a decode under one head writes
    only its layer, so a head reads at a position what it wrote there itself. llama.cpp's
    driver relies on the same thing: with one sequence a cache cut at p and refilled puts
    position p back in the same cell, leaving the other layers' K/V there untouched.

    A Gemma 4 assistant (``shares_target_cache``) has no cache of its own: its layers attend
    to the target's keys and values (llama.cpp's ``ctx_other``), all of them in one graph, and
    a decode writes nothing anywhere.
    """

    def __init__(self, weights, target_ctx, name: str, n_ctx: int, n_batch: int, n_threads: int, n_embd: int,
                 n_vocab: int):
        """An MTP context on ``weights`` (the target's model, or its assistant's); ``target_ctx``:
        the target's context whose cache an assistant reads (None: a cache of its own).
        ``name``: the file's, for errors; the sizes are the target's."""
        self._ctx = self._batch = None  # for close(), however far this gets
        self._ext = llama_ext.staging()
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = cparams.n_ubatch = n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = cparams.n_threads_batch = n_threads
        cparams.ctx_type = lc.LLAMA_CONTEXT_TYPE_MTP
        self.shares_target_cache = target_ctx is not None
        if self.shares_target_cache:
            cparams.ctx_other = target_ctx
        clear_log()
        self._ctx = lc.llama_init_from_model(weights, cparams)
        if not self._ctx:
            why = recent_log_error()
            raise SpeculumError(f"llama.cpp could not create the MTP context for {name}"
                                + (f": {why}" if why else "."))
        self._ext.set_embeddings_nextn(self._ctx, True, True)  # hidden rows of the logits rows
        self._mem = lc.llama_get_memory(self._ctx)
        self._batch = lc.llama_batch_ext_init(self._ctx)
        self._pos = (lc.llama_pos * 4)()
        self.n_embd = n_embd
        self.n_vocab = n_vocab
        self.n_batch = n_batch
        self.n_ctx = lc.llama_n_ctx(self._ctx)
        self.n_layers = max(1, lc.llama_model_n_layer_nextn(weights))
        # llama.cpp chains heads wherever there is more than one and the head has its own cache.
        self.chained = self.n_layers > 1 and not self.shares_target_cache
        self.layer = 0  # the head the next decode runs under
        self.n_past = 0

    def decode(self, tokens: Sequence[int], hidden: np.ndarray, pos: int,
               logits: bool = False, layer: int = 0) -> tuple[np.ndarray, np.ndarray] | None:
        """Decode (token, hidden row) pairs at positions pos, pos+1, ... under head ``layer``;
        anything cached from ``pos`` on is dropped first. With ``logits``: the last row's
        logits and hidden state (copies)."""
        n = len(tokens)
        if n == 0 or n > self.n_batch or pos + n > self.n_ctx:
            raise ValueError(f"MTP decode of {n} tokens at {pos} (batch {self.n_batch}, context {self.n_ctx})")
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"MTP head {layer} of {self.n_layers}")
        hidden = np.ascontiguousarray(hidden, dtype=np.float32)
        self.trim(pos)
        self.use(layer)
        b = self._batch
        lc.llama_batch_ext_clear(b)
        base = hidden.ctypes.data
        row_bytes = self.n_embd * 4
        for i, tok in enumerate(tokens):
            idx = lc.llama_batch_ext_add_token(b, 0, int(tok))
            self._pos[0] = pos + i
            lc.llama_batch_ext_set_pos(b, idx, self._pos)
            embd = lc.llama_embd(ctypes.cast(base + i * row_bytes, ctypes.POINTER(ctypes.c_float)), 1, self.n_embd)
            lc.llama_batch_ext_set_embd_token(b, idx, embd)
        if logits:
            lc.llama_batch_ext_set_output_logits(b, n - 1, True)
        rc = lc.llama_process(self._ctx, lc.LLAMA_PROCESS_TYPE_DECODE, b)
        if rc != 0:
            self.trim(0)
            raise SpeculumError(f"llama.cpp failed to run the MTP head (code {rc}).")
        self.n_past = pos + n
        if not logits:
            return None
        row = np.ctypeslib.as_array(lc.llama_get_logits_ith(self._ctx, n - 1), shape=(self.n_vocab,))
        h = np.ctypeslib.as_array(self._ext.get_embeddings_nextn_ith(self._ctx, n - 1), shape=(self.n_embd,))
        return row.copy(), h.copy()

    def use(self, layer: int) -> None:
        """Run the next decodes under head ``layer`` (0: the first, llama.cpp's default)."""
        if layer != self.layer:
            self._ext.set_nextn_layer_offset(self._ctx, layer)
            self.layer = layer

    def trim(self, n: int) -> None:
        if n < self.n_past:
            lc.llama_memory_seq_rm(self._mem, 0, n, -1)
            self.n_past = n

    def close(self) -> None:
        if self._batch is not None:
            lc.llama_batch_ext_free(self._batch)
            self._batch = None
        if self._ctx:
            lc.llama_free(self._ctx)
            self._ctx = None
