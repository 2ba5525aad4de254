"""Chat templates are code from a downloaded file: hostile ones end quickly in one plain error."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from speculum.engine import chat
from speculum.engine.chat import render_chat
from speculum.errors import SpeculumError

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
QUICK = 10.0  # seconds, measured under tracemalloc on a shared machine; unbounded, these run for hours
MEMORY = 256 << 20


class TemplateModel:
    """Only what rendering reads from a model (the template is pure logic)."""

    bos, eos = 1, 2
    path = facts = None

    def __init__(self, template: str):
        self.chat_template = template

    def token_text(self, token: int, special: bool = True) -> str:
        return {1: "<s>", 2: "</s>"}[token]


HOSTILE = {
    "nested range loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                           "steps"),
    "nested loops over the messages": ("{% for m in messages %}{% for i in range(100000) %}{% for j in "
                                       "range(100000) %}{{ '' }}{% endfor %}{% endfor %}{% endfor %}", "steps"),
    "a string times 10^10": ("{{ 'a' * 10000000000 }}", "characters"),
    "a string doubled 60 times": ("{% set ns = namespace(s='ab') %}{% for i in range(60) %}"
                                  "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}", "characters"),
    "a replace doubling 60 times": ("{% set ns = namespace(s='ab') %}{% for i in range(60) %}"
                                    "{% set ns.s = ns.s|replace('a', 'aa') %}{% endfor %}{{ ns.s }}", "characters"),
    "a list times 10^8": ("{{ ([1] * 100000000)|length }}", "items"),
    "a filter over a million copies": ("{{ ([messages] * 1000000)|map('string')|list|length }}", "steps"),
    "filters over generators": ("{{ range(100000)|map('string')|list|length }}" * 3, "steps"),
    "a number squared 60 times": ("{% set ns = namespace(n=3) %}{% for i in range(60) %}"
                                  "{% set ns.n = ns.n * ns.n %}{% endfor %}{{ ns.n }}", "bits"),
    "center of 10^10": ("{{ 'a'|center(10000000000) }}", "characters"),
    "ljust of 10^10": ("{{ 'a'.ljust(10000000000) }}", "characters"),
    "a format width of 10^10": ("{{ '{:>9999999999}'.format(1) }}", "wider"),
    "a percent width of 10^10": ("{{ '%9999999999d' % 1 }}", "wider"),
    "a join of 10 GB": ("{{ (['a' * 10000000] * 1000)|join }}", "characters"),
    "100 MB of output": ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "characters"),
    "endless recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "calls itself"),
    "division by zero": ("{{ 1 / 0 }}", "divides by zero"),
    "undefined to JSON": ("{{ nothing|tojson }}", "not JSON serializable"),
    "raise_exception": ("{{ raise_exception('System role not supported') }}", "System role not supported"),
    "a syntax error": ("{% for %}", "Expected an expression"),
    "a sandbox escape": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
}


@pytest.mark.timeout(60)  # without the bounds, the loops and the allocations would never end
@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_template_is_one_plain_error_quickly(case):
    template, why = HOSTILE[case]
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(SpeculumError) as err:
            render_chat(TemplateModel(template), MESSAGES)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < QUICK
    assert peak < MEMORY
    message = str(err.value)
    assert message.startswith("The chat template of this model could not be rendered: ")
    assert why in message and "\n" not in message and "Traceback" not in message


def test_slow_steps_stop_at_the_time_limit(monkeypatch):
    monkeypatch.setattr(chat, "MAX_SECONDS", 0.5)  # 10 s in the app; each step here takes about a millisecond
    start = time.perf_counter()
    with pytest.raises(SpeculumError, match="it runs longer than 0.5 seconds"):
        render_chat(TemplateModel("{% for i in range(100000) %}{{ ('x' * 4000000)|length }}{% endfor %}"), MESSAGES)
    assert time.perf_counter() - start < QUICK


def test_real_templates_still_render():
    qwen = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
            "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    assert render_chat(TemplateModel(qwen), MESSAGES[1:]) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n")
    loops = ("{{ bos_token }}{% for m in messages %}{{ loop.index }}/{{ loop.length }} {{ m.role|upper }}: "
             "{{ m.content ~ '!' }}{{ ' ' * 2 }}{{ '%s' % loop.last }}{{ m|tojson }}\n{% endfor %}{{ eos_token }}")
    assert render_chat(TemplateModel(loops), MESSAGES) == (
        '<s>1/2 SYSTEM: Be brief.!  False{"role": "system", "content": "Be brief."}\n'
        '2/2 USER: Hi!  True{"role": "user", "content": "Hi"}\n</s>')


def test_a_real_models_template_error_names_the_model(smollm, monkeypatch):
    monkeypatch.setattr(smollm, "chat_template", HOSTILE["nested range loops"][0])
    with pytest.raises(SpeculumError, match=r"^The chat template of SmolLM2-135M-Instruct\.Q4_1\.gguf could not be rendered: it takes more"):
        smollm.apply_chat_template(MESSAGES)
    monkeypatch.undo()
    assert "<|im_start|>user\nHi<|im_end|>" in smollm.apply_chat_template(MESSAGES)
