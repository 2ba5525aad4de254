"""The GGUF header reader on real, hostile, damaged and fuzzed input: one SpeculumError line, bounded work."""

from __future__ import annotations

import math
import os
import random
import struct
import time
import tracemalloc

import pytest

from ggufgen import (
    ARRAY, BOOL, FLOAT32, INT32, INT64, STRING, UINT8, UINT32, UINT64, gguf_bytes, nested_arrays,
)
from speculum.cli import main
from speculum.errors import SpeculumError
from speculum.models.compat import check_headers, describe_vocab
from speculum.models.gguf import MAX_READ, VOCAB_KEYS, GGUFHeader, check_gguf_file, read_file_header, read_header
from speculum.models.remote import HubRef, read_remote_header

MiB = 1 << 20
CASE_SECONDS = 1.0
CASE_BYTES = 256 * MiB


def from_bytes(data: bytes, requests: list[int] | None = None):
    def read_at(offset: int, size: int) -> bytes:
        if requests is not None:
            requests.append(size)
        return data[offset:offset + size]
    return read_at


# ---- Windows has no os.pread -------------------------------------------------------------------


@pytest.fixture(params=["pread", "no pread"])
def file_reads(request, monkeypatch):
    """Every file read in a test runs twice: as on Unix, and as on Windows, where os.pread is missing."""
    if request.param == "no pread":
        monkeypatch.delattr(os, "pread")
    return request.param


def test_real_headers_read_the_same_with_and_without_pread(file_reads, smollm_path, gemma_path):
    for path in (smollm_path, gemma_path):
        header = read_file_header(path, VOCAB_KEYS)
        with open(path, "rb") as f:
            prefix = f.read(header.bytes_read)
        expected = read_header(from_bytes(prefix), str(path), VOCAB_KEYS)
        assert header.metadata == expected.metadata and header.tensors == expected.tensors
        assert header.data_offset == expected.data_offset and header.vocab_size == expected.vocab_size > 1000
        assert check_gguf_file(path).architecture == expected.architecture


def test_damaged_files_give_the_same_message_with_and_without_pread(file_reads, tmp_path, smollm_path):
    with open(smollm_path, "rb") as src:
        head = src.read(3 * MiB)
    (tmp_path / "cut.gguf").write_bytes(head[:5000])
    (tmp_path / "short.gguf").write_bytes(head)
    with pytest.raises(SpeculumError, match="its GGUF header ends early"):
        check_gguf_file(tmp_path / "cut.gguf")
    with pytest.raises(SpeculumError, match=f"it has {3 * MiB:,} bytes but its tensors need 98,362,432"):
        check_gguf_file(tmp_path / "short.gguf")


# ---- hostile headers -------------------------------------------------------------------------------

LLAMA = ("general.architecture", STRING, "llama")


def lying_array(key: str, etype: int, count: int, pad: int = 0) -> bytes:
    """A header whose ``key`` claims ``count`` items of ``etype`` and holds ``pad`` zero bytes."""
    head = gguf_bytes([LLAMA], n_kv=2)
    return head + struct.pack("<Q", len(key)) + key.encode() + struct.pack("<IIQ", ARRAY, etype, count) + bytes(pad)


