"""MTP drafts: a target's own NextN head, through llama.cpp, on tiny models the tests write."""

import json

import numpy as np
import pytest

from mtpgguf import NEXTN_LAYERS, write_gemma4_pair, write_mtp_gguf
from speculum.engine.llama import llama_ext
from speculum.engine.decoder import Decoder
from speculum.engine.llama.model import LlamaModel
from speculum.engine.sampling import SamplingParams, distribution
from speculum.engine.settings import LoadOptions
from speculum.engine.vocabulary import Device, Source
from speculum.models.gguf import check_gguf_file
from test_cli import speculum
from test_exactness_synthetic import chi_square_p

# Batch composition moves these f32 logits by ~1e-3: a greedy difference is allowed only at a tie.
MAX_NOISE = 0.02


@pytest.fixture(scope="session")
def mtp_models(tmp_path_factory, smollm_path):
    """aligned: the head predicts the main head by construction; noisy: it guesses, often wrong;
    plain: the same trunk without a NextN block. GLM-4.5's architecture (glm4moe, a KV cache),
    Qwen3.5's (qwen35: a recurrent Gated DeltaNet layer, then gated attention) and Step-3.5's
    (step35: three chained heads, sliding-window and full attention)."""
    folder = tmp_path_factory.mktemp("mtp")
    models = {"plain": write_mtp_gguf(folder / "plain.gguf", smollm_path, nextn=False)}
    for arch, prefix in ARCHS.items():
        models[prefix + "aligned"] = write_mtp_gguf(folder / f"{prefix}aligned.gguf", smollm_path, arch=arch)
        # Chained heads compound their errors: at 0.05 Step-3.5's third head was never kept in
        # the sampled test (0 of 1,500); at 0.02 a quarter of its drafts are.
        noise = 0.02 if arch == "step35" else 0.05
        models[prefix + "noisy"] = write_mtp_gguf(folder / f"{prefix}noisy.gguf", smollm_path, noise=noise, seed=1,
                                                  arch=arch)
    return models


ARCHS = {"glm4moe": "", "qwen35": "qwen35-", "step35": "step35-"}  # architecture -> its models' key prefix


@pytest.fixture(scope="session")
def gemma4_models(tmp_path_factory, smollm_path):
    """Gemma 4 targets with their assistants (separate files): (target, assistant) pairs.
    Gemma's post-norms make every output loud, so its noise is smaller."""
    folder = tmp_path_factory.mktemp("gemma4")
    return {"aligned": write_gemma4_pair(folder, smollm_path, name="aligned"),
            "noisy": write_gemma4_pair(folder, smollm_path, noise=0.005, seed=1, name="noisy")}


def gemma4_target(pair, n_ctx=512):
    model = LlamaModel(pair[0], LoadOptions(n_ctx=n_ctx, n_threads=1))
    model.attach_assistant(pair[1])
    return model


@pytest.fixture(scope="module", params=[*ARCHS, "gemma4"])
def noisy(mtp_models, gemma4_models, request):
    if request.param == "gemma4":  # the target, drafted for by its assistant
        model = gemma4_target(gemma4_models["noisy"])
    else:
        model = LlamaModel(mtp_models[ARCHS[request.param] + "noisy"], LoadOptions(n_ctx=512, n_threads=1))
    yield Decoder(model)
    model.close()


def prompt_of(model, text="Write a haiku about speculative decoding."):
    return model.tokenize(model.apply_chat_template([{"role": "user", "content": text}]))


def generate(decoder, prompt, **kw):
    cycles = list(decoder.generate(prompt, **kw))
    return [t for c in cycles for t in c.emitted], cycles


def top2_gap(path, tokens):
    with LlamaModel(path, LoadOptions(n_ctx=512, n_threads=1)) as ref:
        row = np.sort(ref.prefill(tokens).astype(np.float64))
    return row[-1] - row[-2]


def test_this_llama_cpp_can_run_mtp():
    assert llama_ext.support(), llama_ext.support().reason
    assert llama_ext.staging().get_embeddings_nextn_ith is not None


def test_header_reports_nextn_layers(mtp_models, smollm_path):
    assert check_gguf_file(mtp_models["aligned"]).nextn_layers == 1
    assert check_gguf_file(mtp_models["plain"]).nextn_layers == 0
    assert check_gguf_file(smollm_path).nextn_layers == 0


