"""Completions on the loaded models for the HTTP API: one sequence, requests in arrival order.

The decoder is synchronous and owns one KV cache, so requests take turns (a FIFO lock) and a
bounded number may wait; beyond that the caller is told to come back (``Busy``). Each
generation runs on a thread of its own and hands its cycles to the event loop; a consumer
that goes away (a client disconnecting) sets the stop event, and the decoder stops within
one target pass (while the prompt is read, within one step of llama.cpp's graph). A request
that shares a prefix with an earlier one (its conversation so far, a system prompt and
document resent) finds it in the KV cache or the decoder's prompt cache: the decoder reuses
the longest one by itself.
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Callable

from ..engine.chat import chat_tokens
from ..engine.sampling import SamplingParams
from ..engine.stats import Stats
from ..engine.vocabulary import Finish, Mode, Source, Word
from ..errors import ContextFullError
from ..protocol import Asker, CycleEvent, Decoded, Event, Failed, Finished, PlainBasis, Started, snapshot_of
from .errors import BadRequest, Busy, WorkerUnreachable
from .pace import Pace

if TYPE_CHECKING:
    from ..engine.grammar.state import Grammar
    from .tools import ToolUse

# How an API request's cycles are labelled beside the window's own.
STAGE = "API request"


class ServerState(Word):
    """What the server can do now; GET /health's ``status`` says it in these words (a contract)."""

    LOADING = "loading"  # the models load (at start, or again once a lost RPC worker is back)
    READY = "ready"
    WORKER_LOST = "worker_lost"  # an RPC worker holding the target's layers went away
    LOAD_FAILED = "load_failed"  # the server exits after saying why


@dataclass
class Completion:
    """One request, parsed and tokenized."""
    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: list[str] = field(default_factory=list)
    prediction: str | None = None
    grammar: Grammar | None = None  # the answer follows it (response_format, required tool calls)
    logprobs: int | None = None  # None, or how many likeliest tokens to give at each position
    tools: ToolUse | None = None  # tools shown to the model: its calls are read back from its text
    client: str = ""  # who asked (the client's address), for the window's Serve log


@dataclass
class Delta:
    text: str
    scored: list[tuple[int, float, list[int], list[float]]] = field(default_factory=list)  # (token, logprob, top)


@dataclass
class Done:
    finish_reason: str  # "stop" or "length"
    usage: dict
    speculum: dict  # Speculum's own numbers: acceptance, tokens per pass, tokens/s, passes by drafter
    stop_sequence: str | None = None  # the stop sequence that ended the answer (Anthropic's API names it)


