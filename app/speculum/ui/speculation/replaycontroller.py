"""Replay of a finished answer: its stored cycles stepped through in the speculation view,
the stats and the transcript, as they happened (see ``replay.ReplayBar`` for the steps)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from PySide6.QtCore import QObject, Qt
from PySide6.QtWidgets import QLabel

from ...conversations import Conversation
from .. import look
from ..chat.answer import StagedCycle, answer_so_far, plain_basis, stages_scope, staged_cycles
from .replay import ReplayBar
from ...protocol import replay_pace, replay_snapshots

IDLE_CAPTION = "Replay: finish a generation, then step through its cycles."


@dataclass
class ReplayState:
    conversation: Conversation
    message: int  # index of the replayed answer in the conversation
    cycles: list[StagedCycle]
    snapshots: list  # the stats after each cycle
    step: int = -1  # the step shown; -1 before the first
    rewound: bool = False  # the transcript shows the conversation up to the answer, then the answer so far


def describe_step(staged, step: int) -> str:
    n = len(staged)
    if step == 0:
        return f"Replay: before the first of {n} cycles. Press Play or step forward."
    at = staged[(step - 1) // 2]
    cycle = at.cycle
    # Counted over the whole answer (a part's generation counts from 0 again), its part named.
    head = (f"{at.stage} · " if at.stage else "") + f"Cycle {(step - 1) // 2 + 1} of {n}"
    drafter = look.DRAFTERS.get(cycle.source, cycle.source)
    k = len(cycle.drafted)
    if step % 2:
        if not k:
            return f"{head}: plain step, nothing drafted."
        return (f"{head}: {drafter} proposed {k} token{'s' * (k != 1)}; the target checks "
                f"{'them' if k != 1 else 'it'} in one pass.")
    if not k:
        return f"{head}: the target wrote {len(cycle.emitted)} token{'s' * (len(cycle.emitted) != 1)} by itself."
    rejected = k - cycle.n_accepted
    tail = "then its correction" if rejected else "then a bonus token"
    if len(cycle.emitted) == cycle.n_accepted:
        tail = "and stopped there"
    return (f"{head}: {cycle.n_accepted} of {k} accepted, {rejected} struck; "
            f"the target kept the accepted ones {tail}.")


class ReplayController(QObject):
    """Owns the replay bar and its caption; renders each step into the window's views."""

    def __init__(self, speculation, stats, transcript, parent=None):
        super().__init__(parent)
        self.speculation, self.stats, self.transcript = speculation, stats, transcript
        self.state: ReplayState | None = None
        self.bar = ReplayBar()
        self.bar.setEnabled(False)
        self.label = QLabel(IDLE_CAPTION)
        self.label.setObjectName("caption")
        self.label.setTextFormat(Qt.PlainText)  # names a saved cycle's drafter
        self.label.setWordWrap(True)
        # Room for two lines, always: a step's description wraps, and the pane must not squeeze it.
        self.label.setMinimumHeight(2 * self.label.fontMetrics().lineSpacing() + 4)
        self.bar.stepChanged.connect(self._render_step)

    def clear(self, caption: str = IDLE_CAPTION) -> None:
        """Nothing to replay (a generation runs, or the conversation has no answer with cycles)."""
        self.state = None
        self.bar.setEnabled(False)
        self.label.setText(caption)

    def load(self, conv: Conversation, index: int, step: int | None, plain_tokens_per_s: float | None,
             staged: list[StagedCycle] | None = None) -> None:
        """Load answer ``index``'s cycle records into the bar (or ``staged``, the same cycles
        already read); step 0 starts before the first cycle and plays (the answer's Replay link:
        stopped there, it blanked the answer and waited); None shows the end."""
        message = conv.messages[index]
        cycles = staged if staged is not None else staged_cycles(message.cycles)
        reused = message.stats.get("prompt_reused")  # a number (conversations.py); absent before it was kept
        self.state = ReplayState(conv, index, cycles,
                                 replay_snapshots([s.cycle for s in cycles],
                                                  plain_basis(message.stats, plain_tokens_per_s),
                                                  message.stats.get("prompt_tokens", 0),
                                                  message.stats.get("prompt_total", 0),
                                                  max(int(reused), 0) if reused is not None else None,
                                                  [s.prompt for s in cycles]))
        if not cycles:
            self.clear()
            self.stats.reset()
            return
        self.bar.setEnabled(True)
        self.bar.start(len(cycles), step, replay_pace([s.cycle for s in cycles]))
        if step == 0:
            self.bar.play.setChecked(True)

    def _render_step(self, step: int) -> None:
        replay = self.state
        if replay is None:
            return
        cycles, snaps = replay.cycles, replay.snapshots
        done = step // 2  # cycles fully verified at this step
        previous = replay.step
        if step > previous >= 0:  # forward: only what came since (a played step, or several due at once)
            self.speculation.append_cycles(cycles[previous // 2:done])
            if step % 2:
                self.speculation.show_proposed(cycles[done])
        else:
            self.speculation.clear_view()
            self.speculation.append_cycles(cycles[:done])
            if step % 2:
                self.speculation.show_proposed(cycles[done])
        replay.step = step
        self._show_answer(done)
        proposing = cycles[done].cycle.policy if step % 2 else None
        shown = snaps[:done]
        if done == len(cycles) and shown and shown[-1].part_prompt is not None:
            # The final answer: its prompts' counts, all parts together, not the last part's.
            shown = shown[:-1] + [replace(shown[-1], part_prompt=None)]
        self.stats.show_history(shown, proposing.to_json() if proposing is not None else None)
        self.stats.set_scope(stages_scope(cycles[:done]))
        self.label.setText(describe_step(cycles, step))

    def _show_answer(self, done: int) -> None:
        """The transcript as it stood after ``done`` cycles: the conversation up to the replayed
        answer, then that answer so far. At the last step, the whole conversation again."""
        replay, conv = self.state, self.state.conversation
        if done >= len(replay.cycles):
            if replay.rewound:
                self.transcript.show_messages(conv.messages)
                replay.rewound = False
            return
        if not replay.rewound:
            self.transcript.show_messages(conv.messages[:replay.message])
            self.transcript.begin_answer("replaying…")
            replay.rewound = True
        self.transcript.update_answer(answer_so_far(replay.cycles[:done]))
