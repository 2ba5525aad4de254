"""Tiny MTP-bearing GGUFs, written by the tests: real weights for llama.cpp, random but shaped.

Architecture ``glm4moe`` (GLM-4.5's): the simplest one this llama.cpp runs an MTP head for
with a plain KV cache (Qwen3.5's needs recurrent-state rollback). Two dense trunk layers and
one NextN block (a MoE block with a shared expert, as llama.cpp's GLM MTP graph requires).
Also ``qwen35`` (one NextN block on a Gated DeltaNet + attention trunk), ``step35`` (three
chained NextN heads) and a Gemma 4 target with its separate assistant (``write_gemma4_pair``).
The vocabulary and chat template are SmolLM2's, copied from its GGUF.

``noise`` sets how far the MTP head is from the main head. At 0 it predicts exactly what the
main head will, by construction: the trunk's attention and FFN outputs are zero (the hidden
state is the token's embedding, so the next token depends only on the current one), and the
NextN block passes the embedding of its input token straight through (eh_proj = [I | 0], zero
attention and FFN outputs) to the same output norm and head. Noise adds random weights to
both, so the trunk reads its context and the head guesses less well.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from ggufgen import ARRAY, FLOAT32, INT32, STRING, UINT32, encode_value

ARCH = "glm4moe"
N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_FF_EXP, N_EXPERT = 64, 4, 2, 128, 32, 2
N_TRUNK, N_NEXTN = 2, 1


def _read_str(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, pos)
    return buf[pos + 8:pos + 8 + n].decode(), pos + 8 + n


_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _skip_value(buf: bytes, pos: int, vtype: int) -> int:
    if vtype in _SIZES:
        return pos + _SIZES[vtype]
    if vtype == STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    etype, n = struct.unpack_from("<IQ", buf, pos)  # array
    pos += 12
    if etype in _SIZES:
        return pos + n * _SIZES[etype]
    for _ in range(n):
        pos = _skip_value(buf, pos, etype)
    return pos


def tokenizer_kv(gguf: Path) -> list[tuple[str, int, bytes]]:
    """Every ``tokenizer.*`` key of a (trusted, local) GGUF, as (key, type, raw encoded value)."""
    buf = gguf.read_bytes()[:64 << 20]
    _, _, n_kv = struct.unpack_from("<IQQ", buf, 4)
    pos, out = 24, []
    for _ in range(n_kv):
        key, pos = _read_str(buf, pos)
        (vtype,) = struct.unpack_from("<I", buf, pos)
        end = _skip_value(buf, pos + 4, vtype)
        if key.startswith("tokenizer."):
            out.append((key, vtype, buf[pos + 4:end]))
        pos = end
    return out


class _Maker:
    """Random f32 weights of a seed, and the tensors every test architecture shares."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def rnd(self, *shape, scale=1.0):
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    @staticmethod
    def ones(n):
        return np.ones(n, np.float32)

    def base(self, n_vocab: int) -> dict[str, np.ndarray]:
        return {"token_embd.weight": self.rnd(n_vocab, N_EMBD), "output_norm.weight": self.ones(N_EMBD),
                "output.weight": self.rnd(n_vocab, N_EMBD, scale=0.25)}