class StopSequences:
    """Holds back text that could still turn into a stop sequence; cuts at the first one found."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False
        self.matched: str | None = None  # the stop sequence found (the earliest; the longest there)

    def feed(self, text: str) -> str:
        """The text that is safe to send now."""
        if not self.stops:
            return text
        self.pending += text
        found = [(at, -len(s), s) for s in self.stops if (at := self.pending.find(s)) >= 0]
        if found:
            cut, _, self.matched = min(found)
            out, self.pending, self.stopped = self.pending[:cut], "", True
            return out
        # Keep the longest tail that is the start of some stop sequence.
        hold = max((n for s in self.stops for n in range(min(len(s) - 1, len(self.pending)), 0, -1)
                    if self.pending.endswith(s[:n])), default=0)
        out, self.pending = self.pending[:len(self.pending) - hold], self.pending[len(self.pending) - hold:]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def speculum_numbers(stats: Stats) -> dict:
    return {"acceptance_rate": round(stats.acceptance_rate, 4), "tokens_per_pass": round(stats.tokens_per_pass, 4),
            "tokens_per_s": round(stats.tokens_per_s, 3), "passes": stats.passes,
            "passes_by_drafter": {str(k): v for k, v in stats.passes_by_source.items()},
            "drafted": stats.drafted, "accepted": stats.accepted,
            "drafted_by_drafter": {str(k): {"drafted": d, "accepted": a} for k, (d, a) in stats.by_source.items()}}


def usage(prompt_tokens: int, completion_tokens: int, stats: Stats) -> dict:
    """OpenAI's usage; a prediction's tokens the target verified are accepted or rejected."""
    drafted, accepted = stats.by_source.get(Source.PREDICTION, (0, 0))
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            # OpenAI's count of prompt tokens not read again: the prompt cache's
            "prompt_tokens_details": {"cached_tokens": stats.prompt_cached or 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "accepted_prediction_tokens": accepted,
                                          "rejected_prediction_tokens": drafted - accepted}}


class ServedModel:
    """The loaded decoder, served to HTTP clients one request at a time."""

    def __init__(self, decoder, model_id: str, mode: Mode = Mode.AUTO, max_waiting: int = 8,
                 turn: threading.Lock | None = None, on_event: Callable[[Event], None] | None = None,
                 plain_rate: Callable[[], PlainBasis | float | None] = lambda: None,
                 workers: tuple[str, ...] = (), reload: Callable[[], object] | None = None):
        self.decoder = decoder
        # Held while the decoder generates: the window's own answers take the same turn.
        self.turn = turn or threading.Lock()
        self.model_id = model_id
        self.mode = mode
        self.max_waiting = max_waiting
        self._turn = asyncio.Lock()  # FIFO: requests run in arrival order
        self._waiting = 0
        # Each request's life as the window's own answers tell theirs (Started, CycleEvent per
        # cycle, Decoded once it let go of the models, then Finished or Failed), for its live view.
        self.on_event = on_event
        self.plain_rate = plain_rate  # plain decoding on this machine (a PlainBasis or tokens/s), for the speedup shown
        self._stop: threading.Event | None = None  # the running request's
        self.pace = Pace()  # reading and writing rates: the Retry-After estimate
        # What GET /health says, and why in words (the server exits after load_failed).
        self.state = ServerState.READY if decoder is not None else ServerState.LOADING
        self.state_message = "" if decoder is not None else f"Loading {model_id}."
        self.on_prompt = None  # optional observer, on the engine thread: (prompt tokens read, of total)
        # Under --rpc: the workers, and how to load the models afresh once a lost one answers again.
        self.workers = workers
        self.reload = reload
        self._engine_threads: dict[int, Callable[[BaseException], None]] = {}  # thread -> fails its request
        self._parked: set[int] = set()  # threads a lost worker left inside llama.cpp, for good
        self._engine = EngineThread()  # every request's decoding, on one thread (see there)
        self._given_up: list = []  # their decoders: never freed while a thread is inside them
        self._recovering = asyncio.Lock()
        self._lost_message = ""

    def loaded(self, decoder) -> None:
        """The models are in (a server listening before it loads): requests are served now."""
        self.decoder = decoder
        self.state, self.state_message = ServerState.READY, ""

    def loading(self, message: str) -> None:
        """How far loading has come, in words for /health."""
        self.state, self.state_message = ServerState.LOADING, message

    def load_failed(self, message: str) -> None:
        self.state, self.state_message = ServerState.LOAD_FAILED, message

    @property
    def stopping(self) -> bool:
        """Whether the running request has been told to stop (its client left)."""
        return self._stop is not None and self._stop.is_set()

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def asked(self) -> bool:
        """Whether a request runs or waits: idle work (measuring this machine) gives way at once."""
        return self._waiting > 0 or self._turn.locked()

    # -- prompts --

    def chat_prompt(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        # A client's text is text: only the template's own scaffolding makes special tokens.
        return chat_tokens(self.decoder.target, messages, tools)

    def predicted_tokens(self, prediction: str | None) -> list[int]:
        """The prediction as the model would write it: plain text, no BOS, specials not parsed."""
        if not prediction:
            return []
        target = self.decoder.target  # no answer is longer than the context: neither need its draft be
        return target.tokenize(prediction, add_special=False, parse_special=False)[: target.n_ctx]

    def text_prompt(self, text: str, parse_special: bool = False) -> list[int]:
        """A completions prompt: its text as text, special tokens' names read only when asked."""
        target = self.decoder.target
        return ([target.bos] if target.add_bos and target.bos >= 0 else []) + target.tokenize(
            text, parse_special=parse_special)

    def check_fits(self, completion: Completion) -> None:
        n_ctx = self.decoder.target.n_ctx
        if len(completion.prompt) >= n_ctx:
            raise BadRequest(f"The prompt is {len(completion.prompt):,} tokens but the model's context holds "
                             f"{n_ctx:,}. Shorten it.", param="messages", code="context_length_exceeded")

    def _scored(self, cycle) -> list:
        """The cycle's tokens with their log-probabilities, when asked for (end of generation left out)."""
        target = self.decoder.target
        return [(t, lp, ids, lps) for t, lp, ids, lps in
                zip(cycle.emitted, cycle.logprobs, cycle.top_tokens, cycle.top_logprobs) if not target.is_eog(t)]

    # -- a lost RPC worker --

    def worker_lost(self, message: str) -> None:
        """llama.cpp lost an RPC worker (``rpc.on_worker_lost``; on llama.cpp's thread, about to abort).
        The request running ends with ``message``; the thread inside llama.cpp can never return there,
        so it is parked for good and the models it holds are given up; the server serves on."""
        from ..engine.rpc.client import CANNOT_CONTINUE

        message = message.replace(CANNOT_CONTINUE, "This request ends; start the worker again and the server "
                                                   "loads the model again once it answers.")
        self.state, self.state_message = ServerState.WORKER_LOST, message
        self._lost_message = message
        self.turn = threading.Lock()  # the parked thread holds the old one
        threads, self._engine_threads = self._engine_threads, {}
        for ident, fail in threads.items():
            self._parked.add(ident)
            fail(WorkerUnreachable(message))
        self._parked.add(threading.get_ident())
        threading.Event().wait()

    def _give_up(self, decoder) -> None:
        """Keep the lost worker's models for good, and free what of them no parked thread is
        inside, before they load afresh: the draft model (it runs here; the parked thread is
        in the target's pass, on the worker) and the prompt cache's saved states. The target
        itself is never freed: its buffers live on the dead worker, and freeing them would call it."""
        if decoder is None or any(d is decoder for d in self._given_up):
            return
        self._given_up.append(decoder)
        if decoder.prompt_cache is not None:
            decoder.prompt_cache.clear()
        if decoder.draft is not None:
            decoder.draft.close()

    def _joined(self, thread: EngineJob) -> None:
        """Wait for a request's decoding to end, or for its thread to be parked by a lost worker."""
        while thread.is_alive() and thread.ident not in self._parked:
            thread.join(0.1)

    async def recover(self) -> None:
        """After a lost worker: once every worker answers again, load the models afresh (the
        next request, or a health check). Until then the state stays worker_lost."""
        if self.state != ServerState.WORKER_LOST or self.reload is None:
            return
        async with self._recovering:
            if self.state != ServerState.WORKER_LOST:
                return
            loop = asyncio.get_running_loop()
            done: asyncio.Future = loop.create_future()

            def settle(outcome) -> None:  # on the loop, whether or not the request that asked still waits
                if isinstance(outcome, WorkerUnreachable):
                    pass  # lost again while loading: worker_lost says so
                elif isinstance(outcome, BaseException):  # the worker is still away: say so, keep waiting
                    self.state = ServerState.WORKER_LOST
                    self.state_message = f"{self._lost_message} Not back yet: {outcome}"
                else:
                    self.decoder = outcome
                    self.state, self.state_message = ServerState.READY, ""
                if not done.done():
                    done.set_result(None)

            def load() -> None:
                ident = threading.get_ident()
                self._engine_threads[ident] = lambda exc: loop.call_soon_threadsafe(settle, exc)
                try:
                    from ..engine.rpc import client as rpc

                    rpc.forget_lost(self.workers)
                    self._give_up(self.decoder)
                    for worker in self.workers:
                        rpc.check_worker(worker, timeout=2.0)  # SpeculumError, in words, while it is away
                    self.loading("The model is loading again: its RPC worker is back.")
                    decoder = self.reload()
                    loop.call_soon_threadsafe(settle, decoder)
                except BaseException as exc:  # noqa: BLE001 - settled on the loop
                    loop.call_soon_threadsafe(settle, exc)
                finally:
                    self._engine_threads.pop(ident, None)

            threading.Thread(target=load, name="speculum-reload", daemon=True).start()
            await asyncio.shield(done)

    # -- running --

    def _tell(self, event: Event) -> None:
        if self.on_event is not None:
            self.on_event(event)

    async def run(self, completion: Completion) -> AsyncIterator[Delta | Done]:
        """Text as it is generated, then one Done; raises Busy when too many wait."""
        self.check_fits(completion)
        if self._waiting >= self.max_waiting:
            raise Busy(self._waiting, self.pace.retry_after())
        self._waiting += 1
        try:
            await self._turn.acquire()
        finally:
            self._waiting -= 1
        try:
            if self.state == ServerState.WORKER_LOST:  # lost while this one waited: never enter the given-up models
                raise WorkerUnreachable(self.state_message)
            async for piece in self._generate(completion):
                yield piece
        finally:
            self._turn.release()

    def _decode(self, completion: Completion, stop: threading.Event, prompt_read, put, whole: threading.Event) -> None:
        """Generate ``completion`` on this engine thread, each cycle ``put`` to the response as it
        comes and None once the answer is whole (``whole`` set): the client has it then, while
        the engine still keeps it (the n-gram memory's file, the prompt cache's copy)."""
        prediction = self.predicted_tokens(completion.prediction)
        generation = self.decoder.generate(completion.prompt, max_tokens=completion.max_tokens,
                                           sampling=completion.sampling, policy=self.mode, stop=stop,
                                           prediction=prediction, grammar=completion.grammar,
                                           logprobs=completion.logprobs, on_prompt=prompt_read,
                                           origin="api")  # for the n-gram memory
        plain = self.plain_rate()
        plain = plain if isinstance(plain, PlainBasis) else PlainBasis(plain)
        for cycle in generation:
            if self.on_event is not None:
                plain.observe(cycle)
                snapshot = snapshot_of(generation.stats, cycle, plain, generation.prompt_total)
                self._tell(CycleEvent(cycle, snapshot, STAGE, Asker.API))
            put((cycle, generation.stats))
            if cycle.finish and not whole.is_set():
                whole.set()
                put(None)

    async def _generate(self, completion: Completion) -> AsyncIterator[Delta | Done]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        stop = self._stop = threading.Event()
        self.pace.started(len(completion.prompt), completion.max_tokens)

        def prompt_read(read: int, total: int) -> None:
            self.pace.prompt_read(read, total)
            if self.on_prompt is not None:
                self.on_prompt(read, total)

        whole = threading.Event()  # the last cycle came: the client has the whole answer

        def produce() -> None:
            put = functools.partial(loop.call_soon_threadsafe, queue.put_nowait)
            self._engine_threads[threading.get_ident()] = put
            try:
                with self.turn:
                    self._tell(Started(len(completion.prompt), client=completion.client))
                    try:
                        self._decode(completion, stop, prompt_read, put, whole)
                    finally:
                        self._tell(Decoded(Asker.API))  # done with llama.cpp, however the request ends
                if not whole.is_set():
                    put(None)
            except BaseException as exc:  # the request fails, the server does not
                if isinstance(exc, Exception) and not whole.is_set():  # (after a whole answer: only what it kept is lost)
                    self._tell(Failed(str(exc) or exc.__class__.__name__, Asker.API))
                put(exc)
            finally:
                self._engine_threads.pop(threading.get_ident(), None)

        thread = self._engine.start(produce, self._parked)
        stops = StopSequences(completion.stop)
        finish, generated, stats = "length", 0, Stats()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    if isinstance(item, ContextFullError):
                        raise BadRequest(str(item), param="messages", code="context_length_exceeded")
                    raise item
                cycle, stats = item  # the generation's own stats, as they stand after this cycle
                generated += len(cycle.emitted)
                self.pace.wrote(len(cycle.emitted))
                if cycle.finish == Finish.EOG:
                    finish = "stop"
                text = stops.feed(cycle.text) if not stops.stopped else ""
                if text or (cycle.logprobs and not stops.stopped):
                    yield Delta(text, self._scored(cycle))
                if stops.stopped and not stop.is_set():
                    finish = "stop"
                    stop.set()  # the rest of this pass is not wanted: end within one pass
            tail = stops.flush() if not stops.stopped else ""
            if tail:
                yield Delta(tail)
            done = Done(finish, usage(len(completion.prompt), generated, stats), speculum_numbers(stats),
                        stops.matched)
            self._tell(Finished(None, Asker.API, done.usage))
            yield done
        finally:
            stop.set()  # a consumer that left (client gone) stops the generation
            if not whole.is_set():  # (a whole answer's thread ends by itself: the response need not wait for it)
                await asyncio.to_thread(self._joined, thread)
            self.pace.finished()


