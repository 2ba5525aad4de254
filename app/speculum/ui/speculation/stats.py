"""The stats panel: acceptance, tokens/s over the generation, speedup, the policy's choice.

Everything shown is computed by the worker (``StatsSnapshot``); these widgets only draw.
"""

from __future__ import annotations

import re

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QAction, QFont, QFontInfo, QFontMetricsF, QGuiApplication, QPainter, QPainterPath, QPen, QTextOption
from PySide6.QtWidgets import QGroupBox, QLabel, QToolTip, QVBoxLayout, QWidget

from ...protocol import Yardstick
from .. import look
from ..opaque import paints_own_background


# The policy's estimates worth showing, when it gives them (auto mode). As ratios: its own plain
# rate (its cost model's) is not the plain speed the Speedup row shows, and two plain speeds on
# one panel ("plain 4.9 tok/s" beside a speedup over 8.7 tok/s) read as a contradiction.
ESTIMATES = (
    ("expected_tokens_per_pass", "expects {:.2f} tokens/pass"),
    ("expected_speedup", "{:.2f}× expected"),
)


# No line break inside a phrase: no-break spaces, and a word joiner after a slash ("tok/s"
# breaks after its slash by Unicode's rules); copied text gets ordinary spaces back.
_GLUE = {" ": "\u00a0", "/": "/\u2060"}
_ORDINARY = {ord("\u00a0"): " ", ord("\u2060"): None}


def _unbroken(phrase: str) -> str:
    return "".join(_GLUE.get(c, c) for c in phrase)


def policy_text(policy: dict) -> str:
    """The Policy row: the drafter and k, the learning notice, the estimates. The row holds four
    lines and the estimates often wrap onto two: the notice goes before them (after them it was
    cut off at the window's usual width)."""
    drafter = look.DRAFTERS.get(policy.get("source", ""), policy.get("source", "—"))
    # Each estimate one unbreakable phrase: wrapped inside one, "7.6 tok/s" ended a line and
    # "expected · plain 7.6 tok/s" began the next, which read as the plain rate expected.
    estimates = [_unbroken(label.format(policy[key])) for key, label in ESTIMATES
                 if isinstance(policy.get(key), (int, float))]
    return "\n".join([f"{drafter}, k = {policy.get('k', 0)}" if policy else "—"]
                     + (["still learning this machine's costs"] if policy.get("learning") else [])
                     + ([" · ".join(estimates)] if estimates else []))


BACKGROUND = Qt.white  # the stats group box's, from the style sheet


class Chart(QWidget):
    """A chart of the panel: 84 pixels tall where the pane has room, down to 56 where it has not
    (two charts fixed at 84 made the pane 60 pixels taller than its column in a window on a
    1280x720 screen, which then scrolled its chart out of sight)."""

    PREFERRED_HEIGHT, SMALLEST_HEIGHT = 84, 56

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setMinimumHeight(self.SMALLEST_HEIGHT)
        paints_own_background(self)

    def sizeHint(self) -> QSize:
        return QSize(super().sizeHint().width(), self.PREFERRED_HEIGHT)


