"""The server's engine thread (server/service.py): one long-lived thread for the requests'
decoding (llama.cpp's OpenMP team lives with its calling thread), a new one when it is busy or
parked, and a thread that was taken over ends once its work does."""

import threading

from speculum.server.service import EngineThread


def _ran_on(engine, parked=frozenset(), work=None):
    seen = []

    def record():
        seen.append(threading.get_ident())
        if work is not None:
            work()

    job = engine.start(record, set(parked))
    return job, seen


def test_requests_decode_on_one_thread_while_it_is_free():
    engine = EngineThread()
    first, seen_first = _ran_on(engine)
    first.join(5)
    second, seen_second = _ran_on(engine)
    second.join(5)
    assert not first.is_alive() and not second.is_alive()
    assert seen_first == seen_second == [first.ident] and second.ident == first.ident


def test_a_busy_thread_is_not_waited_for_and_ends_after_its_work():
    engine = EngineThread()
    release = threading.Event()
    busy, _ = _ran_on(engine, work=release.wait)
    other, seen = _ran_on(engine)
    other.join(5)
    assert busy.is_alive() and not other.is_alive()  # the new request ran while the old work went on
    assert seen == [other.ident] != [busy.ident]
    old = next(t for t in threading.enumerate() if t.ident == busy.ident)
    release.set()
    busy.join(5)
    old.join(5)
    assert not old.is_alive()  # taken over: it ended instead of waiting for work that never comes
    again, seen_again = _ran_on(engine)
    again.join(5)
    assert seen_again == [other.ident]  # the current thread, free again, takes the next request


def test_a_parked_thread_is_never_given_work_again():
    engine = EngineThread()
    first, _ = _ran_on(engine)
    first.join(5)
    old = next(t for t in threading.enumerate() if t.ident == first.ident)
    second, seen = _ran_on(engine, parked={first.ident})
    second.join(5)
    assert seen == [second.ident] and second.ident != first.ident
    old.join(5)
    assert not old.is_alive()  # (parked, it came back: it ends rather than wait for work forever)