HOSTILE = {
    "2,000 nested arrays": nested_arrays(2000),
    "2,000 nested arrays in the vocabulary": nested_arrays(2000).replace(
        b"\x01\x00\x00\x00\x00\x00\x00\x00x", struct.pack("<Q", 21) + b"tokenizer.ggml.tokens"),
    "alignment as text": gguf_bytes([LLAMA, ("general.alignment", STRING, "32")]),
    "alignment infinite": gguf_bytes([LLAMA, ("general.alignment", FLOAT32, math.inf)]),
    "alignment NaN": gguf_bytes([LLAMA, ("general.alignment", FLOAT32, math.nan)]),
    "alignment not a power of two": gguf_bytes([LLAMA, ("general.alignment", UINT32, 48)]),
    "alignment of 2^63": gguf_bytes([LLAMA, ("general.alignment", UINT64, 1 << 63)]),
    "context length as text": gguf_bytes([LLAMA, ("llama.context_length", STRING, "4096")]),
    "architecture as a number": gguf_bytes([("general.architecture", UINT32, 7)]),
    "name as a number": gguf_bytes([LLAMA, ("general.name", FLOAT32, 1.5)]),
    "file type as text": gguf_bytes([LLAMA, ("general.file_type", STRING, "Q4_K_M")]),
    "BOS id as text": gguf_bytes([LLAMA, ("tokenizer.ggml.bos_token_id", STRING, "1")]),
    "tokens as one text": gguf_bytes([LLAMA, ("tokenizer.ggml.tokens", STRING, "abc")]),
    "tokens as numbers": gguf_bytes([LLAMA, ("tokenizer.ggml.tokens", ARRAY, (UINT32, [1, 2, 3]))]),
    "2^28 u64 token types": lying_array("tokenizer.ggml.token_type", UINT64, 1 << 28),
    "2^60 strings": lying_array("tokenizer.ggml.merges", STRING, 1 << 60),
    "2^40 skipped floats": lying_array("tokenizer.ggml.scores", FLOAT32, 1 << 40, pad=64),
    "string of 2^62 bytes": gguf_bytes([LLAMA]) [:24] + struct.pack("<Q", 1 << 62) + b"key",
    "2^60 metadata keys": gguf_bytes([LLAMA], n_kv=1 << 60),
    "2^40 tensors": gguf_bytes([LLAMA], n_tensors=1 << 40),
    "unknown value type": gguf_bytes([LLAMA], n_kv=2) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 99),
    "array of an unknown type": lying_array("k", 99, 5, pad=64),
    "tensor with 2^32-1 dimensions": gguf_bytes([LLAMA], n_tensors=1) + struct.pack("<Q", 1) + b"w"
    + struct.pack("<I", 0xFFFFFFFF) + bytes(64),
    "tensor of an unknown ggml type": gguf_bytes([LLAMA], [("w", (4, 4), 999, 0)]),
    "version 99": gguf_bytes([LLAMA], version=99),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_header_is_one_plain_error(case):
    requests: list[int] = []
    start = time.perf_counter()
    with pytest.raises(SpeculumError) as err:
        read_header(from_bytes(HOSTILE[case], requests), "hostile.gguf", VOCAB_KEYS)
    assert time.perf_counter() - start < CASE_SECONDS
    message = str(err.value)
    assert message.startswith("hostile.gguf ") and "\n" not in message
    assert max(requests) <= MAX_READ


def test_a_claimed_huge_array_is_never_asked_for_at_once():
    # 2^21 u64 items (16 MB) of a file that goes on with zeros: the header is valid, read in 1 MB steps
    requests: list[int] = []
    data = lying_array("tokenizer.ggml.token_type", UINT64, 1 << 21, pad=(1 << 21) * 8 + 64)
    header = read_header(from_bytes(data, requests), "big.gguf", VOCAB_KEYS)
    assert header.array_lengths["tokenizer.ggml.token_type"] == 1 << 21
    assert max(requests) <= MAX_READ and header.bytes_read >= 16 * MiB


def test_hub_header_claiming_2_gib_is_refused_without_asking_for_it(hub):
    data = lying_array("tokenizer.ggml.token_type", UINT64, 1 << 28, pad=4 * MiB)
    hub.add_bytes("evil-org/Huge-GGUF", "huge.gguf", data)

    with pytest.raises(SpeculumError, match="damaged GGUF header.*268,435,456 array items") as err:
        read_remote_header(HubRef("evil-org/Huge-GGUF", "huge.gguf"))
    assert "\n" not in str(err.value)
    spans = []
    for r in hub.requests("GET", "cdn"):
        start, end = r.range.removeprefix("bytes=").split("-")
        spans.append(int(end) - int(start) + 1)
    assert spans and max(spans) <= MAX_READ