def test_loads_with_its_mtp_head(mtp_models):
    with LlamaModel(mtp_models["aligned"], LoadOptions(n_ctx=256, n_threads=1), verifies=True) as model:
        assert model.flash_attn is None  # a target with MTP heads keeps llama.cpp's attention (cpu_settings)
        assert model.facts.architecture == "glm4moe"
        assert model.n_nextn == 1 and model.facts.nextn_layers == 1  # the window names the head from facts
        assert Source.MTP in Decoder(model).drafters
    with LlamaModel(mtp_models["qwen35-aligned"], LoadOptions(n_ctx=256, n_threads=1)) as model:
        assert model.facts.architecture == "qwen35" and model.n_nextn == 1
    with LlamaModel(mtp_models["step35-aligned"], LoadOptions(n_ctx=256, n_threads=1)) as model:
        assert model.facts.architecture == "step35" and model.n_nextn == model.facts.nextn_layers == 3
        drafter = Decoder(model).drafters[Source.MTP]
        assert drafter.head.chained and drafter.n_heads == 3
    with LlamaModel(mtp_models["plain"], LoadOptions(n_ctx=256, n_threads=1)) as model:
        assert model.n_nextn == 0
        assert Source.MTP not in Decoder(model).drafters


@pytest.mark.parametrize("k", [1, 2, 3, 6])
def test_greedy_mtp_equals_plain(noisy, k):
    prompt = prompt_of(noisy.target)
    plain, _ = generate(noisy, prompt, max_tokens=48, policy="off")
    spec, cycles = generate(noisy, prompt, max_tokens=48, policy="mtp", k=k)
    drafted = sum(len(c.drafted) for c in cycles)
    accepted = sum(c.n_accepted for c in cycles)
    assert all(c.source == Source.MTP for c in cycles if c.drafted)
    n_nextn = noisy.target.n_nextn  # chained heads: one per step, so never more drafts than heads
    assert max(len(c.drafted) for c in cycles) == (min(k, n_nextn) if n_nextn > 1 else k)
    assert 0 < accepted < drafted  # both paths taken: kept drafts and rejected ones
    i = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
    if i is not None:
        assert top2_gap(noisy.target.path, prompt + plain[:i]) < MAX_NOISE, i
    else:
        assert len(spec) == len(plain)


def test_second_turn_and_other_modes_keep_the_head_in_step(noisy):
    """A longer second prompt reusing the cache, and cycles of another drafter in between."""
    first = prompt_of(noisy.target)
    out, _ = generate(noisy, first, max_tokens=12, policy="lookup", k=3)
    second = first + out + noisy.target.tokenize("\nAnd another one, please.")
    plain, _ = generate(noisy, second, max_tokens=24, policy="off")
    spec, cycles = generate(noisy, second, max_tokens=24, policy="mtp", k=3)
    assert spec == plain
    assert sum(c.n_accepted for c in cycles) > 0


def shifted_target_hidden(ref, context):
    """A fresh target reads all of ``context`` but its pending last token; the hidden state
    row paired with each token for the MTP head: the target's at the position before (zero
    for the first)."""
    rows = []
    ref.listen_to_decodes(lambda tokens, pos, hidden: rows.append(np.array(hidden)))
    ref.prefill(context[:-1])
    return np.concatenate([np.zeros((1, ref.n_embd), np.float32)] + rows)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("max_pending, switch", [(4, False), (None, False), (4, True)])