class Readout(QWidget):
    """Rows of a name and a value, painted in one pass.

    The values change several times a second while generating; a QLabel per value would
    re-lay out and repaint the window around it at every change. Each row has a fixed
    number of lines, so the height never changes. Right-click copies the rows as text.
    """

    ROW_GAP = 2  # pixels between rows

    def __init__(self, rows: list[tuple[str, int]], parent=None):
        super().__init__(parent)
        self.rows = rows  # (name, lines)
        self.values = {name: "—" for name, _ in rows}
        self.tips: dict[str, str] = {}  # a row's words on hover (what a number is measured against)
        paints_own_background(self)
        self.setContextMenuPolicy(Qt.ActionsContextMenu)
        copy = QAction("Copy stats", self)
        copy.triggered.connect(lambda: QGuiApplication.clipboard().setText(self.as_text()))
        self.addAction(copy)

    def set_values(self, values: dict[str, str]) -> None:
        if any(self.values.get(k) != v for k, v in values.items()):
            self.values.update(values)
            self.update()

    def value(self, name: str) -> str:
        return self.values[name]

    def row_at(self, y: int) -> str | None:
        top = 0
        for name, lines in self.rows:
            top += lines * self._line() + self.ROW_GAP
            if y < top:
                return name
        return None

    def event(self, event) -> bool:
        if event.type() == QEvent.ToolTip:
            tip = self.tips.get(self.row_at(event.pos().y()) or "", "")
            if tip:
                QToolTip.showText(event.globalPos(), tip, self)
            else:
                QToolTip.hideText()
            return True
        return super().event(event)

    def as_text(self) -> str:
        return "\n".join(f"{name}: {self.values[name]}" for name, _ in self.rows).translate(_ORDINARY)

    def _line(self) -> int:
        return self.fontMetrics().lineSpacing()

    def _name_width(self) -> int:
        return max(self.fontMetrics().horizontalAdvance(name) for name, _ in self.rows) + 12

    # Room for the longest one-line values ("— (no plain step measured yet)", "22.1  (71 tokens
    # in 3.2 s)"): at 80 pixels, in a 1093-pixel window, they were cut.
    VALUE_WIDTH = 200

    def sizeHint(self) -> QSize:
        return QSize(self._name_width() + self.VALUE_WIDTH + 40,
                     sum(lines * self._line() + self.ROW_GAP for _, lines in self.rows))

    def minimumSizeHint(self) -> QSize:
        return QSize(self._name_width() + self.VALUE_WIDTH, self.sizeHint().height())

    def _wrappable(self, text: str, width: float) -> str:
        """``text`` as painted: its glued phrases whole where each fits a line, else broken at
        their spaces again rather than anywhere ("tokens/pa" / "ss")."""
        fm = self.fontMetrics()
        if all(fm.horizontalAdvance(word) <= width for word in re.split(r"[ \n]", text)):
            return text
        return text.translate(_ORDINARY)

    def paintEvent(self, event):
        p = QPainter(self)
        p.fillRect(self.rect(), BACKGROUND)
        line, left = self._line(), self._name_width()
        wrap = QTextOption()
        wrap.setWrapMode(QTextOption.WrapAtWordBoundaryOrAnywhere)
        y = 0
        for name, lines in self.rows:
            height = lines * line
            p.setPen(look.MUTED)
            p.drawText(QRectF(0, y, left, line), Qt.AlignLeft | Qt.AlignVCenter, name)
            p.setPen(self.palette().text().color())
            p.save()
            p.setClipRect(QRectF(left, y, self.width() - left, height))  # a longer value is cut, not spilled
            p.drawText(QRectF(left, y, self.width() - left, height),
                       self._wrappable(self.values[name], self.width() - left), wrap)
            p.restore()
            y += height + self.ROW_GAP


