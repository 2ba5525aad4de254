"""Colours and token labels shared by the speculation view, the legend and the stats charts."""

from __future__ import annotations

import re

from PySide6.QtGui import QColor

from ..engine.vocabulary import Mode, Source

ACCEPTED = "accepted"  # a drafted token the target agreed with
REJECTED = "rejected"  # a drafted token the target refused
CORRECTION = "correction"  # the target's own token after a rejection
BONUS = "bonus"  # the target's extra token after every draft was accepted
PLAIN = "plain"  # a token from a plain step (nothing drafted)
PROPOSED = "proposed"  # replay: drafted, not yet verified
PREDICTED = "predicted"  # a token of an API client's prediction the target agreed with
MTP_ACCEPTED = "mtp"  # a token the model's own MTP head drafted and the target agreed with

# (text colour, background)
COLOURS = {
    ACCEPTED: ("#0b5d1e", "#c9f2d0"),
    REJECTED: ("#a1121f", "#fbd5d8"),
    CORRECTION: ("#1d3f9e", "#d6e2ff"),
    BONUS: ("#5b2a91", "#eadcfb"),
    PLAIN: ("#30343b", None),
    PROPOSED: ("#5f6670", "#eceef1"),
    PREDICTED: ("#0b5563", "#c6eef3"),
    MTP_ACCEPTED: ("#7a4a00", "#fde8bf"),
}

# Short names for the legend; the tooltips say more.
SHORT = {ACCEPTED: "accepted", REJECTED: "rejected", CORRECTION: "correction", BONUS: "bonus", PLAIN: "plain step",
         PREDICTED: "from prediction", MTP_ACCEPTED: "from MTP head"}

# The window lists the modes in this order.
MODE_NAMES = {Mode.AUTO: "Auto", Mode.DRAFT: "Draft model", Mode.LOOKUP: "Prompt lookup",
              Mode.MTP: "Built-in (MTP)", Mode.OFF: "Off"}
BUILT_IN_MTP = MODE_NAMES[Mode.MTP]  # also the draft picker's choice for a target that drafts for itself
BUILT_IN = "builtin:mtp"  # that choice's data: no draft file


def window_words(message: str) -> str:
    """An engine message (shared with the CLI) in the window's words: its controls, not flags."""
    message = re.sub(r"\(--mode (\w+)\)", lambda m: f"(Mode: {_mode_name(m[1])})", message)
    message = re.sub(r"--mode (\w+)", lambda m: f"Mode: {_mode_name(m[1])}", message)
    return message.replace("pass --draft", "pick a draft model").replace("--draft", "a draft model")


def _mode_name(word: str) -> str:
    try:
        return MODE_NAMES[Mode(word)]
    except ValueError:
        return word

LABELS = {
    ACCEPTED: "accepted draft",
    REJECTED: "rejected draft",
    CORRECTION: "target's correction",
    BONUS: "target's bonus token",
    PLAIN: "plain step",
    PROPOSED: "proposed, not yet verified",
    PREDICTED: "accepted draft from the API client's prediction",
    MTP_ACCEPTED: "accepted draft from the model's own multi-token prediction (NextN) head",
}

# An accepted draft shows in its drafter's own colour where it has one.
ACCEPTED_AS = {Source.PREDICTION: PREDICTED, Source.MTP: MTP_ACCEPTED}

DRAFTERS = {Source.MODEL: "draft model", Source.LOOKUP: "prompt lookup", Source.PREDICTION: "client's prediction",
            Source.MEMORY: "n-gram memory", Source.GRAMMAR: "the grammar's forced text",
            Source.MTP: "MTP head (the model's own NextN layer)", Source.NONE: "none (plain step)"}

CHART_LINE = QColor("#2f6fdf")
CHART_FILL = QColor(47, 111, 223, 40)
BAR = QColor("#2e9d4f")
BAR_BACK = QColor("#e6e8eb")
GRID = QColor("#c9cdd3")
MUTED = QColor("#6b7280")


def visible(text: str) -> str:
    """A token's text with the whitespace that matters made visible.

    Newlines show as ↵ (then break the line), tabs as ⇥; a token of only spaces shows
    each space as ·, since an empty-looking token would hide that it exists.
    """
    if text == "":
        return "∅"
    if not text.strip(" "):
        return "·" * len(text)
    return text.replace("\t", "⇥").replace("\r", "").replace("\n", "↵\n")


def use_light_look(app) -> None:
    """Fusion and its light palette, on every platform and under every desktop theme.

    The style sheet (resources/style.qss) paints light backgrounds and leaves text to the
    palette; under a dark theme (macOS dark mode, Breeze Dark, Windows' dark mode) the palette's
    text is light, and the transcript, the stats, the toolbar's labels and what the user types
    were white on white. Native styles draw some controls in the system's appearance whatever
    the palette says: Fusion draws them all with it."""
    from PySide6.QtWidgets import QStyleFactory

    style = QStyleFactory.create("Fusion")
    if style is not None:  # a Qt build without it keeps its own style, with a light palette still
        app.setStyle(style)
    app.setPalette(app.style().standardPalette())