def test_head_is_fed_as_llama_cpp_feeds_it(mtp_models, max_pending, switch, arch):
    """After cycles of MTP and of lookup drafts (pairs pushed in early with a small
    ``max_pending``; then, with ``switch``, another conversation), the head's next proposal
    equals a fresh head fed every pair (token at p, the target's hidden state at p - 1) in
    one batch."""
    path = mtp_models[ARCHS[arch] + "noisy"]
    with LlamaModel(path, LoadOptions(n_ctx=512, n_threads=1)) as model:
        decoder = Decoder(model)
        drafter = decoder.drafters[Source.MTP]
        if max_pending is not None:
            drafter.max_pending = max_pending
        prompt = prompt_of(model)
        out, _ = generate(decoder, prompt, max_tokens=10, policy="mtp", k=3)
        more, _ = generate(decoder, prompt + out, max_tokens=10, policy="lookup", k=3)
        if switch:  # another conversation, sharing only the template's start
            prompt, out = prompt_of(model, "Now something else: name three rivers."), []
            more, _ = generate(decoder, prompt, max_tokens=10, policy="lookup", k=3)
        context = prompt + out + more
        sampling = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=0)
        from speculum.engine.drafting.draft import Choice
        q = drafter.propose(context, 1, Choice(Source.MTP, 1), sampling, np.random.default_rng(0)).q[0]
    with LlamaModel(path, LoadOptions(n_ctx=512, n_threads=1)) as ref:
        hidden = shifted_target_hidden(ref, context)
        head = ref.open_mtp_head()
        logits, _ = head.decode(context, hidden, 0, logits=True)
        expected = distribution(logits, sampling)
    assert np.abs(q - expected).max() < 1e-3


def test_chained_heads_are_fed_as_llama_cpp_feeds_them(mtp_models):
    """Step-3.5's draft step i runs head i on: the catch-up pairs (token at p, the target's
    hidden state at p - 1), then the pending token with the target's last hidden state, then
    each drafted token with the hidden state the previous step's head gave. Each q row equals
    a fresh context fed all of that in one batch under that head, and not under another one;
    the context is left on the first head."""
    path = mtp_models["step35-noisy"]
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=0)
    with LlamaModel(path, LoadOptions(n_ctx=512, n_threads=1)) as model:
        decoder = Decoder(model)
        drafter = decoder.drafters[Source.MTP]
        prompt = prompt_of(model)
        out, _ = generate(decoder, prompt, max_tokens=10, policy="mtp", k=3)
        more, _ = generate(decoder, prompt + out, max_tokens=6, policy="lookup", k=3)
        context = prompt + out + more
        from speculum.engine.drafting.draft import Choice
        draft = drafter.propose(context, 5, Choice(Source.MTP, 5), sampling, np.random.default_rng(0))
        assert len(draft.tokens) == 3 and drafter.head.layer == 0
    with LlamaModel(path, LoadOptions(n_ctx=512, n_threads=1)) as ref:
        target_hidden = shifted_target_hidden(ref, context)
        head = ref.open_mtp_head()
        tokens, hidden = list(context), target_hidden
        for step in range(3):
            expected = {}
            for layer in range(3):
                logits, h = head.decode(tokens, hidden, 0, logits=True, layer=layer)
                expected[layer] = (distribution(logits, sampling), h)
            q, h = expected[step]
            assert np.abs(draft.q[step] - q).max() < 1e-3, step
            off = np.abs(draft.q[step] - q).sum()
            others = [np.abs(draft.q[step] - expected[o][0]).sum() for o in range(3) if o != step]
            assert min(others) > 100 * off, step  # it was this step's head: the others are far off (~1e6 x)
            tokens, hidden = tokens + [draft.tokens[step]], np.concatenate([hidden, h[None, :]])


def test_recurrent_target_rolls_back_drafts_and_starts_over_beyond_its_snapshots(mtp_models):
    """Qwen3.5's Gated DeltaNet state is rolled back through llama.cpp's snapshots: drafts
    never exceed them, and a cut further back than they reach decodes the context again."""
    with LlamaModel(mtp_models["qwen35-noisy"], LoadOptions(n_ctx=512, n_threads=1)) as model:
        assert model.max_rollback == 16
        model.decode([1, 2, 3, 4])
        assert model.trim(2) == 2  # within the latest pass: its snapshots hold the state
        assert model.trim(1) == 0  # once more, or further back: llama.cpp would restore a stale state
        model.decode([1, 2])
        model.decode([3])
        assert model.trim(1) == 0  # before the latest pass
        decoder = Decoder(model)
        first = prompt_of(model)
        generate(decoder, first, max_tokens=40, policy="off")
        other = prompt_of(model, "Write a haiku about rollback.")  # shares only the template's start
        plain, _ = generate(decoder, other, max_tokens=32, policy="off")
        spec, cycles = generate(decoder, other, max_tokens=32, policy="mtp", k=24)
        assert max(len(c.drafted) for c in cycles) == 16
    with LlamaModel(mtp_models["qwen35-noisy"], LoadOptions(n_ctx=512, n_threads=1)) as fresh:
        reference, _ = generate(Decoder(fresh), other, max_tokens=32, policy="off")
    assert plain == reference
    i = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
    assert i is None or top2_gap(mtp_models["qwen35-noisy"], other + plain[:i]) < MAX_NOISE


