"""An answer as the window keeps it: the text so far, the cycle records and numbers stored with it."""

from __future__ import annotations


def answer_so_far(cycles, stages) -> str:
    """The answer as it stood after ``cycles``: while a long document is summarised in parts,
    the part being written under its stage name."""
    stage = stages[-1] if stages else ""
    if not stage:
        return "".join(c.text for c in cycles)
    return f"*{stage}…*\n\n" + "".join(c.text for c, s in zip(cycles, stages) if s == stage)


def cycle_records(cycles, stages) -> list[dict]:
    """The cycles stored with an answer, each tagged with its stage of a long document."""
    records = [cycle.to_json() for cycle in cycles]
    for record, stage in zip(records, stages):
        if stage:
            record["stage"] = stage
    return records


def answer_stats(snap) -> dict:
    """The numbers stored with an answer (shown in its header, used by replay)."""
    return {"tokens_per_s": round(snap.tokens_per_s, 3), "tokens": snap.tokens,
            "acceptance_rate": round(snap.acceptance_rate, 4), "tokens_per_pass": round(snap.tokens_per_pass, 4),
            "prompt_tokens": snap.prompt_tokens, "prompt_total": snap.prompt_total,
            "seconds": round(snap.seconds, 4)}
