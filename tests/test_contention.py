"""llama.cpp's threads follow the cores other programs leave free (engine/llama/contention.py)."""

import subprocess
import sys
import time

import pytest

from speculum.engine.llama import contention
from speculum.engine.llama.contention import Cores, busy_seconds

STAT = """cpu  900 0 100 5000 0 0 0 0 0 0
cpu0 400 0 50 2500 7 0 10 5 0 0
cpu1 500 0 50 2500 0 0 0 0 0 0
cpu2 9999 0 0 0 0 0 0 0 0 0
intr 12345
"""


def test_busy_time_is_read_from_the_cores_this_process_may_use(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    if not sys.platform.startswith("linux"):
        assert busy_seconds({0, 1}, str(stat)) is None
        return
    ticks = contention.os.sysconf("SC_CLK_TCK")
    # user + nice + system + irq + softirq + steal; idle and iowait are not busy
    assert busy_seconds({0}, str(stat)) == pytest.approx((400 + 50 + 10 + 5) / ticks)
    assert busy_seconds({0, 1}, str(stat)) == pytest.approx((465 + 550) / ticks)
    assert busy_seconds(None, str(stat)) == pytest.approx((465 + 550 + 9999) / ticks)  # not the "cpu" total twice
    assert busy_seconds({0}, str(tmp_path / "missing")) is None


class Machine:
    """A machine's CPU time by the clock: this process uses ``own`` cores, others ``others``."""

    def __init__(self):
        self.t = 0.0
        self.own_rate, self.others_rate = 2.0, 0.0
        self.own_s = self.busy_s = 0.0

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.own_s += self.own_rate * seconds
        self.busy_s += (self.own_rate + self.others_rate) * seconds


def test_threads_leave_the_cores_others_take_and_come_back_when_they_leave():
    m = Machine()
    cores = Cores(busy=lambda: m.busy_s, own=lambda: m.own_s, clock=lambda: m.t)
    assert cores.threads(2) == 2  # nothing read yet
    m.advance(1.0)
    assert cores.threads(2) == 2  # a quiet machine
    m.others_rate, m.own_rate = 1.0, 1.0  # a compile takes a core
    m.advance(1.0)
    assert cores.threads(2) == 1 and cores.others == pytest.approx(1.0)
    m.advance(0.1)
    assert cores.threads(2) == 1  # read again only after INTERVAL_S
    m.others_rate, m.own_rate = 0.3, 2.0  # an idle browser: the core stays ours
    m.advance(1.0)
    assert cores.threads(2) == 2
    m.others_rate = 8.0  # more taken than there are cores: one thread still runs
    m.advance(1.0)
    assert cores.threads(4) == 1


def test_after_a_pause_decoding_starts_on_every_core_and_then_reads_them_again():
    # While this process waited, another one decoded on both cores (a server beside it); that
    # says nothing of the moment the next request comes: its prompt is read on all cores.
    m = Machine()
    cores = Cores(busy=lambda: m.busy_s, own=lambda: m.own_s, clock=lambda: m.t)
    cores.threads(2)
    m.own_rate, m.others_rate = 0.0, 2.0
    m.advance(5.0)
    assert cores.threads(2) == 2
    m.own_rate, m.others_rate = 1.0, 1.0  # ... but a program that goes on holding a core is seen
    m.advance(0.3)
    assert cores.threads(2) == 1


def test_following_the_cores_can_be_turned_off(monkeypatch):
    monkeypatch.setenv(contention.FOLLOW, "0")
    assert contention.cores() is None
    monkeypatch.delenv(contention.FOLLOW)
    assert contention.cores() is not None


def test_where_the_system_does_not_say_the_count_stays_as_chosen():
    cores = Cores(busy=lambda: None, own=lambda: 0.0, clock=time.monotonic)
    assert cores.threads(2) == 2
    assert cores.threads(2) == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the cores' busy time is read from Linux's /proc/stat")
def test_a_model_decodes_on_fewer_threads_while_other_programs_hold_every_core(smollm_path):
    from speculum.engine.llama.model import LlamaModel
    from speculum.engine.settings import LoadOptions

    cores = contention._affinity() or {0}
    if len(cores) < 2:
        pytest.skip("one core: there is no thread to give up")
    model = LlamaModel(smollm_path, LoadOptions(n_ctx=512))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in cores]
    try:
        tokens = model.tokenize("Once upon a time")
        model.decode(tokens)
        deadline = time.monotonic() + 30
        while model.threads_now == model.n_threads and time.monotonic() < deadline:
            if model.n_past > 400:
                model.reset()
            model.decode([tokens[-1]])
        assert model.threads_now < model.n_threads
    finally:
        for hog in hogs:
            hog.kill()
        model.close()