def check_aligned_head(model, positions: int, min_drafted: int):
    """A head built to predict what the main head will: greedy MTP equals plain decoding, and
    nearly every draft is kept, at each of ``positions`` draft positions."""
    decoder = Decoder(model)
    prompt = prompt_of(model)
    plain, _ = generate(decoder, prompt, max_tokens=40, policy="off")
    spec, cycles = generate(decoder, prompt, max_tokens=40, policy="mtp", k=4)
    assert spec == plain
    stats = decoder.stats
    assert stats.drafted >= min_drafted and stats.accepted / stats.drafted >= 0.95
    assert len(stats.drafted_at) == positions
    assert all(a >= 0.9 * d > 0 for a, d in zip(stats.accepted_at, stats.drafted_at))
    return decoder, prompt, cycles


@pytest.mark.parametrize("arch", list(ARCHS))
def test_aligned_head_is_accepted_and_cycles_record_it(mtp_models, arch):
    """The head built to predict what the main head will: nearly every draft is kept (chained
    heads: each of them, at its own position)."""
    with LlamaModel(mtp_models[ARCHS[arch] + "aligned"], LoadOptions(n_ctx=512, n_threads=1)) as model:
        assert model.facts.architecture == arch
        positions = 4 if NEXTN_LAYERS[arch] == 1 else NEXTN_LAYERS[arch]
        decoder, prompt, cycles = check_aligned_head(model, positions, min_drafted=30 if positions == 4 else 25)
        assert decoder.stats.by_source[Source.MTP][1] == decoder.stats.accepted
        cycle = next(c for c in cycles if c.drafted)
        record = cycle.to_json()
        assert record["source"] == "mtp" and record["n_accepted"] == len(cycle.drafted)
        assert json.loads(json.dumps(record))["source"] == "mtp"
        # Sampled drafts carry q: the head agrees, so acceptance stays high.
        _, sampled = generate(decoder, prompt, max_tokens=40, policy="mtp", k=4,
                              sampling=SamplingParams(temperature=1.0, top_k=8, seed=5))
        drafted = sum(len(c.drafted) for c in sampled)
        assert sum(c.n_accepted for c in sampled) >= 0.8 * drafted > 0


def test_sampled_distribution_matches_target(noisy):
    """Over many seeded runs, sequences of 4 sampled tokens follow the target's own distribution
    (5 with chained heads, so that the first drafting pass drafts with all three: the first
    token comes from the prompt's last row)."""
    sampling_kw = dict(temperature=1.0, top_k=4, top_p=1.0)
    params = SamplingParams(**sampling_kw)
    prompt = prompt_of(noisy.target, "Say one word.")
    chained = noisy.target.n_nextn > 1
    steps, k = (5, 3) if chained else (4, 2)
    # The exact distribution of the continuations, from the target alone (top-4 each step).
    probs = {(): 1.0}
    with LlamaModel(noisy.target.path, LoadOptions(n_ctx=512, n_threads=1)) as ref:
        for _ in range(steps):
            nxt = {}
            for seq, pr in probs.items():
                ref.reset()
                p = distribution(ref.prefill(prompt + list(seq)), params)
                for t in np.flatnonzero(p):
                    nxt[seq + (int(t),)] = pr * p[t]
            probs = nxt
    n = 1500
    joint = {}
    drafted = accepted = 0
    reached = [0] * k  # drafts that reached each position (chained: each head in turn), and kept there
    kept = [0] * k
    for seed in range(n):
        out, cycles = generate(noisy, prompt, max_tokens=steps, policy="mtp", k=k,
                               sampling=SamplingParams(seed=seed, **sampling_kw))
        drafted += sum(len(c.drafted) for c in cycles)
        accepted += sum(c.n_accepted for c in cycles)
        for c in cycles:
            for i in range(len(c.drafted)):
                reached[i] += 1
                kept[i] += i < c.n_accepted
        assert len(out) == steps
        joint[tuple(out)] = joint.get(tuple(out), 0) + 1
    assert drafted > n and 0 < accepted < drafted  # speculation really happened, both ways
    if chained:  # the last head drafted in most runs, and was both kept and rejected
        assert reached[-1] > n / 2 and 0 < kept[-1] < reached[-1]
    assert set(joint) <= set(probs)
    keys = sorted(probs)
    assert chi_square_p([joint.get(s, 0) for s in keys], [probs[s] for s in keys], n) > 0.001
    last = {}
    for s in keys:
        last[s[-1]] = last.get(s[-1], 0.0) + probs[s]
    counts = {}
    for s, c in joint.items():
        counts[s[-1]] = counts.get(s[-1], 0) + c
    toks = sorted(last)
    assert chi_square_p([counts.get(t, 0) for t in toks], [last[t] for t in toks], n) > 0.001