def _weights(n_vocab: int, noise: float, seed: int) -> dict[str, np.ndarray]:
    """name -> array, numpy shape = the GGUF shape reversed (rows of the ggml matrix)."""
    make = _Maker(seed)
    rnd, ones = make.rnd, make.ones
    E, dq, dkv = N_EMBD, N_EMBD, N_EMBD // N_HEAD * N_HEAD_KV
    w = make.base(n_vocab)
    for il in range(N_TRUNK + N_NEXTN):
        b = f"blk.{il}."
        w[b + "attn_norm.weight"] = ones(E)
        w[b + "attn_q.weight"] = rnd(dq, E, scale=0.3)
        w[b + "attn_k.weight"] = rnd(dkv, E, scale=0.3)
        w[b + "attn_v.weight"] = rnd(dkv, E, scale=0.3)
        w[b + "attn_output.weight"] = rnd(E, dq, scale=noise / 4)  # zero at noise 0: no context
        w[b + "post_attention_norm.weight"] = ones(E)
        if il < N_TRUNK:
            w[b + "ffn_gate.weight"] = rnd(N_FF, E, scale=0.2)
            w[b + "ffn_up.weight"] = rnd(N_FF, E, scale=0.2)
            w[b + "ffn_down.weight"] = rnd(E, N_FF, scale=noise / 4)
        else:  # the NextN block: MoE with a shared expert, then the projections of e and h
            w[b + "ffn_gate_inp.weight"] = rnd(N_EXPERT, E, scale=0.2)
            w[b + "exp_probs_b.bias"] = np.zeros(N_EXPERT, np.float32)
            w[b + "ffn_gate_exps.weight"] = rnd(N_EXPERT, N_FF_EXP, E, scale=0.2)
            w[b + "ffn_up_exps.weight"] = rnd(N_EXPERT, N_FF_EXP, E, scale=0.2)
            w[b + "ffn_down_exps.weight"] = rnd(N_EXPERT, E, N_FF_EXP, scale=noise / 4)
            w[b + "ffn_gate_shexp.weight"] = rnd(N_FF_EXP, E, scale=0.2)
            w[b + "ffn_up_shexp.weight"] = rnd(N_FF_EXP, E, scale=0.2)
            w[b + "ffn_down_shexp.weight"] = rnd(E, N_FF_EXP, scale=noise / 4)
            eh = np.concatenate([np.eye(E, dtype=np.float32), np.zeros((E, E), np.float32)], axis=1)
            w[b + "nextn.eh_proj.weight"] = eh + rnd(E, 2 * E, scale=noise / 8)  # input: [e_norm | h_norm]
            w[b + "nextn.enorm.weight"] = ones(E)
            w[b + "nextn.hnorm.weight"] = ones(E)
    return w


# Qwen3.5 (``qwen35``): layer 0 is a Gated DeltaNet (linear attention, recurrent state),
# layer 1 full attention with an output gate, then one dense NextN block.
SSM_STATE, SSM_V_HEADS, SSM_K_HEADS, SSM_CONV = 16, 4, 2, 4


def _qwen35_weights(n_vocab: int, noise: float, seed: int) -> dict[str, np.ndarray]:
    make = _Maker(seed)
    rnd, ones = make.rnd, make.ones
    E, hd = N_EMBD, N_EMBD // N_HEAD
    key_dim, value_dim = SSM_STATE * SSM_K_HEADS, SSM_STATE * SSM_V_HEADS
    w = make.base(n_vocab)
    for il in range(N_TRUNK + N_NEXTN):
        b = f"blk.{il}."
        w[b + "attn_norm.weight"] = ones(E)
        w[b + "post_attention_norm.weight"] = ones(E)
        if il == 0:  # linear attention; its output projection is zero at noise 0
            w[b + "attn_qkv.weight"] = rnd(2 * key_dim + value_dim, E, scale=0.2)
            w[b + "attn_gate.weight"] = rnd(value_dim, E, scale=0.2)
            w[b + "ssm_conv1d.weight"] = rnd(2 * key_dim + value_dim, SSM_CONV, scale=0.3)
            w[b + "ssm_dt.bias"] = np.zeros(SSM_V_HEADS, np.float32)
            w[b + "ssm_a"] = -np.abs(rnd(SSM_V_HEADS)) - 0.5
            w[b + "ssm_beta.weight"] = rnd(SSM_V_HEADS, E, scale=0.2)
            w[b + "ssm_alpha.weight"] = rnd(SSM_V_HEADS, E, scale=0.2)
            w[b + "ssm_norm.weight"] = ones(SSM_STATE)
            w[b + "ssm_out.weight"] = rnd(E, value_dim, scale=noise / 4)
        else:  # gated full attention (the trunk's layer 1, and the NextN block)
            w[b + "attn_q.weight"] = rnd(2 * hd * N_HEAD, E, scale=0.3)
            w[b + "attn_k.weight"] = rnd(hd * N_HEAD_KV, E, scale=0.3)
            w[b + "attn_v.weight"] = rnd(hd * N_HEAD_KV, E, scale=0.3)
            w[b + "attn_output.weight"] = rnd(E, hd * N_HEAD, scale=noise / 4)
            w[b + "attn_q_norm.weight"] = ones(hd)
            w[b + "attn_k_norm.weight"] = ones(hd)
        w[b + "ffn_gate.weight"] = rnd(N_FF, E, scale=0.2)
        w[b + "ffn_up.weight"] = rnd(N_FF, E, scale=0.2)
        w[b + "ffn_down.weight"] = rnd(E, N_FF, scale=noise / 4)
        if il >= N_TRUNK:
            eh = np.concatenate([np.eye(E, dtype=np.float32), np.zeros((E, E), np.float32)], axis=1)
            w[b + "nextn.eh_proj.weight"] = eh + rnd(E, 2 * E, scale=noise / 8)
            w[b + "nextn.enorm.weight"] = ones(E)
            w[b + "nextn.hnorm.weight"] = ones(E)
    return w


