#!/usr/bin/env python3
"""Speculum's plain decoding vs llama-cpp-python's own high-level API, side by side.

Same model, same prompt, same threads, same number of greedy tokens, interleaved in
one process so machine noise hits both alike. Prints tokens/s of each and the ratio
(issue: `speculum generate` must reach >= 97% of the high-level API).

    python scripts/bench_backend.py --target MODEL.gguf [--tokens 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from llama_cpp import Llama

from speculum.engine.llama.model import LlamaModel
from speculum.engine.llama.native import default_threads
from speculum.engine.settings import LoadOptions
from speculum.engine.decoder import Decoder

PROMPT = "Write a Python function that checks whether a number is prime, with a docstring."


def high_level(llm: Llama, prompt: list[int], n: int) -> tuple[float, list[int]]:
    out = []
    start = None
    for tok in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        if start is None:  # the first token comes with the prompt: time decoding only
            start = time.perf_counter()
        out.append(tok)
        if len(out) == n + 1:
            break
    return n / (time.perf_counter() - start), out


def speculum_plain(decoder: Decoder, prompt: list[int], n: int) -> tuple[float, list[int]]:
    decoder.forget_prompts()  # no cached prompt: the same work as the high-level API
    out = []
    start = None
    for cycle in decoder.generate(prompt, max_tokens=n + 1, policy="off"):
        if start is None:
            start = time.perf_counter()
        out.extend(cycle.emitted)
    return n / (time.perf_counter() - start), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=default_threads())
    args = ap.parse_args()

    llm = Llama(args.target, n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads,
                n_gpu_layers=-1, verbose=False)
    model = LlamaModel(args.target, LoadOptions(n_ctx=2048, n_threads=args.threads))
    decoder = Decoder(model)
    prompt = model.tokenize(model.apply_chat_template([{"role": "user", "content": PROMPT}]))
    ours, theirs = [], []
    for r in range(args.rounds):
        a, out_a = high_level(llm, prompt, args.tokens)
        b, out_b = speculum_plain(decoder, prompt, args.tokens)
        theirs.append(a)
        ours.append(b)
        same = out_a[: len(out_b)] == out_b[: len(out_a)]
        print(f"round {r + 1}: llama-cpp-python {a:6.2f} tok/s   speculum {b:6.2f} tok/s   "
              f"ratio {b / a:.3f}   same tokens: {same}")
    ratio = statistics.median(o / t for o, t in zip(ours, theirs))
    print(f"median ratio speculum / llama-cpp-python high-level: {ratio:.3f}")


if __name__ == "__main__":
    main()
