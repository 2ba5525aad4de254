"""`speculum bench`: every prompt in every mode, interleaved in one process, side by side.

Speed claims are ratios measured in one run (speculative vs plain on the same prompt,
same model), because shared machines are noisy.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from . import paths
from .documents import read_document
from .engine.decoder import Decoder
from .engine.prompts import build_messages
from .engine.sampling import SamplingParams
from .engine.stats import Stats
from .engine.vocabulary import Mode, Source
from .errors import SpeculumError

DEFAULT_SUITE = "bench/default.jsonl"


@dataclass
class BenchPrompt:
    name: str
    user: str
    system: str | None = None
    document: str | None = None
    temperature: float = 0.0
    max_tokens: int = 128
    seed: int = 0

    def messages(self) -> list[dict]:
        return build_messages(self.user, self.system, self.document)


def load_prompts(path: str | None = None) -> list[BenchPrompt]:
    file = Path(path) if path else paths.resource(DEFAULT_SUITE)
    if not file.is_file():
        raise SpeculumError(f"Prompt suite not found: {file}")
    prompts = []
    for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            doc = d.get("document")
            if doc is None and d.get("document_file"):
                doc = read_document(file.parent / d["document_file"])
            prompts.append(BenchPrompt(d["name"], d["user"], d.get("system"), doc,
                                       float(d.get("temperature", 0.0)), int(d.get("max_tokens", 128)),
                                       int(d.get("seed", 0))))
        except (ValueError, KeyError, TypeError) as exc:
            raise SpeculumError(f"{file}:{n}: not a valid prompt line ({exc}).") from None
    return prompts


def run_one(decoder: Decoder, prompt_tokens: list[int], mode: Mode, prompt: BenchPrompt,
            max_tokens: int, k: int | None = None) -> Stats:
    """One generation; its Stats."""
    sampling = SamplingParams(temperature=prompt.temperature, seed=prompt.seed)
    for _ in decoder.generate(prompt_tokens, max_tokens=max_tokens, sampling=sampling, policy=mode, k=k):
        pass
    return decoder.stats


def run_bench(decoder: Decoder, prompts: list[BenchPrompt], modes: list[Mode], max_tokens: int | None = None,
              repeat: int = 1, k: int | None = None, progress: TextIO | None = None) -> list[dict]:
    """Interleave modes per prompt and repetition; per (prompt, mode) the median tokens/s of
    the repeats, and the other figures over all of them."""
    if Source.MODEL not in decoder.drafters:
        modes = [m for m in modes if m != Mode.DRAFT]
    if Source.MTP not in decoder.drafters:  # no NextN layers: nothing to compare
        modes = [m for m in modes if m != Mode.MTP]
    merged: dict[tuple[str, Mode], Stats] = {}
    rates: dict[tuple[str, Mode], list[float]] = {}
    tokenized = {p.name: decoder.target.tokenize(decoder.target.apply_chat_template(p.messages())) for p in prompts}
    # Warm-up: the first decode after loading is slower (page faults, thread start).
    list(decoder.generate(tokenized[prompts[0].name], max_tokens=4, policy=Mode.OFF))
    for r in range(repeat):
        for p in prompts:
            for mode in modes:
                stats = run_one(decoder, tokenized[p.name], mode, p, max_tokens or p.max_tokens, k)
                if progress:
                    progress.write(f"[{r + 1}/{repeat}] {p.name:<22} {mode:<7} {stats.tokens_per_s:6.1f} tok/s\n")
                    progress.flush()
                merged.setdefault((p.name, mode), Stats()).merge(stats)
                rates.setdefault((p.name, mode), []).append(stats.tokens_per_s)
    results = []
    for (name, mode), s in merged.items():
        results.append({
            "name": name, "mode": mode, "tokens": s.tokens // repeat,
            "tokens_per_s": round(statistics.median(rates[name, mode]), 3),
            "acceptance_rate": round(s.acceptance_rate, 4),
            "tokens_per_pass": round(s.tokens_per_pass, 4),
            "overhead_ms_per_cycle": round(s.overhead_ms_per_cycle, 4),
            "draft_share": round(s.draft_share, 4),
            "choices": {source: round(share, 3) for source, share in s.choices.items()},
        })
    off = {r["name"]: r["tokens_per_s"] for r in results if r["mode"] == Mode.OFF}
    for r in results:
        base = off.get(r["name"])
        r["speedup_vs_off"] = round(r["tokens_per_s"] / base, 3) if base else None
    return results


def print_table(results: list[dict], out: TextIO) -> None:
    head = (f"{'prompt':<22} {'mode':<7} {'tokens':>6} {'tok/s':>7} {'accept':>7} {'tok/pass':>8} "
            f"{'ovh ms':>7} {'vs off':>7}  passes by drafter")
    out.write(head + "\n" + "-" * len(head) + "\n")
    for r in results:
        sp = f"{r['speedup_vs_off']:.2f}x" if r["speedup_vs_off"] is not None else "-"
        acc = f"{100 * r['acceptance_rate']:.0f}%" if r["mode"] != Mode.OFF else "-"
        out.write(f"{r['name']:<22} {r['mode']:<7} {r['tokens']:>6} {r['tokens_per_s']:>7.1f} {acc:>7} "
                  f"{r['tokens_per_pass']:>8.2f} {r['overhead_ms_per_cycle']:>7.3f} {sp:>7}  "
                  + " ".join(f"{src} {100 * share:.0f}%" for src, share in r["choices"].items()) + "\n")