# Step-3.5 (``step35``): chained heads, one trained NextN block per draft step. Sliding-window
# and full attention layers alternate (full ones rotate half the head's dimensions), each
# with a head-wise sigmoid gate; the FFNs are dense here (Step-3.5's are MoE from layer 3 on;
# its NextN graph takes either). The heads alternate full/sliding too, so the MTP context's
# cache has both kinds. The window is short enough that the tests' prompts reach past it.
STEP35_HEADS, STEP35_WINDOW = 3, 16


def _step35_weights(n_vocab: int, noise: float, seed: int) -> dict[str, np.ndarray]:
    make = _Maker(seed)
    rnd, ones = make.rnd, make.ones
    E, hd = N_EMBD, N_EMBD // N_HEAD
    eh = np.concatenate([np.eye(E, dtype=np.float32), np.zeros((E, E), np.float32)], axis=1)
    w = make.base(n_vocab)
    for il in range(N_TRUNK + STEP35_HEADS):
        b = f"blk.{il}."
        w[b + "attn_norm.weight"] = ones(E)
        w[b + "attn_q.weight"] = rnd(hd * N_HEAD, E, scale=0.3)
        w[b + "attn_k.weight"] = rnd(hd * N_HEAD_KV, E, scale=0.3)
        w[b + "attn_v.weight"] = rnd(hd * N_HEAD_KV, E, scale=0.3)
        w[b + "attn_q_norm.weight"] = ones(hd)
        w[b + "attn_k_norm.weight"] = ones(hd)
        w[b + "attn_gate.weight"] = rnd(N_HEAD, E, scale=0.3)
        w[b + "attn_output.weight"] = rnd(E, hd * N_HEAD, scale=noise / 4)  # zero at noise 0: no context
        w[b + "ffn_norm.weight"] = ones(E)
        w[b + "ffn_gate.weight"] = rnd(N_FF, E, scale=0.2)
        w[b + "ffn_up.weight"] = rnd(N_FF, E, scale=0.2)
        w[b + "ffn_down.weight"] = rnd(E, N_FF, scale=noise / 4)
        if il >= N_TRUNK:  # each head its own projections (its own random guesses when noisy)
            w[b + "nextn.eh_proj.weight"] = eh + rnd(E, 2 * E, scale=noise / 8)
            w[b + "nextn.enorm.weight"] = ones(E)
            w[b + "nextn.hnorm.weight"] = ones(E)
    return w