def test_mode_mtp_without_nextn_layers_is_one_plain_sentence(smollm_path):
    proc = speculum("generate", "--target", smollm_path, "--mode", "mtp", "hi")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("speculum: MTP mode needs a model with its own")
    served = speculum("serve", "--target", smollm_path, "--mode", "mtp", "--port", "1")  # refused before serving
    assert served.returncode == 2 and served.stderr.strip() == lines[0]


def test_generate_mode_mtp_on_the_cli(mtp_models):
    proc = speculum("generate", "--target", mtp_models["aligned"], "--mode", "mtp", "-k", "3", "--fixed-k", "--threads", "1",
                    "--max-tokens", "16", "--json", "hi")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert any(c.get("source") == "mtp" and c["drafted"] for c in lines[:-1])
    assert lines[-1]["acceptance_rate"] >= 0.9


def test_doctor_says_whether_mtp_runs():
    proc = speculum("doctor")
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("MTP"))
    assert "yes" in row


def test_auto_mode_measures_and_learns_the_mtp_head(mtp_models, data_dirs):
    """Auto mode times the head like a draft model and learns its acceptance per position.
    On this tiny model the head costs what a target step does (both are mostly the LM head),
    so left to itself auto decodes plainly (it tries the untimed head only when a draw says so);
    told the head costs a twentieth of a step (as on a deep model), it drafts with it, and those
    drafts time it."""
    from speculum.engine.policy.auto import AutoPolicy

    with LlamaModel(mtp_models["aligned"], LoadOptions(n_ctx=512, n_threads=1)) as model:
        decoder = Decoder(model)
        prompt = prompt_of(model)
        plain, _ = generate(decoder, prompt, max_tokens=40, policy="off")
        policy = decoder.policy_for("auto")
        assert isinstance(policy, AutoPolicy) and Source.MTP in policy.sources
        spec, _ = generate(decoder, prompt, max_tokens=40, policy="auto")  # a plain step timed, at least
        assert spec == plain
        costs = policy.costs
        told = costs.mtp_first_s = costs.mtp_step_s = costs.verify(1) / 20
        spec, cycles = generate(decoder, prompt, max_tokens=40, policy="auto")
        assert spec == plain
        assert costs.mtp_first_s > 0 and costs.mtp_step_s > 0
        assert costs.mtp_first_s != told  # timed by its drafts
        mtp = [c for c in cycles if c.source == Source.MTP]
        assert mtp and all(c.n_accepted == len(c.drafted) for c in mtp)
        assert policy.mtp_rates[0].accepted > 1 and policy.mtp_rates[0].rejected < 0.5
        assert mtp[-1].policy.model_acceptance[0] > 0.8  # the report shows the MTP head's while it drafts
        policy.save()
        again = AutoPolicy(decoder.drafters, "auto", Device.CPU, policy.store)
        assert again.costs.mtp_step_s == policy.costs.mtp_step_s
        assert again.mtp_rates[0].prior > 0.8