class EngineJob:
    """One request's decoding on the engine thread: ended, or still running (``_joined`` asks)."""

    def __init__(self, work: Callable[[], None], ident: int):
        self.work, self.ident = work, ident
        self.ended = threading.Event()

    def is_alive(self) -> bool:
        return not self.ended.is_set()

    def join(self, timeout: float | None = None) -> None:
        self.ended.wait(timeout)


class EngineThread:
    """One long-lived thread for the requests' decoding. llama.cpp's OpenMP threads form a team
    per calling thread: a thread per request started a fresh team each time, and plain decoding
    served that way ran 2% slower than the same loop on one thread (docs/notes/issue47-never-slower.md).
    A request that comes while the thread is still busy (keeping the last answer, or parked inside
    llama.cpp by a lost RPC worker, for good) gets a new thread, at once, as before: it must be
    running to hear a lost worker's error. The busy one ends once its work does."""

    def __init__(self):
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue | None = None  # the current thread's
        self._thread: threading.Thread | None = None
        self._idle = False

    def start(self, work: Callable[[], None], parked: set[int]) -> EngineJob:
        with self._lock:
            if not self._idle or self._thread is None or self._thread.ident in parked:
                if self._idle:  # a parked thread that came back: it ends instead of waiting for work
                    self._jobs.put(None)
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(target=self._serve, args=(self._jobs,), name="speculum-serve",
                                                daemon=True)
                self._thread.start()
            self._idle = False
            job = EngineJob(work, self._thread.ident)
            self._jobs.put(job)
            return job

    def _serve(self, jobs: queue.SimpleQueue) -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            try:
                job.work()  # (its own errors go to its response)
            finally:
                job.ended.set()
                with self._lock:
                    if jobs is not self._jobs:  # a newer thread took over while this one worked
                        return
                    self._idle = True