NEXTN_LAYERS = {"glm4moe": N_NEXTN, "qwen35": N_NEXTN, "step35": STEP35_HEADS}
_WEIGHTS = {"glm4moe": _weights, "qwen35": _qwen35_weights, "step35": _step35_weights}


def write_mtp_gguf(path: Path, tokenizer_from: Path, noise: float = 0.0, seed: int = 0,
                   nextn: bool = True, arch: str = ARCH) -> Path:
    """The test model; ``nextn=False`` writes the same trunk with no NextN block (no MTP);
    ``arch`` is ``glm4moe``, ``qwen35`` or ``step35``."""
    tok = tokenizer_kv(tokenizer_from)
    n_vocab = next(struct.unpack_from("<IQ", raw)[1] for k, _, raw in tok if k == "tokenizer.ggml.tokens")
    weights = _WEIGHTS[arch](n_vocab, noise, seed)
    n_nextn = NEXTN_LAYERS[arch] if nextn else 0
    n_blocks = N_TRUNK + n_nextn
    weights = {k: v for k, v in weights.items() if not k.startswith("blk.") or int(k.split(".")[1]) < n_blocks}
    a = arch
    kv: list[tuple[str, int, object]] = [
        ("general.architecture", STRING, a),
        ("general.name", STRING, "Speculum MTP test" if nextn else "Speculum no-MTP test"),
        ("general.file_type", UINT32, 0),
        (f"{a}.context_length", UINT32, 2048),
        (f"{a}.embedding_length", UINT32, N_EMBD),
        (f"{a}.block_count", UINT32, n_blocks),
        (f"{a}.feed_forward_length", UINT32, N_FF),
        (f"{a}.attention.head_count", UINT32, N_HEAD),
        (f"{a}.attention.head_count_kv", UINT32, N_HEAD_KV),
        (f"{a}.attention.layer_norm_rms_epsilon", FLOAT32, 1e-6),
        (f"{a}.rope.freq_base", FLOAT32, 10000.0),
    ]
    if arch == "qwen35":
        kv += [
            (f"{a}.rope.dimension_count", UINT32, N_EMBD // N_HEAD),
            (f"{a}.rope.dimension_sections", ARRAY, (INT32, [4, 2, 2, 0])),
            (f"{a}.full_attention_interval", UINT32, 2),
            (f"{a}.ssm.conv_kernel", UINT32, SSM_CONV),
            (f"{a}.ssm.inner_size", UINT32, SSM_STATE * SSM_V_HEADS),
            (f"{a}.ssm.state_size", UINT32, SSM_STATE),
            (f"{a}.ssm.time_step_rank", UINT32, SSM_V_HEADS),
            (f"{a}.ssm.group_count", UINT32, SSM_K_HEADS),
        ]
    elif arch == "step35":
        kv += [
            (f"{a}.expert_feed_forward_length", UINT32, N_FF_EXP),  # required, though no layer here is MoE
            (f"{a}.attention.sliding_window", UINT32, STEP35_WINDOW),
            (f"{a}.attention.sliding_window_pattern", ARRAY, (INT32, [1 - il % 2 for il in range(n_blocks)])),
        ]
    else:
        kv += [
            (f"{a}.expert_feed_forward_length", UINT32, N_FF_EXP),
            (f"{a}.expert_count", UINT32, N_EXPERT),
            (f"{a}.expert_used_count", UINT32, 1),
            (f"{a}.expert_shared_count", UINT32, 1),
            (f"{a}.leading_dense_block_count", UINT32, N_TRUNK),
        ]
    if nextn:
        kv.append((f"{a}.nextn_predict_layers", UINT32, n_nextn))
    return _write(path, kv, tok, weights)


def _write(path: Path, kv: list[tuple[str, int, object]], tok: list[tuple[str, int, bytes]],
           weights: dict[str, np.ndarray]) -> Path:
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(weights), len(kv) + len(tok)))
    for key, vtype, value in kv:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", vtype) + encode_value(vtype, value)
    for key, vtype, raw in tok:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", vtype) + raw
    offset, blobs = 0, []
    for name, arr in weights.items():
        shape = arr.shape[::-1]
        out += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", len(shape))
        out += b"".join(struct.pack("<Q", d) for d in shape) + struct.pack("<IQ", 0, offset)
        data = arr.tobytes()
        data += b"\0" * (-len(data) % 32)
        blobs.append(data)
        offset += len(data)
    out += b"\0" * (-len(out) % 32)
    with open(path, "wb") as f:
        f.write(out)
        for data in blobs:
            f.write(data)
    return path