def test_adaptive_k_asks_chained_heads_for_no_more_than_they_have(mtp_models):
    """Step-3.5's three heads draft three tokens at most: told the head is nearly free (as on
    a deep model) and seeing every draft kept, the MTP policy asks for no more than three
    (before the cap it asked for 8, its longest MTP draft)."""
    with LlamaModel(mtp_models["step35-aligned"], LoadOptions(n_ctx=512, n_threads=1)) as model:
        decoder = Decoder(model)
        prompt = prompt_of(model)
        generate(decoder, prompt, max_tokens=24, policy="mtp")
        costs = decoder.policies["mtp"].costs
        costs.mtp_first_s = costs.mtp_step_s = costs.verify(1) / 20
        _, cycles = generate(decoder, prompt, max_tokens=40, policy="mtp")
        assert 2 <= max(c.k for c in cycles) <= 3
        assert all(c.n_accepted == len(c.drafted) <= 3 for c in cycles)


def test_auto_puts_a_confident_lookup_first_with_the_mtp_head_behind():
    """Hybrid, as users run MTP with n-gram drafts on code edits: a long lookup match drafts
    first and the MTP head drafts when lookup has nothing."""
    from speculum.engine.policy.auto import AutoPolicy
    from speculum.engine.policy.costs import CostModel
    from speculum.engine.drafting.draft import Draft, Drafter
    from speculum.engine.drafting.lookup import PromptLookup

    class Head(Drafter):  # only its source (and no cap on its drafts) matter to the policy
        source = Source.MTP

        @classmethod
        def build(cls, inputs):
            return cls()

        def propose(self, context, k, choice, sampling, rng):
            return Draft(source=self.source)

    policy = AutoPolicy({Source.LOOKUP: PromptLookup(), Source.MTP: Head()}, "auto", Device.CUDA)
    policy.calibrated(CostModel({n: 0.010 + 0.0002 * n for n in range(1, 17)}, gpu=True,
                                mtp_first_s=0.001, mtp_step_s=0.001))
    for rate in policy.mtp_rates:
        rate.prior = 0.8
    for rate in policy.lookup_rates[3]:  # copies expected at 0.93 of the head's speed: close enough to go first
        rate.prior = 0.6
    text = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    copying = policy.choose(text + [1, 2] + text[:3])  # its last 3 tokens were seen before: copy what followed
    assert copying.source == Source.LOOKUP and copying.fallback == Source.MTP
    fresh = policy.choose(text + [1, 2] + text[:3] + [40, 41])  # "41" never seen: nothing to copy
    assert fresh.source == Source.MTP and fresh.k > 1


def test_bench_compares_mtp_and_skips_it_without_nextn_layers(mtp_models, tmp_path):
    suite = tmp_path / "suite.jsonl"
    suite.write_text(json.dumps({"name": "hello", "user": "Say hello.", "max_tokens": 12}) + "\n")
    for model, modes in ((mtp_models["aligned"], ["mtp", "off"]), (mtp_models["plain"], ["off"])):
        proc = speculum("bench", "--target", model, "--prompts", suite, "--modes", "off,mtp", "--threads", "1",
                        "--json")
        assert proc.returncode == 0, proc.stderr
        results = json.loads(proc.stdout)["results"]
        assert sorted(r["mode"] for r in results) == modes
        assert all(r["acceptance_rate"] >= 0.9 for r in results if r["mode"] == "mtp")


def test_models_check_says_a_target_with_nextn_layers_is_a_pair_alone(mtp_models, smollm_path):
    alone = speculum("models", "check", mtp_models["aligned"])
    assert alone.returncode == 0, alone.stderr
    assert "carries 1 NextN (MTP) layer" in alone.stdout and "Built-in (MTP)" in alone.stdout
    plain = speculum("models", "check", smollm_path)
    assert plain.returncode == 1 and "has no NextN (MTP) layers" in plain.stdout
    pair = speculum("models", "check", mtp_models["aligned"], smollm_path)
    assert pair.returncode == 0 and "also drafts for itself" in pair.stdout


