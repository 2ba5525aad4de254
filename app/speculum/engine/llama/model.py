"""A thin, fast wrapper over llama-cpp-python's low-level API.

One ``LlamaModel`` is one GGUF file with one context holding one sequence. The
decoder drives it with ``decode(tokens, rows)``: the tokens go in at the current
position and the logits of the named rows come back as a zero-copy numpy view
(valid until the next call). ``trim(n)`` rolls the KV cache back to ``n`` tokens.
The high-level ``Llama.generate()`` is not used: it hides per-step accept/reject.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

# The gate first: CPU settings, then llama.cpp with its log captured.
from .native import clear_log, default_threads, ggml_library, gpu_backend, lc, local_gpus, recent_log_error
from ...errors import ContextFullError, SpeculumError
from ...models.gguf import GGUFHeader, check_gguf_file
from . import llama_ext, native
from .mtphead import MtpHead
from ..rpc import client as rpc_module
from . import contention, cpu_settings
from ..backend import Backend, DecodeAborted, ModelFacts
from ..chat import render_chat
from ..settings import LoadOptions
from ..vocabulary import Device, Role

# --- model -------------------------------------------------------------------------------

LoadProgress = Callable[[float], bool]  # fraction loaded -> keep going?

# A recurrent state (Qwen3.5's Gated DeltaNet layers, Mamba, ...) cannot be cut back like a KV
# cache: llama.cpp keeps per-token snapshots of the latest decode to roll back rejected drafts
# (memory: one recurrent state each), where the architecture supports it. A snapshot is only
# right for the tokens of that latest decode, and one rollback uses them up; llama.cpp does not
# check either, so ``trim`` does.
RECURRENT_ROLLBACK = 16
N_BATCH = 512  # tokens one decode call takes (llama.cpp caps it at the context's size)


def _device(gpu: str | None, rpc: Sequence[str], n_gpu_layers: int) -> Device:
    """Where the layers run: the CPU when none are offloaded, else the workers, else the GPU."""
    if n_gpu_layers == 0:
        return Device.CPU
    if rpc:
        return Device.RPC
    return Device.of_gpu(gpu) if gpu else Device.CPU


def backend_label(device: Device, gpu: str | None, rpc: Sequence[str]) -> str:
    """'CPU', 'CUDA', 'RPC 10.0.0.2:50052,...' (the workers named: the auto policy keeps its
    measured pass times per backend, and a network's are not a local device's)."""
    if device == Device.RPC:
        return f"RPC {rpc_module.names(rpc)}" + (f" + {gpu}" if gpu else "")  # (never a pairing token)
    return gpu if device != Device.CPU and gpu else device.value


class LlamaModel(Backend):
    saves_state = True  # llama.cpp's sequence state: the prompt cache saves and restores it

    def __init__(
        self,
        path: str | os.PathLike,
        options: LoadOptions = LoadOptions(),
        *,
        role: Role = Role.TARGET,  # which of the pair: only a target's layers go to RPC workers
        verifies: bool = False,  # the target: its passes are verification's small batches
        progress: LoadProgress | None = None,
        header: GGUFHeader | None = None,  # already read and checked by the caller
    ):
        self.path = Path(path)
        # Native handles first, so that close() (and __del__ after a failed load) finds each one.
        self._model = self._ctx = self._batch = None
        self._rpc: tuple[str, ...] = ()
        self._mtp_heads: list[MtpHead] = []  # closed before the weights they run on
        self._assistant = None  # a Gemma 4 assistant's weights (attach_assistant)
        self._assistant_head: MtpHead | None = None  # its one context
        self.assistant_path: Path | None = None
        header = header or check_gguf_file(self.path)
        gpu = gpu_backend()
        rpc = options.workers(role)
        mparams, n_gpu_layers = self._model_params(gpu, options.gpu_layers(role), rpc, options.split(role),
                                                   options.extra_buffer_types, header.quantization)
        # A model with NextN layers is its own drafter: load them when this llama.cpp can run them.
        want_mtp = header.nextn_layers > 0 and bool(llama_ext.support())
        if want_mtp:
            mparams.load_mtp = True
        # Why MTP mode cannot run although the file has NextN layers ("" when it can, or has none).
        self.mtp_unavailable = "" if want_mtp or not header.nextn_layers else (
            f"{self.path.name} has NextN (MTP) layers, but {llama_ext.support().reason}")
        self._load_weights(mparams, header, progress, rpc)
        self._vocab = lc.llama_model_get_vocab(self._model)
        self.n_vocab = lc.llama_vocab_n_tokens(self._vocab)
        n_train = lc.llama_model_n_ctx_train(self._model)
        threads = options.n_threads or default_threads()
        # A target on CPU workers computes as a local one would: the same attention path, the same tokens.
        on_cpu = mparams.n_gpu_layers == 0 or (not gpu and bool(rpc) and rpc_module.computes_on_cpu(rpc))
        self._create_context(options.n_ctx, n_train, N_BATCH, threads, threads, options.flash_attn, verifies,
                             on_cpu=on_cpu, mtp=header.nextn_layers > 0)
        self.n_threads = threads
        self._threads_now = threads
        # Threads chosen by Speculum follow the cores other programs leave free (contention.py);
        # a count the user gave is kept.
        self._cores = contention.cores() if not options.n_threads else None
        self.n_past = 0
        self._batch = lc.llama_batch_init(self.n_batch, 0, 1)
        for i in range(self.n_batch):
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0
        self._pieces: dict[int, bytes] = {}
        self._piece_buf = ctypes.create_string_buffer(256)
        self.bos = lc.llama_vocab_bos(self._vocab)
        self.eos = lc.llama_vocab_eos(self._vocab)
        self.add_bos = bool(lc.llama_vocab_get_add_bos(self._vocab))
        device = _device(gpu, rpc, n_gpu_layers)
        self.facts = ModelFacts(
            path=str(self.path),
            name=header.name or self.path.stem,
            architecture=header.architecture,
            n_parameters=int(lc.llama_model_n_params(self._model)),
            quantization=header.quantization,
            file_size=self.path.stat().st_size,
            vocab_size=self.n_vocab,
            context_length=n_train,
            n_ctx=self.n_ctx,
            backend=backend_label(device, gpu, rpc),
            device=device,
            n_gpu_layers=mparams.n_gpu_layers,
            n_threads=threads,
            nextn_layers=max(0, lc.llama_model_n_layer_nextn(self._model)) if want_mtp else 0,
        )
        self.chat_template = self.meta("tokenizer.chat_template")
        # Width of the NextN hidden rows (llama.cpp's n_embd_out; n_embd where it has no such key).
        self.n_embd = native.n_embd_out(self._model)
        self.n_nextn = self.facts.nextn_layers
        self._gpu_layers = mparams.n_gpu_layers
        # Called after every decode with (tokens, first position, NextN hidden rows): the MTP drafter.
        self._decode_listeners: list[Callable[[Sequence[int], int, np.ndarray], None]] = []

    def _model_params(self, gpu: str | None, n_gpu_layers: int | None, rpc: Sequence[str],
                      tensor_split: Sequence[float] | None, extra_buffer_types: bool, quantization: str = ""):
        """llama.cpp's model parameters: which devices take how many layers; and the layer
        count asked for, with None made concrete (all of them where there is a device)."""
        mparams = lc.llama_model_default_params()
        self._devices = None
        if rpc or rpc_module.any_registered():
            # Once a worker is registered llama.cpp would hand its devices to every model by
            # default: name this model's devices, the workers' only when it is given them.
            worker_devices = rpc_module.register_workers(rpc) if rpc else []
            self._devices = rpc_module.device_array(worker_devices + local_gpus(ggml_library()))
            mparams.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        offload = bool(gpu or rpc)
        if n_gpu_layers is None:
            n_gpu_layers = -1 if offload else 0  # every layer on the GPU (or the workers) when there is one
        mparams.n_gpu_layers = 0 if not offload else (10**6 if n_gpu_layers < 0 else n_gpu_layers)
        self._tensor_split = None
        if tensor_split:
            if len(tensor_split) > lc.llama_max_devices():
                raise SpeculumError(f"--tensor-split has {len(tensor_split)} parts; llama.cpp takes at most "
                                    f"{lc.llama_max_devices()}.")
            self._tensor_split = (ctypes.c_float * lc.llama_max_devices())(*tensor_split)
            mparams.tensor_split = self._tensor_split
        # Under the row-invariance switch repacked weights keep their multi-row gemm only for Q4_K on
        # x86 (cpu_settings.keeps_repacked_weights); and their gemv sums a row in another order than
        # plain weights do on an RPC worker (and for the output layer kept here for one): plain
        # weights then, so an exact row is the same on either.
        invariant = cpu_settings.rows_invariant_asked(cpu_settings.in_effect())
        mparams.use_extra_bufts = extra_buffer_types and not (
            invariant and (bool(rpc) or not cpu_settings.keeps_repacked_weights(quantization)))
        self._placement = rpc_module.output_layer_here() if rpc and not gpu else None
        self.output_here = self._placement is not None  # the output layer on this machine, the rest on workers
        if self._placement is not None:
            mparams.tensor_buft_overrides = ctypes.cast(self._placement, ctypes.c_void_p)
        return mparams, n_gpu_layers

    def _load_weights(self, mparams, header: GGUFHeader, progress: LoadProgress | None, rpc: Sequence[str]) -> None:
        """Load the GGUF's weights (``progress`` may cancel); a clear error when llama.cpp cannot."""
        self._progress_cb = None
        if progress is not None:
            def on_progress(fraction: float, _user: ctypes.c_void_p) -> bool:
                return bool(progress(float(fraction)))
            self._progress_cb = lc.llama_progress_callback(on_progress)
            mparams.progress_callback = self._progress_cb
        clear_log()
        self._model = lc.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not self._model:
            why = recent_log_error()
            if progress is not None and "cancel" in why.lower():
                raise SpeculumError(f"Loading {self.path.name} was cancelled.")
            raise SpeculumError(
                f"llama.cpp could not load {self.path.name} (architecture '{header.architecture}')"
                + (f": {why}" if why else ".")
            )
        self._rpc = tuple(rpc)
        if rpc:
            rpc_module.hold(rpc, loaded=True)
            rpc_module.keep_alive(rpc)  # llama.cpp's connections are open now: bound how long a lost one hangs

    def _create_context(self, n_ctx: int, n_train: int, n_batch: int, threads: int, threads_batch: int,
                        flash_attn: bool | None, verifies: bool, on_cpu: bool, mtp: bool) -> None:
        """The context holding this model's one sequence, its attention as cpu_settings chooses;
        the weights are freed again when llama.cpp cannot make it."""
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = min(n_ctx, n_train) if n_train > 0 else n_ctx
        cparams.n_batch = cparams.n_ubatch = n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = threads
        cparams.n_threads_batch = threads_batch
        recurrent = bool(lc.llama_model_is_recurrent(self._model) or lc.llama_model_is_hybrid(self._model))
        if recurrent:
            cparams.n_rs_seq = RECURRENT_ROLLBACK  # llama.cpp makes it 0 where the architecture cannot
        flash_attn, cparams.n_ubatch = cpu_settings.attention(
            flash_attn, verifies, on_cpu=on_cpu, mtp=mtp,
            n_ctx=cparams.n_ctx, n_head=lc.llama_model_n_head(self._model), n_ubatch=cparams.n_ubatch)
        self.flash_attn = flash_attn  # None: llama.cpp's choice (on, where the backend has it)
        cparams.flash_attn_type = (
            lc.LLAMA_FLASH_ATTN_TYPE_AUTO if flash_attn is None
            else lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        self._ctx = lc.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            lc.llama_model_free(self._model)
            self._model = None
            rpc_module.hold(self._rpc, loaded=False)
            why = recent_log_error()
            raise SpeculumError(
                f"llama.cpp could not create a context of {cparams.n_ctx} tokens for "
                f"{self.path.name}" + (f": {why}" if why else " (out of memory?).")
            )
        self._mem = lc.llama_get_memory(self._ctx)
        self._abort = native.AbortFlag(self._ctx)  # (abortable)
        self.decodes_aborted = 0
        # Most tokens ``trim`` can drop at once without starting over (None: any number), and
        # how many of the latest decode's it can drop now (recurrent only).
        self.max_rollback = int(lc.llama_n_rs_seq(self._ctx)) if recurrent else None
        self._undoable = 0
        self.n_ctx = lc.llama_n_ctx(self._ctx)
        self.n_batch = lc.llama_n_batch(self._ctx)  # llama.cpp caps it at the requested n_ctx
        self.n_ubatch = lc.llama_n_ubatch(self._ctx)  # what llama.cpp computes at once (cpu_settings.attention)

    # -- metadata and vocabulary --

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = lc.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            lc.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        arr = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            arr = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
        return list(arr[:n])

    def token_bytes(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            n = lc.llama_token_to_piece(self._vocab, token, self._piece_buf, 256, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = lc.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
                piece = buf.raw[:n]
            else:
                piece = self._piece_buf.raw[:n]
            self._pieces[token] = piece
        return piece

    def token_text(self, token: int, special: bool = True) -> str:
        """A token's text for display (special tokens by name)."""
        if special:
            text = lc.llama_vocab_get_text(self._vocab, token)
            if text and lc.llama_vocab_is_control(self._vocab, token):
                return text.decode("utf-8", errors="replace")
        return self.token_bytes(token).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return bool(lc.llama_vocab_is_eog(self._vocab, token))

    @property
    def llama_vocab(self):
        """llama.cpp's vocabulary handle, for a grammar (engine.grammar) to read tokens with."""
        return self._vocab

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            tools: Sequence[dict] | None = None) -> str:
        return render_chat(self, messages, add_generation_prompt, tools)

    # -- decoding --

    def decode(self, tokens: Sequence[int], rows: Sequence[int] | None = None) -> np.ndarray:
        """Append ``tokens`` at the current position; return logits of ``rows`` (default: last).

        The result is a (len(rows), n_vocab) float32 view into llama.cpp's buffer,
        valid until the next decode.
        """
        n = len(tokens)
        if n == 0:
            raise ValueError("decode needs at least one token")
        if n > self.n_batch:
            raise ValueError(f"decode of {n} tokens exceeds n_batch {self.n_batch}; use prefill")
        if self.n_past + n > self.n_ctx:
            raise ContextFullError(
                f"The context of {self.n_ctx} tokens is full ({self.n_past} used, {n} more needed)."
            )
        if rows is None:
            rows = (n - 1,)
        b = self._batch
        pos = self.n_past
        want = set(rows)
        for i, t in enumerate(tokens):
            b.token[i] = t
            b.pos[i] = pos + i
            b.logits[i] = i in want
        b.n_tokens = n
        if self._cores is not None:
            self._follow_cores()
        rc = lc.llama_decode(self._ctx, b)
        if rc != 0:
            if rc == 2 and self._abort.is_set:
                raise self._forget_aborted()
            if rc == 1:
                raise ContextFullError(f"llama.cpp found no room in the KV cache ({self.n_past} tokens used).")
            raise SpeculumError(f"llama.cpp failed to decode (code {rc}).")
        self.n_past += n
        if self.max_rollback is not None:  # the batch's first token stays: its snapshot holds the rest
            self._undoable = min(n - 1, self.max_rollback)
        if self._decode_listeners:
            hidden = np.ctypeslib.as_array(llama_ext.staging().get_embeddings_nextn(self._ctx), shape=(n, self.n_embd))
            for listener in self._decode_listeners:
                listener(tokens, pos, hidden)
        if not want:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        ptr = lc.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(len(want), self.n_vocab))

    @property
    def threads_now(self) -> int:
        """The threads its next decode runs on (``n_threads`` less the cores others hold)."""
        return self._threads_now

    def _follow_cores(self) -> None:
        threads = self._cores.threads(self.n_threads)
        if threads != self._threads_now:
            lc.llama_set_n_threads(self._ctx, threads, threads)
            self._threads_now = threads

    def abortable(self, stop):
        """Inside, ``stop`` being set aborts the decode running at its next graph node."""
        return self._abort.armed(stop) if stop is not None else contextlib.nullcontext()

    def _forget_aborted(self) -> DecodeAborted:
        """After an aborted decode: llama.cpp dropped its last micro-batch's positions, not
        the ones before it; drop them all (a recurrent state cannot be cut: it starts over)."""
        self.decodes_aborted += 1
        if self.max_rollback is not None or not lc.llama_memory_seq_rm(self._mem, 0, self.n_past, -1):
            self.reset()
        self._undoable = 0
        return DecodeAborted(f"the decode at {self.n_past} was stopped")

    # -- multi-token prediction (the model's own NextN heads) --

    def listen_to_decodes(self, listener: Callable[[Sequence[int], int, np.ndarray], None]) -> None:
        """Call ``listener(tokens, pos, hidden)`` after each decode, ``hidden`` the (n, n_embd) NextN
        hidden states of every token (a view valid during the call). Needs NextN layers or an
        assistant."""
        if not self.n_nextn and self._assistant is None:
            raise SpeculumError(f"{self.path.name} has no NextN (MTP) layers.")
        llama_ext.staging().set_embeddings_nextn(self._ctx, True, False)  # every row, not only logits rows
        self._decode_listeners.append(listener)

    @property
    def has_mtp(self) -> bool:
        """Whether an MTP head can draft for this model: its own NextN layers, or an assistant."""
        return bool(self.n_nextn) or self._assistant is not None

    def attach_assistant(self, path: str | os.PathLike, header: GGUFHeader | None = None) -> None:
        """Load a Gemma 4 assistant (``gemma4-assistant``, a GGUF of its own) to draft for this
        Gemma 4 target: its layers read this context's KV cache, so it takes no cache of its own
        and never catches up (llama.cpp's ``ctx_other``).

        Making the assistant's context empties this context's cache: llama.cpp's shared cache
        sizes the cells it shares anew (llama-kv-cache.cpp's constructor resizes them). So it
        is made once, here, and this model starts over from an empty context."""
        path = Path(path)
        header = header or check_gguf_file(path)
        if header.assistant_for != "gemma4":
            raise SpeculumError(f"{path.name} is not a Gemma 4 assistant (architecture '{header.architecture}').")
        if not self.facts.architecture.startswith(header.assistant_for):
            raise SpeculumError(f"{path.name} drafts for Gemma 4 targets; {self.path.name} is "
                                f"'{self.facts.architecture}'.")
        support = llama_ext.support()
        if not support:
            raise SpeculumError(f"{path.name} is a Gemma 4 assistant, but {support.reason}")
        mparams = lc.llama_model_default_params()
        mparams.n_gpu_layers = self._gpu_layers
        mparams.load_mtp = True
        clear_log()
        model = lc.llama_model_load_from_file(str(path).encode(), mparams)
        if not model:
            why = recent_log_error()
            raise SpeculumError(f"llama.cpp could not load the assistant {path.name}" + (f": {why}" if why else "."))
        self._assistant, self.assistant_path = model, path
        self.facts = dataclasses.replace(self.facts, assistant=header.name or path.stem)
        try:
            self._assistant_head = self._new_mtp_head()
        except BaseException:
            lc.llama_model_free(model)
            self._assistant = self.assistant_path = None
            raise
        self.reset()  # what llama.cpp just did to the cache, in this model's own count

    def open_mtp_head(self) -> MtpHead:
        """The MTP context: a new one on this model's NextN layers, or the assistant's one."""
        return self._assistant_head if self._assistant is not None else self._new_mtp_head()

    def _new_mtp_head(self) -> MtpHead:
        shared = self._assistant is not None  # an assistant reads this context's cache
        head = MtpHead(self._assistant if shared else self._model, self._ctx if shared else None,
                       (self.assistant_path if shared else self.path).name, self.n_ctx, self.n_batch,
                       self.n_threads, self.n_embd, self.n_vocab)
        self._mtp_heads.append(head)  # closed before the weights it runs on
        return head

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """Decode any number of tokens in n_batch chunks; return the last row's logits."""
        if self.n_past + len(tokens) > self.n_ctx:
            raise ContextFullError(
                f"The prompt needs {self.n_past + len(tokens)} tokens but the context holds {self.n_ctx}."
            )
        logits = None
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start:start + self.n_batch]
            last = start + len(chunk) >= len(tokens)
            logits = self.decode(chunk, rows=(len(chunk) - 1,) if last else ())
        assert logits is not None, "prefill needs at least one token"
        return logits[0]

    def trim(self, n: int) -> int:
        """Forget every token at position >= n; returns how many are kept. A recurrent state
        rolls back at most ``max_rollback`` tokens (once between decodes): beyond that the
        context starts over from nothing, and the caller decodes it again."""
        if n < self.n_past:
            undo = self.n_past - n
            ok = self.max_rollback is None or undo <= self._undoable
            if not (ok and lc.llama_memory_seq_rm(self._mem, 0, n, -1)):
                lc.llama_memory_seq_rm(self._mem, 0, -1, -1)
                n = 0
            self._undoable = 0
            self.n_past = n
        return self.n_past

    def save_state(self) -> ctypes.Array | None:
        """A copy of the sequence's KV (or recurrent) state, for ``load_state``; None when
        llama.cpp could not write it."""
        size = lc.llama_state_seq_get_size(self._ctx, 0)
        if not size:
            return None
        state = (ctypes.c_uint8 * size)()
        return state if lc.llama_state_seq_get_data(self._ctx, state, size, 0) == size else None

    def load_state(self, state: ctypes.Array, n_tokens: int) -> bool:
        """Put back a state ``save_state`` made when the sequence held ``n_tokens`` tokens.
        False when llama.cpp refused it: the sequence is then empty."""
        if not lc.llama_state_seq_set_data(self._ctx, state, len(state), 0):
            self.reset()
            return False
        self.n_past = n_tokens
        self._undoable = 0  # a recurrent model's snapshots belonged to the state replaced
        return True

    def reset(self) -> None:
        lc.llama_memory_clear(self._mem, True)
        self.n_past = 0
        self._undoable = 0

    def close(self) -> None:
        for head in list(self._mtp_heads):
            head.close()
        if self._assistant:
            lc.llama_model_free(self._assistant)
            self._assistant = self._assistant_head = None
        if self._batch is not None:
            lc.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            lc.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            lc.llama_model_free(self._model)
            self._model = None
            if self._rpc:
                rpc_module.hold(self._rpc, loaded=False)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "LlamaModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