class AcceptanceBars(Chart):
    """One bar per draft position: how often a draft survived to that position."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.rates: list[float] = []
        self.setToolTip("Acceptance per draft position: the share of drafts accepted at position 1, 2, …")

    def set_rates(self, rates: list[float]) -> None:
        if rates != self.rates:
            self.rates = list(rates)
            # Every rate in words too: narrow bars may have no room for their labels.
            self.setToolTip("Acceptance per draft position: the share of drafts accepted at position 1, 2, …"
                            + ("\n" + ", ".join(f"{i + 1}: {r:.0%}" for i, r in enumerate(self.rates))
                               if self.rates else ""))
            self.update()

    GAP = 6.0
    SMALLEST = 6.5  # points: smaller labels are not read, the tooltip says the rates

    def _area(self) -> QRectF:
        return QRectF(self.rect()).adjusted(4, 4, -4, -18)

    def bars(self) -> tuple[list[tuple[float, float, str]], QFont]:
        """Each bar's left edge, width and label, and the labels' font. One form for all: "100%",
        else "100", in a smaller font if need be, else none, whichever first fits every bar (a
        label inside its bar, white on it, must fit the bar; one above a low bar may take the gaps
        beside it). Centred on a bar narrower than it, "100%" spilled white onto the white gaps
        and read "00%" with 15 positions in a 1280-pixel window."""
        area, n = self._area(), len(self.rates)
        font = self.font()
        if not n:
            return [], font
        width = min(36.0, (area.width() - self.GAP * (n - 1)) / n)
        lefts = [area.left() + i * (width + self.GAP) for i in range(n)]
        size = QFontInfo(font).pointSizeF()  # the font's own may be -1: set in pixels
        tries = [(size, "{:.0%}")] + [(size - 0.5 * i, "{:.0f}") for i in range(int((size - self.SMALLEST) / 0.5) + 1)]
        for points, form in tries:
            f = QFont(font)
            f.setPointSizeF(points)
            fm = QFontMetricsF(f)
            labels = [form.format(rate if "%" in form else 100 * rate) for rate in self.rates]
            if all(fm.horizontalAdvance(label) <= (width if rate > 0.3 else width + self.GAP)
                   for rate, label in zip(self.rates, labels)):
                return list(zip(lefts, [width] * n, labels)), f
        return list(zip(lefts, [width] * n, [""] * n)), font

    def paintEvent(self, event):
        p = QPainter(self)
        p.fillRect(self.rect(), BACKGROUND)
        p.setRenderHint(QPainter.Antialiasing)
        area = self._area()
        if not self.rates:
            p.setPen(look.MUTED)
            p.drawText(self.rect(), Qt.AlignCenter, "no drafts yet")
            return
        bars, font = self.bars()
        for i, (rate, (x, width, label)) in enumerate(zip(self.rates, bars)):
            p.fillRect(QRectF(x, area.top(), width, area.height()), look.BAR_BACK)
            h = area.height() * max(0.0, min(rate, 1.0))
            p.fillRect(QRectF(x, area.bottom() - h, width, h), look.BAR)
            p.setPen(look.MUTED)
            p.setFont(self.font())
            p.drawText(QRectF(x - 4, area.bottom() + 2, width + 8, 14), Qt.AlignCenter, str(i + 1))
            p.setPen(Qt.white if rate > 0.3 else look.MUTED)
            p.setFont(font)
            label_top = area.bottom() - 16 if rate > 0.3 else area.bottom() - h - 16
            p.drawText(QRectF(x - self.GAP / 2, label_top, width + self.GAP, 14), Qt.AlignCenter, label)


class RateChart(Chart):
    """Tokens per second as the generation went on."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.points: list[tuple[float, float]] = []  # (seconds, tokens/s)
        self.setToolTip("Tokens per second over the generation")

    def set_points(self, points: list[tuple[float, float]]) -> None:
        self.points = list(points)
        self.update()

    def add_points(self, points, redraw: bool = True) -> None:
        self.points.extend(points)
        if redraw:
            self.update()

    def paintEvent(self, event):
        p = QPainter(self)
        p.fillRect(self.rect(), BACKGROUND)
        p.setRenderHint(QPainter.Antialiasing)
        area = QRectF(self.rect()).adjusted(34, 6, -6, -16)
        p.setPen(QPen(look.GRID, 1))
        p.drawLine(area.bottomLeft(), area.bottomRight())
        if len(self.points) < 2:
            p.setPen(look.MUTED)
            p.drawText(self.rect(), Qt.AlignCenter, "tokens/s appear while generating")
            return
        t_max = max(self.points[-1][0], 1e-6)
        # The first cycles' rates swing wildly (a few tokens over milliseconds): scale to the rest.
        settled = [r for t, r in self.points if t >= 0.1 * t_max] or [r for _, r in self.points]
        top = max(settled) * 1.2 or 1.0
        p.setPen(look.MUTED)
        p.drawText(QRectF(0, area.top() - 6, 30, 14), Qt.AlignRight | Qt.AlignVCenter,
                   f"{top:.0f}" if top >= 10 else f"{top:.1f}")
        p.drawText(QRectF(0, area.bottom() - 8, 30, 14), Qt.AlignRight | Qt.AlignVCenter, "0")
        p.drawText(QRectF(area.right() - 60, area.bottom() + 1, 60, 14), Qt.AlignRight, f"{t_max:.1f} s")

        def at(t, r):
            return QPointF(area.left() + area.width() * t / t_max, area.bottom() - area.height() * r / top)

        # One point per two pixels is all the eye can see; long generations stay cheap to draw.
        step = max(1, len(self.points) // max(int(area.width() / 2), 1))
        shown = self.points[::step] + ([self.points[-1]] if (len(self.points) - 1) % step else [])
        line = QPainterPath(at(*shown[0]))
        for t, r in shown[1:]:
            line.lineTo(at(t, r))
        fill = QPainterPath(line)
        fill.lineTo(at(shown[-1][0], 0))
        fill.lineTo(at(shown[0][0], 0))
        fill.closeSubpath()
        p.setClipRect(area.adjusted(-2, -2, 2, 2))  # early spikes run off the top
        p.setRenderHint(QPainter.Antialiasing, False)  # an antialiased translucent fill costs ms per frame
        p.fillPath(fill, look.CHART_FILL)
        p.setRenderHint(QPainter.Antialiasing)
        p.setPen(QPen(look.CHART_LINE, 1.6))
        p.drawPath(line)


def speedup_text(snap) -> str:
    """The Speedup row: the ratio and what it stands on; under it the plain speed it divides by."""
    if snap.speedup_source == Yardstick.PLAIN:
        head = "— plain decoding, nothing drafted"
    elif snap.speedup is not None:
        head = f"{snap.speedup:.2f}×  ({snap.speedup_source})"
    else:
        head = "— (no plain step measured yet)"
    plain = f"plain {snap.plain_rate:.1f} tok/s {snap.plain_from}" if snap.plain_rate else ""
    return f"{head}\n{_unbroken(plain)}" if plain else head


def prompt_read(tokens: int, total: int, reused: int) -> str:
    """A prompt's counts in words: "412 of 530 tokens (117 reused from the cache)"."""
    return f"{tokens:,} of {total:,} tokens" + (f" ({reused:,} reused from the cache)" if reused else "")


class StatsPanel(QGroupBox):
    ACCEPTANCE, RATE, PER_PASS, SPEEDUP, POLICY, PROMPT = (
        "Acceptance", "Tokens/s", "Tokens per target pass", "Speedup vs plain", "Policy", "Prompt processed")
    TITLE = "Speculation stats"

    def __init__(self, parent=None):
        super().__init__(self.TITLE, parent)
        self.setObjectName("statsPanel")
        # The Speedup row's second line: the one plain speed of the panel, and where it comes from.
        self.readout = Readout([(self.ACCEPTANCE, 1), (self.RATE, 1), (self.PER_PASS, 1), (self.SPEEDUP, 2),
                                (self.POLICY, 4), (self.PROMPT, 2)])
        self.bars = AcceptanceBars()
        self.chart = RateChart()
        layout = QVBoxLayout(self)
        layout.setSpacing(4)  # (with the charts' smallest height, the pane fits a 1280x720 screen's window)
        layout.addWidget(self.readout)
        caption = QLabel("Acceptance per draft position")
        caption.setObjectName("caption")
        layout.addWidget(caption)
        layout.addWidget(self.bars)
        caption = QLabel("Tokens/s over the generation")
        caption.setObjectName("caption")
        layout.addWidget(caption)
        layout.addWidget(self.chart)

    def value(self, name: str) -> str:
        return self.readout.value(name)

    def set_scope(self, scope: str) -> None:
        """What the numbers add up ("totals over 3 parts and the combining step"); "" for one answer."""
        self.setTitle(f"{self.TITLE} · {scope}" if scope else self.TITLE)

    def reset(self) -> None:
        self.set_scope("")
        self.readout.set_values({name: "—" for name, _ in self.readout.rows})
        self.readout.tips.clear()
        self.bars.set_rates([])
        self.chart.set_points([])

    def show_snapshot(self, snap) -> None:
        """Display one StatsSnapshot (worker.py)."""
        prompt, whole = "—", prompt_read(snap.prompt_tokens, snap.prompt_total, snap.prompt_reused)
        if snap.prompt_total:
            prompt = whole
        part = snap.part_prompt
        if part is not None:  # a part of a many-part answer: its own prompt
            prompt = f"{part.stage}: " + prompt_read(part.tokens, part.total, part.reused)
        self.readout.set_values({
            self.ACCEPTANCE: (f"{snap.acceptance_rate:.0%} of {snap.drafted} drafted" if snap.drafted
                              else "nothing drafted"),
            self.RATE: (f"{snap.tokens_per_s:.1f}  ({snap.tokens} token{'' if snap.tokens == 1 else 's'} "
                        f"in {snap.seconds:.1f} s)"),
            self.PER_PASS: f"{snap.tokens_per_pass:.2f}",
            self.SPEEDUP: speedup_text(snap),
            self.POLICY: policy_text(snap.policy.to_json() if snap.policy is not None else {}),
            self.PROMPT: prompt,
        })
        self.readout.tips[self.SPEEDUP] = snap.speedup_basis
        self.readout.tips[self.PROMPT] = (f"Counted for {part.stage} alone. All of this answer's "
                                          f"prompts so far: {whole}." if part is not None else "")
        self.bars.set_rates(snap.acceptance_by_position)

    def show_history(self, snapshots, proposing: dict | None = None) -> None:
        """Replay: the chart and numbers as they stood after the last of ``snapshots``; while the
        next cycle's draft is shown proposed, ``proposing`` is its policy report, the choice
        already made (the Policy row said the cycle before's: "prompt lookup, k = 1" beside
        "Cycle 3 of 57: plain step, nothing drafted")."""
        self.chart.set_points([(s.seconds, s.tokens_per_s) for s in snapshots])
        if snapshots:
            self.show_snapshot(snapshots[-1])
        else:
            self.reset()
        if proposing is not None:
            self.readout.set_values({self.POLICY: policy_text(proposing)})