def test_pair_picker_offers_built_in_mtp_for_a_target_with_nextn_layers(qtbot, mtp_models, tmp_path, monkeypatch):
    from speculum.ui.library.modelbar import BUILT_IN, BUILT_IN_MTP, ModelBar

    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("aligned", "plain"):
        (folder / f"{name}.gguf").symlink_to(mtp_models[name])
    monkeypatch.setenv("SPECULUM_MODELS_DIR", str(folder))
    bar = ModelBar()
    qtbot.addWidget(bar)
    bar.refresh_models(str(folder / "plain.gguf"), "")
    labels = [bar.draft_combo.itemText(i) for i in range(bar.draft_combo.count())]
    assert BUILT_IN_MTP not in labels
    bar.select_pair(str(folder / "aligned.gguf"))
    assert bar.draft_combo.findData(BUILT_IN) == 1
    bar.draft_combo.setCurrentIndex(1)
    assert bar.mode_combo.currentData() == "mtp" and bar.draft_path() is None
    bar.select_pair(str(folder / "plain.gguf"), BUILT_IN)  # a saved choice the new target cannot honour
    assert bar.draft_combo.findData(BUILT_IN) < 0 and bar.draft_path() is None


def test_pair_picker_picks_mtp_mode_for_a_gemma4_assistant(qtbot, gemma4_models, tmp_path, monkeypatch):
    from speculum.ui.library.modelbar import ModelBar

    folder = tmp_path / "models"
    folder.mkdir()
    for path in gemma4_models["aligned"]:
        (folder / path.name).symlink_to(path)
    target, assistant = (str(folder / p.name) for p in gemma4_models["aligned"])
    monkeypatch.setenv("SPECULUM_MODELS_DIR", str(folder))
    bar = ModelBar()
    qtbot.addWidget(bar)
    bar.refresh_models(target, "")
    assert bar.mode_combo.currentData() != "mtp"
    # Offered as a draft only: as a target it could not load.
    assert bar.target_combo.findData(assistant) < 0 and bar.target_combo.findData(target) >= 0
    bar.draft_combo.setCurrentIndex(bar.draft_combo.findData(assistant))
    assert bar.mode_combo.currentData() == "mtp" and bar.draft_path() == assistant  # loaded as the draft file


def test_a_llama_cpp_without_mtp_says_so_for_a_model_with_nextn_layers(mtp_models, monkeypatch):
    from speculum.errors import SpeculumError

    reason = "this llama.cpp does not export llama_get_embeddings_nextn, which MTP drafting needs."
    monkeypatch.setattr(llama_ext, "support", lambda: llama_ext.Support(False, reason))
    with LlamaModel(mtp_models["aligned"], LoadOptions(n_ctx=256, n_threads=1)) as model:
        assert model.n_nextn == 0
        decoder = Decoder(model)
        assert Source.MTP not in decoder.drafters
        with pytest.raises(SpeculumError, match="aligned.gguf has NextN .MTP. layers, but this llama.cpp does not"):
            decoder.policy_for("mtp")
        assert len(generate(decoder, prompt_of(model), max_tokens=4, policy="off")[0]) == 4  # it still runs


def test_gemma4_assistant_drafts_on_its_targets_cache(gemma4_models, mtp_models):
    """A Gemma 4 assistant is a file of its own, loaded as the draft: it becomes the target's
    MTP head, with no cache of its own and no chained heads; it refuses other targets."""
    from speculum.engine.loading import load_decoder
    from speculum.errors import SpeculumError

    target, assistant = gemma4_models["aligned"]
    decoder = load_decoder(target, assistant, LoadOptions(n_ctx=256, n_threads=1))
    try:
        assert decoder.draft is None and decoder.target.n_nextn == 0 and decoder.target.has_mtp
        assert decoder.target.facts.assistant == "Speculum Gemma 4 assistant test"  # the status bar names it
        head = decoder.drafters[Source.MTP].head
        assert head.shares_target_cache and head.n_layers == 2 and not head.chained
        assert decoder.drafters[Source.MTP].max_k is None
    finally:
        decoder.target.close()
    with LlamaModel(target, LoadOptions(n_ctx=256, n_threads=1)) as gemma:
        # Making the assistant's context empties the target's cache (llama.cpp resizes the
        # cells they share): the model starts over rather than believe it still holds them.
        gemma.prefill([1, 2, 3, 4])
        gemma.attach_assistant(assistant)
        assert gemma.n_past == 0 and llama_ext_pos_max(gemma) == -1
        assert gemma.open_mtp_head() is gemma.open_mtp_head()  # one context: another would empty it again
    with LlamaModel(mtp_models["aligned"], LoadOptions(n_ctx=256, n_threads=1)) as glm:
        with pytest.raises(SpeculumError, match="drafts for Gemma 4 targets"):
            glm.attach_assistant(assistant)
    with LlamaModel(target, LoadOptions(n_ctx=256, n_threads=1)) as gemma:
        with pytest.raises(SpeculumError, match="is not a Gemma 4 assistant"):
            gemma.attach_assistant(target)


