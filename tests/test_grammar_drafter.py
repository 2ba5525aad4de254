"""The grammar's forced text as drafts (engine/drafting/grammardrafter.py), on real vocabularies
and llama.cpp's grammar sampler: what it drafts after a schema's values and a tool call's opening,
and that an answer drafted so is plain decoding's, with the forced text accepted."""

from speculum.engine.decoder import Decoder
from speculum.engine.drafting.grammardrafter import GrammarDrafter
from speculum.engine.llama.model import LlamaModel
from speculum.engine.settings import LoadOptions
from speculum.engine.vocabulary import Source
from speculum.server.tools import tool_use
from test_engine_real import generate, tokens_of
from test_grammar_real import ASK, parsed_person, person_grammar

WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}]


class Answer:
    """An answer written token by token under a grammar, with the drafter following it."""

    def __init__(self, model, grammar, prompt: str = "Hello"):
        self.model = model
        self.state = grammar.start(model)
        self.context = model.tokenize(prompt, add_special=False)
        self.drafter = GrammarDrafter(model)
        self.drafter.begin(self.context)

    def write(self, text: str) -> str:
        """Write ``text``; the forced text the drafter then proposes (its match agreeing)."""
        for token in self.model.tokenize(text, add_special=False, parse_special=True):
            self.state.accept(token)
            self.context.append(token)
        self.drafter.constrain(self.state)
        match = self.drafter.match(self.context)
        draft = self.drafter._forced(self.context)[0]
        assert match.available == len(draft) and (match.length > 0) == bool(draft)
        return self.model.detokenize(draft) if draft else ""


def test_a_schemas_keys_are_drafted_in_the_answers_own_spacing(smollm):
    answer = Answer(smollm, person_grammar())
    assert answer.write("") == '{"name": "'  # forced '{', then JSON as models write it
    # Whether a blank comes before ',' or after it, the answer has not shown yet: nothing drafted.
    assert answer.write('{"name": "Alice Smith"') == ""
    assert answer.write(",") == ""
    assert answer.write(' "') == 'age":'  # the key forced, up to its value
    # A number's sign and digits are the model's (and more digits may follow it).
    assert answer.write('age": 34') == ""
    assert answer.write(",") == ' "city": "'  # after ',' a blank, as the answer wrote before


def test_the_answers_habit_decides_the_blanks(smollm):
    answer = Answer(smollm, person_grammar())
    assert answer.write('{"name":"Al Sm","age":34,') == '"city":"'  # no blanks, as the answer wrote none
    answer = Answer(smollm, person_grammar())
    assert answer.write('{ "name" : "Al Sm" , "age" : 3, ') == '"city" : "'


def test_a_tool_call_is_drafted_from_its_opening_to_its_arguments(qwen_draft_path):
    with LlamaModel(qwen_draft_path, LoadOptions(n_ctx=256)) as model:
        use = tool_use({"tools": WEATHER}, model.meta("tokenizer.chat_template"))
        answer = Answer(model, use.grammar())
        assert answer.write("Let me check the weather.\n") == ""  # free text before a call: nothing forced
        assert answer.write("<tool_call>") == '\n{"name": "get_'  # the names part at "get_"
        assert answer.write('\n{"name": "get_weather') == '", "arguments": {"city": "'
        assert answer.write('", "arguments": {"city": "Oslo') == ""
        # The prompt's own calls show the habit (an agent's history): compact JSON, from the first call on.
        earlier = '<tool_call>\n{"name":"get_time","arguments":{"zone":"UTC"}}\n</tool_call>'
        answer = Answer(model, use.grammar(), prompt=f"Earlier you wrote {earlier}\nNow:")
        assert answer.write("<tool_call>") == '\n{"name":"get_'
        assert answer.write('\n{"name":"get_weather') == '","arguments":{"city":"'
        # A bare call's opening (the lazy grammar's trigger '{"name"') is drafted once '{"' is
        # written, where the prompt's calls show it; else it is text like any other.
        assert Answer(model, use.grammar()).write('{"') == ""
        answer = Answer(model, use.grammar(), prompt=f'You called {{"name": "get_time", "arguments": {{}}}}.')
        assert answer.write('{"') == 'name": "get_'


def test_constrained_auto_drafts_the_forced_text_and_writes_plain_decodings_answer(smollm_path):
    decoder = Decoder(LlamaModel(smollm_path, LoadOptions(n_ctx=2048)))
    grammar = person_grammar()
    prompt = tokens_of(decoder, ASK)
    generate(decoder, prompt, max_tokens=1, policy="lookup")  # the prompt read once, as test_grammar_real does
    plain, _ = generate(decoder, prompt, max_tokens=80, policy="off", grammar=grammar)
    parsed_person(decoder, plain)
    spec, cycles = generate(decoder, prompt, max_tokens=80, policy="auto", grammar=grammar)
    assert spec == plain
    forced = [c for c in cycles if c.source == Source.GRAMMAR]
    # (How many the policy drafts depends on the passes' timings; the keys are accepted whole.)
    assert any(c.n_accepted == len(c.drafted) >= 2 for c in forced), [(c.drafted_text, c.n_accepted) for c in forced]
    # Without a grammar the drafter proposes nothing.
    _, free = generate(decoder, prompt, max_tokens=24, policy="auto")
    assert not [c for c in free if c.source == Source.GRAMMAR]
    decoder.target.close()
