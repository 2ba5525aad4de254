"""A streamed answer split as it comes: text to send now, and tool calls in OpenAI's chunk
shape (the chat API sends them so; the Messages and Responses APIs reshape them). What it sends
adds up to what ``tools.parse_calls`` reads from the whole answer."""

from __future__ import annotations

import re
import uuid

from .tools import (CALL_HEAD, HERMES, HERMES_CLOSE, HERMES_OPEN, LLAMA3, MISTRAL, CallArguments, ToolCall, ToolUse,
                    calls_in, parse_calls)


class CallStream:
    """Splits a streamed answer into text to send now and tool-call deltas in OpenAI's chunk
    shape: a call's index, id, type and name first, then its arguments in fragments.

    Hermes calls stream as they are written: the name once the call's head is read, then the
    arguments object, exactly its text. So do bare calls that open the answer (``{"name": ...,
    "arguments": {``, as Qwen writes them without their marker): the lazy grammar holds such an
    answer to calls from its opening on, so from the head on it is known to be one. Under that
    grammar (``ToolUse.enforced``) a call begins at its name, as soon as one offered name begins as
    written (the grammar forces the rest). Text that may
    start a call is held back; a call in another shape is held to its end and sent whole. Formats
    without a closing marker (Mistral, Llama 3.x) are held from their first character to the end
    when they look like calls, and sent whole then.
    """

    def __init__(self, use: ToolUse):
        self.use = use
        self.pending = ""
        self.count = 0  # calls sent (begun)
        self.whole = False  # holding everything to the end (an answer that starts like a call)
        self.started = False  # any text seen that is not whitespace
        self.arguments: CallArguments | None = None  # inside a Hermes call: its arguments as they come
        self.sent = 0  # of them, the characters sent
        self.begun: list[dict] = []  # a bare call's first delta, not yet returned
        self.trim = False  # past a call: the blanks that follow it are not sent
        self.code = False  # inside a fenced block that is no call
        self.bare: CallArguments | None = None  # inside a bare call: its object, to find where it closes
        self.after_bare = False  # past bare calls: more may follow, else text
        self.in_fence = False  # ... and those calls were in a fenced block, its close still to come
        self.named = False  # a call begun at its name: its arguments still to come
        self.marked = False  # ... and it is inside <tool_call>: it ends at the marker's close
        self.name_rest = ""  # ... and the characters of its name still to come (see _name_at_head)
        self._out: list[str] = []  # what one feed sends: its text
        self._deltas: list[dict] = []  # ... and its call deltas

    def feed(self, text: str) -> tuple[str, list[dict]]:
        self.pending += text
        fmt = self.use.format
        if not self.started and self.pending.strip():
            self.started = True
            head = self.pending.lstrip()
            markers = {LLAMA3: ("{", "<|python_tag|>"), MISTRAL: ("[TOOL_CALLS]",), HERMES: ("{",)}[fmt]
            self.whole = any(head.startswith(m) or m.startswith(head) for m in markers)
        if self.whole and fmt is HERMES:
            if self._bare_head(named=self.use.enforced):
                self.whole = False
            elif not _BARE_CALL.match(self.pending) and len(self.pending.strip()) > 40:
                self.whole = False  # a code block or JSON that is no call: streamed as text after all
        if self.whole or not self.started:
            return "", []
        if fmt is not HERMES:
            out, self.pending = self.pending, ""
            return out, []
        return self._hermes()

    def _bare_head(self, named: bool = False) -> bool:
        """Whether the held text now opens with a bare call's head (a known name, then its
        arguments object): then its call begins (``self.begun``) and its arguments stream.
        ``named``: the grammar holds a call from its opening on, so it begins at its name."""
        text = self.pending.lstrip()
        if named:
            name, end, self.name_rest = self._name_at_head(text)
        else:
            head = CALL_HEAD.match(text)
            name, end = (head.group(1), head.end()) if head is not None else (None, 0)
            if text[end:end + 1] != "{":
                name = None
        if name not in self.use.parameters:
            self.name_rest = ""
            return False
        self.begun.append(self._begin(name))
        self.bare = CallArguments()
        self.bare.feed(text[:end])  # the call object, open to its arguments (or its name)
        self.pending, self.after_bare, self.named = text[end:], False, named
        if not named:
            self.arguments, self.sent = CallArguments(), 0
        return True

    def _name_at_head(self, text: str) -> tuple[str | None, int, str]:
        """A call's name where ``text`` opens with its head, where the head read ends, and what the
        grammar forces of the name still to be written: under the calls' grammar a name is known
        as soon as one offered name begins as written (``write`` of ``write_stdin``; one tool:
        at its opening quote). (None, 0, ""): not yet."""
        head = _NAME_HEAD.match(text)
        if head is None:
            return None, 0, ""
        written = head.group(1)
        if head.group(2):
            return written, head.end(), ""
        names = [name for name in self.use.parameters if name.startswith(written)]
        if len(names) != 1:
            return None, 0, ""
        return names[0], head.end(), names[0][len(written):] + '"'

    def _to_arguments(self) -> bool:
        """Between a call's name (sent) and its arguments; False: held."""
        if self.name_rest:  # the rest of the name, as the grammar forces it: read, not sent
            n = min(len(self.name_rest), len(self.pending))
            if self.pending[:n] == self.name_rest[:n]:
                self.bare.feed(self.pending[:n])
                self.pending, self.name_rest = self.pending[n:], self.name_rest[n:]
                if self.name_rest:
                    return False
            else:  # not as forced (no grammar writes this): read on as the call's other shapes are
                self.name_rest = ""
        head = _TO_ARGUMENTS.match(self.pending)
        if head is not None and self.pending[head.end():head.end() + 1] == "{":
            self.bare.feed(self.pending[:head.end()])
            self.pending, self.arguments, self.sent, self.named = self.pending[head.end():], CallArguments(), 0, False
            if self.marked:  # its end is the marker's close (``_in_call``)
                self.bare, self.marked = None, False
            return True
        written = "".join(self.pending.split())
        if any(key.startswith(written) for key in _ARGUMENT_KEYS):
            return False
        # Another shape, which only an answer with another grammar can write: its arguments
        # as the whole answer reads them, once the call has closed.
        used = self.bare.feed(self.pending)
        self.pending = self.pending[used:]
        if not self.bare.done:
            return False
        found = calls_in(self.bare.text, self.use.format, set(self.use.parameters))
        arguments = found[0].arguments if found else "{}"
        self._deltas += [{"index": self.count - 1, "function": {"arguments": fragment}}
                         for fragment in argument_fragments(arguments)]
        self.bare, self.named, self.after_bare = None, False, not self.marked
        if self.marked:  # the rest, up to the marker's close, is skipped (``_in_call``)
            self.arguments, self.sent, self.marked = CallArguments(), 0, False
            self.arguments.done = True
        return True

    def _hermes(self) -> tuple[str, list[dict]]:
        self._out, self._deltas = [], self.begun
        self.begun = []
        while self._step():
            pass
        return "".join(self._out), self._deltas

    def _step(self) -> bool:
        """Read one piece of the held text; False when the rest must wait for more."""
        if self.after_bare and not self._past_bare():
            return False
        if self.named:
            return self._to_arguments()
        if self.code:
            return self._in_code()
        if self.arguments is None:
            return self._outside_call()
        return self._in_call()

    def _past_bare(self) -> bool:
        """After bare calls: another one, or text once it is plainly none; False: held."""
        if self._bare_head(named=self.use.enforced and not self.in_fence):
            self._deltas += self.begun
            self.begun = []
            return True
        if self.in_fence:  # up to the block's closing fence: text, the fence dropped
            end = self.pending.find(_FENCE_MARK)
            if end < 0:
                return False
            self._emit_up_to(end)
            self.pending = self.pending[len(_FENCE_MARK):]
            self.in_fence = self.after_bare = False
            self.trim = True
            return True
        rest = self.pending.strip()
        if not rest or len(rest) <= 40 and rest[:1] == "{":
            return False
        self.after_bare = False
        return True

    def _in_code(self) -> bool:
        """Inside a fenced block that is no call: text, up to its closing fence."""
        end = self.pending.find(_FENCE_MARK)
        if end < 0:
            self._emit_up_to(len(self.pending) - _partial_tail(self.pending, _FENCE_MARK))
            return False
        self._emit_up_to(end + len(_FENCE_MARK))
        self.code = False
        return True

    def _outside_call(self) -> bool:
        start, fence = self.pending.find(HERMES_OPEN), self.pending.find(_FENCE_MARK)
        if fence >= 0 and (start < 0 or fence < start):
            self._emit_up_to(fence)
            return self._fenced()
        if start < 0:
            hold = max(_partial_tail(self.pending, HERMES_OPEN), _partial_tail(self.pending, _FENCE_MARK))
            self._emit_up_to(len(self.pending) - hold)
            return False
        self._emit_up_to(start)
        body = self.pending[len(HERMES_OPEN):].lstrip()
        if self.use.enforced:  # a call from its marker on (the grammar): it begins at its name
            held, self.pending = self.pending, body
            if self._bare_head(named=True):
                self._deltas += self.begun
                self.begun, self.marked = [], True
                return True
            self.pending = held  # not yet, or another shape: as without the grammar
        head = CALL_HEAD.match(body)
        if head is not None and head.group(1) in self.use.parameters and body[head.end():head.end() + 1] == "{":
            self._deltas.append(self._begin(head.group(1)))  # streamed from here as it is written
            self.pending, self.arguments, self.sent = body[head.end():], CallArguments(), 0
            return True
        end = self.pending.find(HERMES_CLOSE)
        if end < 0:
            return False  # not yet known: held
        block, self.pending = self.pending[:end + len(HERMES_CLOSE)], self.pending[end + len(HERMES_CLOSE):]
        found = calls_in(block[len(HERMES_OPEN):-len(HERMES_CLOSE)], self.use.format, set(self.use.parameters))
        if not found:
            self._emit(block)  # not a call after all: text
            return True
        self._deltas += self._whole(found)
        self.pending = self.pending.lstrip("\n")
        return True

    def _fenced(self) -> bool:
        """At a fence: a call in a fenced block (held to its close and read), or code (streamed)."""
        shape = _fenced_shape(self.pending)
        if shape is None:
            return False  # may still be a fenced call: held
        header = _FENCE_HEADER.match(self.pending).end()
        if shape is False:  # code or text: streamed as it comes
            self._emit_up_to(header)
            self.code = True
            return True
        held, self.pending = self.pending, self.pending[header:]
        if self._bare_head():  # a call opens the block: streamed from its head, as a bare one is
            self._deltas += self.begun
            self.begun = []
            self.in_fence = True
            return True
        self.pending = held
        end = self.pending.find(_FENCE_MARK, len(_FENCE_MARK))
        if end < 0:
            return False
        block = self.pending[:end + len(_FENCE_MARK)]
        self.pending = self.pending[len(block):]
        found = calls_in(block, self.use.format, set(self.use.parameters))
        if found:
            self._deltas += self._whole(found)
        else:
            self._emit(block)
        return True

    def _in_call(self) -> bool:
        """Inside a call: its arguments sent as they are written, the rest of it skipped."""
        args = self.arguments
        if not args.done:
            used = args.feed(self.pending)
            if self.bare is not None:
                self.bare.feed(self.pending[:used])
            self.pending = self.pending[used:]
            if args.ready > self.sent:
                self._deltas.append({"index": self.count - 1, "function": {"arguments": args.text[self.sent:args.ready]}})
                self.sent = args.ready
        if not args.done:
            return False
        if self.bare is not None:  # the rest of the call object, up to its own close: not sent
            used = self.bare.feed(self.pending)
            self.pending = self.pending[used:]
            if not self.bare.done:
                return False
            self.bare, self.arguments, self.after_bare = None, None, True
            return True
        end = self.pending.find(HERMES_CLOSE)  # the rest of the call object, up to its close: not sent
        if end < 0:
            return False
        self.pending, self.arguments = self.pending[end + len(HERMES_CLOSE):].lstrip("\n"), None
        return True

    def _emit_up_to(self, end: int) -> None:
        """The held text up to ``end`` sent as text."""
        self._emit(self.pending[:end])
        self.pending = self.pending[end:]

    def _emit(self, text: str) -> None:
        """Text to send; right after a call, less its leading blanks (the newlines between calls)."""
        if self.trim:
            text = text.lstrip()
            self.trim = not text
        self._out.append(text)

    def _begin(self, name: str) -> dict:
        self.count += 1
        self.trim = True
        return {"index": self.count - 1, "id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                "function": {"name": name, "arguments": ""}}

    def _whole(self, calls: list[ToolCall]) -> list[dict]:
        deltas = []
        for call in calls:
            first = self._begin(call.name)
            first["id"] = call.id
            deltas.append(first)
            deltas += [{"index": self.count - 1, "function": {"arguments": fragment}}
                       for fragment in argument_fragments(call.arguments)]
        return deltas

    def finish(self) -> tuple[str, list[dict]]:
        """What was held back, at the end of the answer."""
        rest, self.pending = self.pending, ""
        if self.named:  # cut short (max_tokens) between its name and its arguments: a call without them
            self.named, self.bare, self.marked, self.name_rest = False, None, False, ""
            return "", []
        if self.arguments is not None:  # a call cut short (max_tokens): its arguments as they stand
            args, self.arguments = self.arguments, None
            more = args.text[self.sent:]
            return "", [{"index": self.count - 1, "function": {"arguments": more}}] if more else []
        self.in_fence = self.after_bare = False
        if not rest:
            return "", []
        content, calls = parse_calls(rest, self.use)
        return content or "", self._whole(calls)


_BARE_CALL = re.compile(r'\s*\{\{?\s*"name"')
_NAME_HEAD = re.compile(r'\{\s*"name"\s*:\s*"([^"\\]*)(")?')  # a call's head up to its name (and its close)
_TO_ARGUMENTS = re.compile(r'"?\s*,\s*"(?:arguments|parameters)"\s*:\s*')  # ... and on to its arguments
_ARGUMENT_KEYS = (',"arguments":{', ',"parameters":{', '","arguments":{', '","parameters":{')
_FENCE_MARK = "```"
_FENCE_HEADER = re.compile(r"```[a-zA-Z]*[ \t]*(\n|$)")
_CALL_OPENINGS = ('{"name"', '{{"name"', '[{"name"')


def _fenced_shape(text: str) -> bool | None:
    """For text opening a fenced block: True when the block begins like a call (held to its
    close and read), False when it plainly does not (streamed), None while it cannot be told."""
    header = _FENCE_HEADER.match(text)
    if header is None:
        return False if re.fullmatch(r"```[a-zA-Z]*[ \t]*", text) is None else None
    if not header.group(1):
        return None
    body = re.sub(r"\s+", "", text[header.end():])  # (models write '{\n  "name"' as often as '{"name"')
    if any(body.startswith(o) for o in _CALL_OPENINGS):
        return True
    return None if any(o.startswith(body) for o in _CALL_OPENINGS) else False


def _partial_tail(text: str, marker: str) -> int:
    """How many of ``text``'s last characters are the start of ``marker``."""
    return max((n for n in range(min(len(marker) - 1, len(text)), 0, -1) if text.endswith(marker[:n])), default=0)


def argument_fragments(arguments: str, size: int = 16) -> list[str]:
    """A call's arguments in pieces, as OpenAI streams them."""
    return [arguments[i:i + size] for i in range(0, len(arguments), size)] or [""]