def llama_ext_pos_max(model) -> int:
    """The last position llama.cpp itself holds in the model's cache (-1: empty)."""
    from speculum.engine.llama.native import lc
    return lc.llama_memory_seq_pos_max(model._mem, 0)


def test_gemma4_aligned_assistant_is_accepted_and_cycles_record_it(gemma4_models):
    with gemma4_target(gemma4_models["aligned"]) as model:
        _, _, cycles = check_aligned_head(model, positions=4, min_drafted=30)
        assert all(c.source == Source.MTP for c in cycles if c.drafted)


def test_gemma4_assistant_is_fed_as_llama_cpp_feeds_it(gemma4_models):
    """Every step of the assistant sits at the pending token's position and reads the target's
    cache of the context before it: first (pending token, the target's last hidden state),
    then (each drafted token, the assistant's own last hidden state). Each q row equals a fresh
    assistant's on a fresh target given just that, and not with another hidden state (the
    target's one row earlier at the first step, the target's last one after it)."""
    pair = gemma4_models["noisy"]
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=0)
    from speculum.engine.drafting.draft import Choice
    with gemma4_target(pair) as model:
        decoder = Decoder(model)
        prompt = prompt_of(model)
        out, _ = generate(decoder, prompt, max_tokens=10, policy="mtp", k=3)
        more, _ = generate(decoder, prompt + out, max_tokens=6, policy="lookup", k=3)
        context = prompt + out + more
        draft = decoder.drafters[Source.MTP].propose(context, 3, Choice(Source.MTP, 3), sampling,
                                                      np.random.default_rng(0))
        assert len(draft.tokens) == 3
    with gemma4_target(pair) as ref:
        rows = []
        ref.listen_to_decodes(lambda tokens, pos, hidden: rows.append(np.array(hidden)))
        ref.prefill(context[:-1])
        head = ref.open_mtp_head()
        pos0 = len(context) - 1
        target_hidden = np.concatenate(rows)
        token, hidden, wrong = context[-1], target_hidden[-1], target_hidden[-2]
        for step in range(3):
            logits, h = head.decode([token], hidden[None, :], pos0, logits=True)
            q = distribution(logits, sampling)
            off = np.abs(draft.q[step] - q).sum()
            assert np.abs(draft.q[step] - q).max() < 1e-3, step
            other, _ = head.decode([token], wrong[None, :], pos0, logits=True)
            assert np.abs(draft.q[step] - distribution(other, sampling)).sum() > 100 * off, step
            token, hidden, wrong = draft.tokens[step], h, target_hidden[-1]


def test_generate_with_a_gemma4_assistant_on_the_cli(gemma4_models, mtp_models):
    target, assistant = gemma4_models["aligned"]
    pair = speculum("models", "check", target, assistant)
    assert pair.returncode == 0 and "the target's Gemma 4 assistant" in pair.stdout, pair.stdout
    alone = speculum("models", "check", assistant)  # its NextN layers draft for another model
    assert alone.returncode == 1 and "is a Gemma 4 assistant: it drafts for a gemma4 target" in alone.stdout
    wrong = speculum("models", "check", mtp_models["aligned"], assistant)
    assert wrong.returncode == 1 and "drafts only for a gemma4 target" in wrong.stdout
    draft_mode = speculum("generate", "--target", target, "--draft", assistant, "--mode", "draft", "--threads", "1",
                          "--max-tokens", "4", "hi")
    assert draft_mode.returncode == 2
    assert draft_mode.stderr.strip() == (f"speculum: {assistant.name} is a Gemma 4 assistant: it drafts in MTP mode "
                                         "(--mode mtp), on the target's own KV cache, not as a draft model.")
    proc = speculum("generate", "--target", target, "--draft", assistant, "--mode", "mtp", "-k", "3", "--fixed-k",
                    "--threads", "1", "--max-tokens", "16", "--json", "hi")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert any(c.get("source") == "mtp" and c["drafted"] for c in lines[:-1])
    assert lines[-1]["acceptance_rate"] >= 0.9