# Gemma 4 with its assistant: a separate GGUF (``gemma4-assistant``) whose layers have queries
# only; their keys and values are the target's, read from the target's own KV cache (the last
# sliding-window layer's for its sliding layers, the last full layer's for the others). It
# takes the target's token embedding, scaled, beside the target's final hidden state, and
# predicts with its own tied, narrower embedding. Aligned at noise 0: the target's
# attention and FFN outputs are zero (its hidden state is the token's embedding) and its
# output matrix is [A | 0], A the assistant's embedding; the assistant's pre-projection
# keeps the first ASSISTANT_EMBD dimensions of the target's embedding, its own attention and
# FFN outputs are zero, so both heads rank the vocabulary by A . e[:ASSISTANT_EMBD].
ASSISTANT_EMBD, ASSISTANT_LAYERS, GEMMA4_WINDOW = 32, 2, 16


def _gemma4_layer(make: _Maker, b: str, E: int, n_head: int, n_kv: int, noise: float) -> dict[str, np.ndarray]:
    """A Gemma 4 block (the assistant's has no keys and values of its own: n_kv = 0)."""
    rnd, ones, hd = make.rnd, make.ones, N_EMBD // N_HEAD
    # Gemma normalises the attention and FFN outputs before adding them: their post-norm
    # weights, not the projections, set how loud they are (zero at noise 0).
    loud = ones(E) * noise * 20
    w = {b + "attn_norm.weight": ones(E), b + "attn_q.weight": rnd(hd * n_head, E, scale=0.3),
         b + "attn_q_norm.weight": ones(hd), b + "attn_output.weight": rnd(E, hd * n_head, scale=0.3),
         b + "post_attention_norm.weight": loud, b + "ffn_norm.weight": ones(E),
         b + "ffn_gate.weight": rnd(2 * E, E, scale=0.2), b + "ffn_up.weight": rnd(2 * E, E, scale=0.2),
         b + "ffn_down.weight": rnd(E, 2 * E, scale=0.2), b + "post_ffw_norm.weight": loud.copy()}
    if n_kv:
        w.update({b + "attn_k.weight": rnd(hd * n_kv, E, scale=0.3), b + "attn_v.weight": rnd(hd * n_kv, E, scale=0.3),
                  b + "attn_k_norm.weight": ones(hd)})
    else:
        w[b + "layer_output_scale.weight"] = ones(1)
    return w


