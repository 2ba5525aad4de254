"""The stats panel: acceptance, tokens/s over the generation, speedup, the policy's choice.

Everything shown is computed by the worker (``StatsSnapshot``); these widgets only draw.
"""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QVBoxLayout, QWidget

from . import look


# The policy's estimates worth showing, when it gives them (auto mode).
ESTIMATES = (
    ("expected_tokens_per_pass", "expects {:.2f} tokens/pass"),
    ("expected_tokens_per_s", "{:.1f} tok/s expected"),
    ("plain_tokens_per_s", "plain {:.1f} tok/s"),
)


class AcceptanceBars(QWidget):
    """One bar per draft position: how often a draft survived to that position."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.rates: list[float] = []
        self.setMinimumHeight(84)
        self.setToolTip("Acceptance per draft position: the share of drafts accepted at position 1, 2, …")

    def set_rates(self, rates: list[float]) -> None:
        if rates != self.rates:
            self.rates = list(rates)
            self.update()

    def paintEvent(self, event):
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        area = QRectF(self.rect()).adjusted(4, 4, -4, -18)
        if not self.rates:
            p.setPen(look.MUTED)
            p.drawText(self.rect(), Qt.AlignCenter, "no drafts yet")
            return
        n = len(self.rates)
        gap = 6.0
        width = min(36.0, (area.width() - gap * (n - 1)) / n)
        for i, rate in enumerate(self.rates):
            x = area.left() + i * (width + gap)
            p.fillRect(QRectF(x, area.top(), width, area.height()), look.BAR_BACK)
            h = area.height() * max(0.0, min(rate, 1.0))
            p.fillRect(QRectF(x, area.bottom() - h, width, h), look.BAR)
            p.setPen(look.MUTED)
            p.drawText(QRectF(x - 4, area.bottom() + 2, width + 8, 14), Qt.AlignCenter, str(i + 1))
            p.setPen(Qt.white if rate > 0.3 else look.MUTED)
            label_top = area.bottom() - 16 if rate > 0.3 else area.bottom() - h - 16
            p.drawText(QRectF(x - 6, label_top, width + 12, 14), Qt.AlignCenter, f"{rate:.0%}")


class RateChart(QWidget):
    """Tokens per second as the generation went on."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.points: list[tuple[float, float]] = []  # (seconds, tokens/s)
        self.setMinimumHeight(84)
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


class StatsPanel(QGroupBox):
    def __init__(self, parent=None):
        super().__init__("Speculation stats", parent)
        self.setObjectName("statsPanel")
        form = QFormLayout()
        form.setLabelAlignment(Qt.AlignLeft)
        self.acceptance = QLabel("—")
        self.rate = QLabel("—")
        self.per_pass = QLabel("—")
        self.speedup = QLabel("—")
        self.policy = QLabel("—")
        self.prompt = QLabel("—")
        for label in (self.acceptance, self.rate, self.per_pass, self.speedup, self.policy, self.prompt):
            label.setTextInteractionFlags(Qt.TextSelectableByMouse)
            label.setWordWrap(True)
        form.addRow("Acceptance", self.acceptance)
        form.addRow("Tokens/s", self.rate)
        form.addRow("Tokens per target pass", self.per_pass)
        form.addRow("Speedup vs plain", self.speedup)
        form.addRow("Policy", self.policy)
        form.addRow("Prompt processed", self.prompt)
        self.bars = AcceptanceBars()
        self.chart = RateChart()
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        caption = QLabel("Acceptance per draft position")
        caption.setObjectName("caption")
        layout.addWidget(caption)
        layout.addWidget(self.bars)
        caption = QLabel("Tokens/s over the generation")
        caption.setObjectName("caption")
        layout.addWidget(caption)
        layout.addWidget(self.chart)

    def reset(self) -> None:
        for label in (self.acceptance, self.rate, self.per_pass, self.speedup, self.policy, self.prompt):
            label.setText("—")
        self.bars.set_rates([])
        self.chart.set_points([])

    def show_snapshot(self, snap) -> None:
        """Display one StatsSnapshot (worker.py)."""
        self.acceptance.setText(f"{snap.acceptance_rate:.0%} of {snap.drafted} drafted" if snap.drafted
                                else "nothing drafted")
        self.rate.setText(f"{snap.tokens_per_s:.1f}  ({snap.tokens} tokens in {snap.seconds:.1f} s)")
        self.per_pass.setText(f"{snap.tokens_per_pass:.2f}")
        if snap.speedup is not None:
            self.speedup.setText(f"{snap.speedup:.2f}×  ({snap.speedup_source})")
        else:
            self.speedup.setText("— (no plain step measured yet)")
        policy = snap.policy or {}
        drafter = look.DRAFTERS.get(policy.get("source", ""), policy.get("source", "—"))
        text = f"{drafter}, k = {policy.get('k', 0)}" if policy else "—"
        estimates = [label.format(policy[key]) for key, label in ESTIMATES if isinstance(policy.get(key), (int, float))]
        self.policy.setText(text + ("\n" + " · ".join(estimates) if estimates else ""))
        if snap.prompt_total:
            self.prompt.setText(f"{snap.prompt_tokens:,} of {snap.prompt_total:,} tokens"
                                + (f" ({snap.prompt_reused:,} reused from the cache)" if snap.prompt_reused else ""))
        self.bars.set_rates(snap.acceptance_by_position)

    def show_history(self, snapshots) -> None:
        """Replay: the chart and numbers as they stood after the last of ``snapshots``."""
        self.chart.set_points([(s.seconds, s.tokens_per_s) for s in snapshots])
        if snapshots:
            self.show_snapshot(snapshots[-1])
        else:
            self.reset()
