"""A synthetic model (tests/synthetic.py) with a real llama.cpp vocabulary of JSON pieces.

The logits are the synthetic model's (deterministic, no llama.cpp numerics); the vocabulary
is a vocab-only GGUF written here, so llama.cpp's own grammar sampler reads the tokens: the
grammar code under test is the one real models use.
"""

from __future__ import annotations

from pathlib import Path

from ggufgen import ARRAY, FLOAT32, INT32, STRING, UINT32, gguf_bytes
from synthetic import SyntheticModel, noisy_copy

# Several pieces spell the same text ('{"' and '{' '"'), as in a real vocabulary.
PIECES = ["<unk>", "<s>", "</s>", "{", "}", "[", "]", '"', ":", ",", "a", "b", "c", "x", "y", "1", "2", " ",
          "true", "false", '{"', '":', '",', '"]', "ab", '":"']
EOS = 2


def write_vocab(path: Path, pieces: list[str] = PIECES) -> Path:
    """A vocab-only llama GGUF (SentencePiece-style) holding ``pieces`` (the first three:
    unknown, begin and end of text)."""
    types = [2, 3, 3] + [1] * (len(pieces) - 3)  # unknown, control, control, then normal
    kv = [("general.architecture", STRING, "llama"),
          ("llama.context_length", UINT32, 4096), ("llama.embedding_length", UINT32, 8),
          ("llama.block_count", UINT32, 1), ("llama.feed_forward_length", UINT32, 8),
          ("llama.attention.head_count", UINT32, 1), ("llama.attention.layer_norm_rms_epsilon", FLOAT32, 1e-5),
          ("tokenizer.ggml.model", STRING, "llama"),
          ("tokenizer.ggml.tokens", ARRAY, (STRING, pieces)),
          ("tokenizer.ggml.scores", ARRAY, (FLOAT32, [0.0] * len(pieces))),
          ("tokenizer.ggml.token_type", ARRAY, (INT32, types)),
          ("tokenizer.ggml.bos_token_id", UINT32, 1), ("tokenizer.ggml.eos_token_id", UINT32, EOS),
          ("tokenizer.ggml.unknown_token_id", UINT32, 0)]
    path.write_bytes(gguf_bytes(kv))
    return path


class LlamaVocab:
    """A loaded vocab-only GGUF: its ``llama_vocab`` handle lives as long as this object."""

    def __init__(self, path: Path):
        from speculum.engine.llama import native  # noqa: F401  (llama.cpp initialised, its log captured)
        import llama_cpp as lc
        params = lc.llama_model_default_params()
        params.vocab_only = True
        self._lc = lc
        self._model = lc.llama_model_load_from_file(str(path).encode(), params)
        assert self._model, "llama.cpp refused the test vocabulary"
        self.handle = lc.llama_model_get_vocab(self._model)

    def __del__(self):
        if getattr(self, "_model", None):
            self._lc.llama_model_free(self._model)


class CharModel:
    """What the grammar code reads of a model: a real llama.cpp vocabulary of ``pieces`` (a
    vocab-only GGUF at ``path``), and a tokenizer of one token a piece (characters, here)."""

    def __init__(self, path: Path, pieces: list[str]):
        self.pieces = pieces
        self.vocab = LlamaVocab(write_vocab(path, pieces))
        self.llama_vocab, self.n_vocab = self.vocab.handle, len(pieces)

    def tokenize(self, text, add_special=False, parse_special=True):
        return [self.pieces.index(c) for c in text]


class JsonSynthetic(SyntheticModel):
    """The synthetic model over ``PIECES``, with the vocabulary a grammar reads them by."""

    def __init__(self, vocab: LlamaVocab, **kw):
        kw.setdefault("eog", EOS)
        super().__init__(n_vocab=len(PIECES), **kw)
        self.vocab = vocab
        self.llama_vocab = vocab.handle

    def token_bytes(self, token: int) -> bytes:
        return PIECES[token].encode()

    def token_text(self, token: int, special: bool = True) -> str:
        return PIECES[token]

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """Longest piece first (enough for test prompts)."""
        out, i = [], 0
        by_length = sorted(range(3, len(PIECES)), key=lambda t: -len(PIECES[t]))
        while i < len(text):
            t = next((t for t in by_length if text.startswith(PIECES[t], i)), None)
            if t is None:
                i += 1
                continue
            out.append(t)
            i += len(PIECES[t])
        return out


def json_draft(target: JsonSynthetic, seed: int, noise: float) -> SyntheticModel:
    """A draft model for ``target``: its logits, with noise."""
    return noisy_copy(target, seed=seed, noise=noise)