def _gemma4_kv(a: str, n_embd: int, n_blocks: int) -> list[tuple[str, int, object]]:
    hd = N_EMBD // N_HEAD
    return [
        ("general.architecture", STRING, a), ("general.file_type", UINT32, 0),
        (f"{a}.context_length", UINT32, 2048), (f"{a}.embedding_length", UINT32, n_embd),
        (f"{a}.block_count", UINT32, n_blocks), (f"{a}.feed_forward_length", UINT32, 2 * n_embd),
        (f"{a}.attention.head_count", UINT32, N_HEAD), (f"{a}.attention.head_count_kv", UINT32, N_HEAD_KV),
        (f"{a}.attention.key_length", UINT32, hd), (f"{a}.attention.value_length", UINT32, hd),
        (f"{a}.attention.key_length_swa", UINT32, hd), (f"{a}.attention.value_length_swa", UINT32, hd),
        (f"{a}.attention.layer_norm_rms_epsilon", FLOAT32, 1e-6),
        (f"{a}.attention.sliding_window", UINT32, GEMMA4_WINDOW),
        # Sliding layers first, the last one full (as Gemma 4 ends): the assistant's sliding
        # layer reads the target's last sliding layer, its full layer the target's full one.
        (f"{a}.attention.sliding_window_pattern", ARRAY, (INT32, [int(il < n_blocks - 1) for il in range(n_blocks)])),
        (f"{a}.rope.freq_base", FLOAT32, 10000.0), (f"{a}.rope.freq_base_swa", FLOAT32, 10000.0),
    ]


def write_gemma4_pair(folder: Path, tokenizer_from: Path, noise: float = 0.0, seed: int = 0,
                      name: str = "gemma4") -> tuple[Path, Path]:
    """A tiny Gemma 4 target (two layers: sliding, full) and its assistant (two query-only
    layers) in ``folder``: (target, assistant)."""
    tok = tokenizer_kv(tokenizer_from)
    n_vocab = next(struct.unpack_from("<IQ", raw)[1] for k, _, raw in tok if k == "tokenizer.ggml.tokens")
    make = _Maker(seed)
    A = make.rnd(n_vocab, ASSISTANT_EMBD)  # the assistant's tied embedding
    target = {"token_embd.weight": make.rnd(n_vocab, N_EMBD), "output_norm.weight": make.ones(N_EMBD),
              "output.weight": np.concatenate([A, np.zeros((n_vocab, N_EMBD - ASSISTANT_EMBD), np.float32)], axis=1)
              + make.rnd(n_vocab, N_EMBD, scale=noise / 8),
              "rope_freqs.weight": make.ones(N_EMBD // N_HEAD // 2)}
    for il in range(2):
        target.update(_gemma4_layer(make, f"blk.{il}.", N_EMBD, N_HEAD, N_HEAD_KV, noise))
    keep = np.zeros((ASSISTANT_EMBD, 2 * N_EMBD), np.float32)  # input: [target embedding * sqrt(n) | target hidden]
    keep[:, :ASSISTANT_EMBD] = np.eye(ASSISTANT_EMBD, dtype=np.float32) / np.sqrt(N_EMBD)
    assistant = {"token_embd.weight": A, "output_norm.weight": make.ones(ASSISTANT_EMBD),
                 "nextn.pre_projection.weight": keep + make.rnd(ASSISTANT_EMBD, 2 * N_EMBD, scale=noise / 8),
                 "nextn.post_projection.weight": make.rnd(N_EMBD, ASSISTANT_EMBD, scale=0.3),
                 "rope_freqs.weight": make.ones(N_EMBD // N_HEAD // 2)}
    for il in range(ASSISTANT_LAYERS):
        assistant.update(_gemma4_layer(make, f"blk.{il}.", ASSISTANT_EMBD, N_HEAD, 0, noise))
    t_kv = _gemma4_kv("gemma4", N_EMBD, 2) + [
        ("general.name", STRING, "Speculum Gemma 4 test"),
        ("gemma4.embedding_length_per_layer_input", UINT32, 0)]
    a = "gemma4-assistant"
    a_kv = _gemma4_kv(a, ASSISTANT_EMBD, ASSISTANT_LAYERS) + [
        ("general.name", STRING, "Speculum Gemma 4 assistant test"),
        (f"{a}.embedding_length_out", UINT32, N_EMBD),  # the target's width: its hidden state comes in
        (f"{a}.nextn_predict_layers", UINT32, ASSISTANT_LAYERS)]
    return (_write(folder / f"{name}.gguf", t_kv, tok, target),
            _write(folder / f"{name}-assistant.gguf", a_kv, tok, assistant))
