"""Time to first token of a repeated ~1,000-token prompt: cold, and resumed from the prompt cache.

Each round reads the prompt cold (nothing cached in either model), then another prompt of the
same size (another client's request, another conversation: it takes the models' caches), then
the first prompt again, which the prompt cache resumes from its saved state. Side by side in
one run, medians over the rounds.

    PYTHONPATH=app python scripts/bench_cache.py --target T.gguf [--draft D.gguf] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from speculum.engine.loading import load_decoder  # noqa: E402
from speculum.engine.settings import LoadOptions  # noqa: E402


def document(topic: str, n_lines: int) -> str:
    return "\n".join(f"{topic} record {i}: station {i % 7} logged {i * 13 % 97} units at {i % 24:02d}:00, "
                     f"status {'ok' if i % 5 else 'check'}." for i in range(n_lines))


def prompt_of(decoder, topic: str, tokens: int) -> list[int]:
    """A chat prompt of about ``tokens`` tokens: a log and a question about it."""
    t = decoder.target
    lines = 8
    while True:
        messages = [{"role": "system", "content": "Answer from the log only.\n" + document(topic, lines)},
                    {"role": "user", "content": f"Which {topic} stations needed a check?"}]
        prompt = t.tokenize(t.apply_chat_template(messages))
        if len(prompt) >= tokens:
            return prompt
        lines += max(1, (tokens - len(prompt)) // 30)


def first_token(decoder, prompt: list[int], mode: str) -> tuple[float, int, int]:
    """(seconds to the first token, prompt tokens read, prompt tokens reused)."""
    start = time.perf_counter()
    seconds = None
    generation = decoder.generate(prompt, max_tokens=4, policy=mode)
    for cycle in generation:
        if cycle.emitted and seconds is None:
            seconds = time.perf_counter() - start
    return seconds, generation.stats.prompt_tokens, generation.stats.prompt_cached


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--tokens", type=int, default=1000, help="prompt length (default 1000)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mode", default="auto")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    decoder = load_decoder(args.target, args.draft, LoadOptions(n_ctx=args.ctx, ngram_memory=False))
    prompt, other = prompt_of(decoder, "harbour", args.tokens), prompt_of(decoder, "orchard", args.tokens)
    first_token(decoder, other, args.mode)  # warm-up: threads started, pages touched
    rows = []
    for r in range(args.rounds):
        decoder.forget_prompts()
        cold = first_token(decoder, prompt, args.mode)
        first_token(decoder, other, args.mode)  # takes both models' caches
        cached = first_token(decoder, prompt, args.mode)
        rows.append({"round": r + 1, "cold_s": cold[0], "cold_read": cold[1],
                     "cached_s": cached[0], "cached_read": cached[1], "cached_reused": cached[2]})
        if not args.json:
            print(f"round {r + 1}: cold {cold[0]:.3f} s ({cold[1]} read)   "
                  f"cached {cached[0]:.3f} s ({cached[1]} read, {cached[2]} reused)", flush=True)
    cold_s = statistics.median(row["cold_s"] for row in rows)
    cached_s = statistics.median(row["cached_s"] for row in rows)
    summary = {"target": Path(args.target).name, "draft": Path(args.draft).name if args.draft else None,
               "mode": args.mode, "prompt_tokens": len(prompt), "rounds": rows,
               "cold_ttft_s": round(cold_s, 4), "cached_ttft_s": round(cached_s, 4),
               "cold_over_cached": round(cold_s / cached_s, 1),
               "cache_bytes": decoder.prompt_cache.size if decoder.prompt_cache else 0}
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"{len(prompt)}-token prompt, {args.mode} mode: time to first token cold {cold_s:.3f} s, "
              f"cached {cached_s:.3f} s ({summary['cold_over_cached']}x); "
              f"{summary['cache_bytes'] / 2**20:.0f} MiB of saved states")


if __name__ == "__main__":
    main()