def test_cli_hostile_header_is_one_line_and_exit_2(tmp_path, capsys, smollm_path):
    nested = tmp_path / "nested.gguf"
    nested.write_bytes(nested_arrays(2000))
    align = tmp_path / "align.gguf"
    align.write_bytes(HOSTILE["alignment NaN"])
    for argv in (["models", "check", str(nested), str(smollm_path)],
                 ["models", "check", str(smollm_path), str(align)],
                 ["generate", "--target", str(nested), "--max-tokens", "1", "hi"],
                 ["generate", "--target", str(smollm_path), "--draft", str(align), "--max-tokens", "1", "hi"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("speculum: ") and "damaged GGUF header" in err, argv


# ---- fuzzing -------------------------------------------------------------------------------------------

FUZZ_CASES = 10_000
FUZZ_SEED = 20261130
PREFIX = 64 * 1024
INTERESTING = [0, 1, 2, 3, 7, 8, 9, 10, 12, 13, 31, 255, 0xFFFF, 2000, 1 << 20, 1 << 21, (1 << 21) + 1, 1 << 28,
               1 << 31, 0xFFFFFFFF, 1 << 32, 1 << 40, 1 << 62, (1 << 64) - 1]


def _typed(value) -> tuple[int, object]:
    if isinstance(value, bool):
        return BOOL, value
    if isinstance(value, int):
        return (INT32, value) if -(1 << 31) <= value < (1 << 31) else (UINT64 if value > 0 else INT64, value)
    if isinstance(value, float):
        return FLOAT32, value
    if isinstance(value, str):
        return STRING, value
    items = [_typed(v) for v in value[:16]]
    etype = items[0][0] if items else UINT8
    return ARRAY, (etype, [v for t, v in items if t == etype])


def compact_header(path) -> bytes:
    """A model's real header, complete, with its arrays cut to 16 items and its first 64 tensors."""
    keys = read_file_header(path).array_lengths
    header = read_file_header(path, keep_arrays=keys)
    kv = [(key, *_typed(value)) for key, value in header.metadata.items()]
    tensors = [(t.name, t.shape, t.ggml_type, t.offset) for t in header.tensors[:64]]
    return gguf_bytes(kv, tensors)


def mutate(rng: random.Random, data: bytes, seeds: list[bytes]) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not out:
            break
        first = 0 if rng.random() < 0.02 else min(4, len(out) - 1)  # the magic, now and then
        i = rng.randrange(first, max(first + 1, min(len(out), rng.choice((32, 256, 4096, len(out))))))
        op = rng.randrange(8)
        if op == 0:
            out[i] = rng.randrange(256)
        elif op == 1:
            out[i:i + 4] = struct.pack("<I", rng.choice(INTERESTING) & 0xFFFFFFFF)
        elif op == 2:
            out[i:i + 8] = struct.pack("<Q", rng.choice(INTERESTING))
        elif op == 3:
            out[i:i + 4] = struct.pack("<I", rng.randrange(14))  # another value type
        elif op == 4:
            del out[i:]
        elif op == 5:
            j = rng.randrange(len(out))
            out[i:i] = out[j:j + rng.randrange(1, 64)]
        elif op == 6:
            del out[i:i + rng.randrange(1, 64)]
        else:
            other = rng.choice(seeds)
            j = rng.randrange(len(other))
            out[i:] = other[j:j + rng.randrange(1, 4096)]
    return bytes(out)


def use(header: GGUFHeader) -> None:
    """Everything the app reads from a header that passed."""
    (header.architecture, header.name, header.quantization, header.vocab_size, header.context_length,
     header.n_parameters, header.required_size, header.data_offset)
    describe_vocab(header, "target")
    check_headers(header, header)


def test_fuzzed_headers_end_in_an_error_or_a_valid_header(smollm_path, gemma_path):
    seeds = []
    for path in (smollm_path, gemma_path):
        with open(path, "rb") as f:
            seeds.append(f.read(PREFIX))
        seeds.append(compact_header(path))
    seeds += list(HOSTILE.values())
    rng = random.Random(FUZZ_SEED)
    outcomes = {"error": 0, "valid": 0}
    slowest, largest, failures = 0.0, 0, []
    tracemalloc.start()
    began = time.perf_counter()
    try:
        for case in range(FUZZ_CASES):
            data = mutate(rng, rng.choice(seeds), seeds)
            tracemalloc.reset_peak()
            start = time.perf_counter()
            try:
                header = read_header(from_bytes(data), "fuzz.gguf", VOCAB_KEYS)
                use(header)
                outcomes["valid"] += 1
            except SpeculumError as exc:
                outcomes["error"] += 1
                if "\n" in str(exc) or not str(exc).startswith("fuzz.gguf "):
                    failures.append((case, repr(exc)))
            except Exception as exc:  # noqa: BLE001 - anything else is the bug this test looks for
                failures.append((case, repr(exc)))
            slowest = max(slowest, time.perf_counter() - start)
            largest = max(largest, tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()
    total = time.perf_counter() - began
    assert not failures, failures[:5]
    assert slowest < CASE_SECONDS and largest < CASE_BYTES
    assert outcomes["valid"] > 100 and outcomes["error"] > 1000, outcomes  # both paths were exercised
    assert total < 60, f"{FUZZ_CASES} cases took {total:.0f} s"
