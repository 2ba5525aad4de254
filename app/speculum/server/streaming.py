"""An answer's pieces as the HTTP routes stream them: until the client leaves, the first piece
awaited a moment (so a busy server still answers 429), then the rest with keep-alives while a long
prompt is read. One place for the OpenAI, Anthropic and Responses routes."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from starlette.requests import Request

from .service import Delta, Done

CLIENT_GONE = 499  # (nginx's code: never seen by the client, which has left)
FIRST_WAIT_S = 1.0  # a stream's first piece awaited this long before its events begin (a 429 stays a 429)


async def until_disconnected(request: Request, pieces):
    """The pieces of an answer until the client leaves; then the generation is stopped (and
    its prompt's reading, within a chunk) before the pieces are closed."""
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    step = None
    try:
        while True:
            step = asyncio.ensure_future(pieces.__anext__())
            await asyncio.wait({step, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():  # the client left
                return
            try:
                yield step.result()
            except StopAsyncIteration:
                return
    finally:
        watcher.cancel()
        await asyncio.shield(close(step, pieces))  # to the end, even when the response is cancelled


async def close(step, pieces) -> None:
    """End a generation: the step in flight first (closing a generator that runs fails)."""
    if step is not None and not step.done():
        step.cancel()
        await asyncio.gather(step, return_exceptions=True)
    await pieces.aclose()


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def collected(pieces: AsyncIterator) -> tuple[str, Done | None]:
    """An answer given whole: its text, and its Done (None when the client went away)."""
    text, done = [], None
    async for piece in pieces:
        if isinstance(piece, Delta):
            text.append(piece.text)
        else:
            done = piece
    return "".join(text), done


async def first_piece(pieces: AsyncIterator) -> asyncio.Future | None:
    """The first piece's step, awaited up to FIRST_WAIT_S (a Busy raised by then is answered as
    such); None when the client left first."""
    first = asyncio.ensure_future(pieces.__anext__())
    await asyncio.wait({first}, timeout=FIRST_WAIT_S)
    if first.done():
        try:
            first.result()
        except StopAsyncIteration:
            return None
    return first


class Paced:
    """An answer's pieces from its first step on, with None each ``interval`` seconds a piece
    takes (a keep-alive for the client); ends after Done or when the client leaves. ``close``
    ends the generation, the model's turn passing on as soon as the answer is out."""

    def __init__(self, first: asyncio.Future, pieces: AsyncIterator, interval: float):
        self.step, self.pieces, self.interval = first, pieces, interval

    async def __aiter__(self):
        while True:
            while not self.step.done():
                await asyncio.wait({self.step}, timeout=self.interval)
                if not self.step.done():
                    yield None
            try:
                piece = self.step.result()
            except StopAsyncIteration:  # the client left: no more to say
                return
            yield piece
            if isinstance(piece, Done):
                return
            self.step = asyncio.ensure_future(self.pieces.__anext__())

    async def close(self) -> None:
        await asyncio.shield(close(self.step, self.pieces))
