"""The terminal view of a generation: accepted drafts green, rejected drafts struck
through in red, the target's own tokens plain, then one summary line."""

from __future__ import annotations

import sys
from typing import TextIO

from .engine.cycle import Cycle, PolicyReport
from .engine.stats import Stats
from .engine.vocabulary import Finish

GREEN = "\x1b[32m"
RED_STRUCK = "\x1b[9;31m"
DIM = "\x1b[2m"
RESET = "\x1b[0m"


LONG_PROMPT = 512  # tokens: reading takes seconds on a CPU, worth a line even off a terminal


class PromptProgress:
    """"Reading the prompt… 340 / 1,200 tokens" on stderr while a prompt is read: redrawn in
    place on a terminal; off one (a log), a line per tenth, and only for a long prompt.
    Never on stdout, which may carry --json."""

    def __init__(self, err: TextIO | None = None):
        self.err = err or sys.stderr
        self.tty = self.err.isatty()
        self._shown = -1.0
        self._open = False

    def __call__(self, read: int, total: int) -> None:
        if not (self.tty or total >= LONG_PROMPT) or total <= 0:
            return
        line = f"Reading the prompt… {read:,} / {total:,} tokens"
        if self.tty:
            self.err.write("\r" + line + ("\r\x1b[K" if read >= total else ""))
            self._open = read < total
        elif read >= total or read / total - self._shown >= 0.1:
            self._shown = read / total
            self.err.write(line + "\n")
        self.err.flush()


class TerminalView:
    def __init__(self, model, out: TextIO | None = None, color: bool | None = None):
        self.model = model
        self.out = out or sys.stdout  # looked up now: a default bound at import outlives a redirected stdout
        self.color = self.out.isatty() if color is None else color
        self._detok = model.detokenizer()

    def _text(self, token: int) -> str:
        return "" if self.model.is_eog(token) else self._detok.feed(token)

    def show(self, cycle: Cycle) -> None:
        if not self.color:
            self.out.write(cycle.text)
        else:
            parts = []
            for i, tok in enumerate(cycle.emitted):
                text = self._text(tok)
                if i < cycle.n_accepted:
                    parts.append(f"{GREEN}{text}{RESET}")
                else:
                    rejected = "".join(cycle.drafted_text[cycle.n_accepted:])
                    if rejected:
                        parts.append(f"{RED_STRUCK}{rejected}{RESET}")
                    parts.append(text)
            if cycle.finish:
                parts.append(self._detok.flush())
            self.out.write("".join(parts))
        self.out.flush()

    def summary(self, stats: Stats, finish: Finish | None, message: str = "",
                policy: PolicyReport | None = None) -> None:
        line = (f"{stats.tokens} tokens, {stats.tokens_per_s:.1f} tok/s, "
                f"acceptance {100 * stats.acceptance_rate:.0f}% "
                f"({stats.accepted}/{stats.drafted}), {stats.tokens_per_pass:.2f} tokens/pass, "
                f"overhead {stats.overhead_ms_per_cycle:.2f} ms/cycle, ended: {finish}")
        if stats.passes_by_source:
            line += "\npasses: " + ", ".join(f"{src} {n}" for src, n in sorted(stats.passes_by_source.items()))
        if policy is not None and policy.plain_tokens_per_s is not None:
            line += (f"; policy now: {policy.source} k={policy.k}, plain decoding "
                     f"~{policy.plain_tokens_per_s:.1f} tok/s here, verify cost by batch "
                     + " ".join(f"{n}:{c:.2f}x" for n, c in (policy.verify_cost or {}).items()))
        self.out.write("\n")
        if message:
            self.out.write(message + "\n")
        self.out.write((f"{DIM}{line}{RESET}" if self.color else line) + "\n")
        self.out.flush()
