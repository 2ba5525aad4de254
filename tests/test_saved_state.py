"""Saved files of the wrong shape: kept where valid, set aside as .bad, never a crash.

Each case writes a real file as another version, a crash or a hand edit could leave it,
then reads it the way the app does at start.
"""

from __future__ import annotations

import json

import pytest

from speculum import paths
from speculum.conversations import Conversation, ConversationStore, Message
from speculum.engine.cycle import Cycle
from speculum.models.library import Library
from speculum.ui.settings import Settings

CYCLE = Cycle(index=0, source="model", k=2, drafted=[5, 6], drafted_text=["a", "b"], n_accepted=1,
              emitted=[5, 7], emitted_text=["a", "c"], text="ac").to_json()


@pytest.fixture(autouse=True)
def fresh_notices():
    paths.set_aside_notices.clear()
    yield
    paths.set_aside_notices.clear()


def write(path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj), encoding="utf-8")


# --- settings ------------------------------------------------------------------------------------

def test_settings_that_are_a_list_are_set_aside(data_dirs):
    write(Settings.path(), [1, 2])
    assert Settings.load() == Settings()
    assert Settings.path().with_name("settings.json.bad").exists() and not Settings.path().exists()
    assert paths.set_aside_notices and "settings.json" in paths.set_aside_notices[0]


def test_a_setting_of_the_wrong_type_takes_its_default_and_the_rest_is_kept(data_dirs):
    write(Settings.path(), {"max_tokens": "512", "temperature": 0.5, "plain_tokens_per_s": {"a": "x"},
                            "top_p": 0.9, "n_ctx": True})
    settings = Settings.load()
    assert settings.max_tokens == Settings().max_tokens and isinstance(settings.max_tokens, int)
    assert settings.n_ctx == Settings().n_ctx  # true/false is not a number of tokens
    assert settings.plain_tokens_per_s == {}
    assert settings.temperature == 0.5 and settings.top_p == 0.9
    assert json.loads(Settings.path().with_name("settings.json.bad").read_text())["max_tokens"] == "512"
    assert "max_tokens" in paths.set_aside_notices[0]


# --- conversations -------------------------------------------------------------------------------

def test_damaged_conversations_keep_what_is_valid(data_dirs):
    store = ConversationStore()
    good = Conversation(title="Good", messages=[Message("user", "hi"), Message("assistant", "yo", cycles=[CYCLE])])
    store.save(good)
    write(store.folder / "alist.json", [{"role": "user"}])
    write(store.folder / "mixed.json", {"id": "mixed", "title": "Mixed", "updated": "yesterday",
                                         "messages": [7, "text", {"role": "user", "content": "kept"},
                                                      {"role": "robot"}]})
    old_cycle = {k: v for k, v in CYCLE.items() if k not in ("text", "p_drafted", "draft_confidence")}
    write(store.folder / "older.json", {"id": "older", "title": "Older",
                                         "messages": [{"role": "assistant", "content": "x", "cycles": [old_cycle]}]})
    write(store.folder / "broken.json", {"id": "broken", "messages": [
        {"role": "assistant", "content": "answer text stays", "cycles": [dict(CYCLE, n_accepted="1")],
         "stats": {"tokens_per_s": "fast"}}]})

    found = {c.id: c for c in store.load_all()}

    assert set(found) == {good.id, "mixed", "older", "broken"}
    assert found[good.id].messages[1].cycles == [CYCLE]
    assert [m.content for m in found["mixed"].messages] == ["kept"]
    assert isinstance(found["mixed"].updated, float)
    # A cycle from an older version, missing fields, still replays: the missing ones are empty.
    assert Cycle.from_json(found["older"].messages[0].cycles[0]).text == ""
    broken = found["broken"].messages[0]
    assert broken.content == "answer text stays" and broken.cycles == [] and broken.stats == {}
    assert (store.folder / "alist.json.bad").exists() and not (store.folder / "alist.json").exists()
    for name in ("mixed", "broken"):
        assert (store.folder / f"{name}.json.bad").exists()  # the original, for the curious
    assert not (store.folder / "older.json.bad").exists()  # nothing was wrong with it
    said = "\n".join(paths.set_aside_notices)
    assert "alist.json" in said and "mixed.json" in said and "broken.json" in said
    # Reported once: the cleaned files read back clean.
    paths.set_aside_notices.clear()
    assert len(store.load_all()) == 4 and paths.set_aside_notices == []


def test_each_save_writes_the_conversation_as_it_is_now(data_dirs):
    # Saving reuses an answer's encoded cycle records: a changed answer must not be saved as it was.
    store = ConversationStore()
    answer = Message("assistant", "yo", cycles=[CYCLE])
    conv = Conversation(title="T", messages=[Message("user", "hi"), answer])
    store.save(conv)
    answer.note = "stopped"
    answer.cycles = [CYCLE, {**CYCLE, "index": 1}]  # a new list
    conv.messages.append(Message("user", "more"))
    store.save(conv)
    saved = json.loads((store.folder / f"{conv.id}.json").read_text())
    assert saved == {**saved, "id": conv.id, "title": "T"}
    assert [m["content"] for m in saved["messages"]] == ["hi", "yo", "more"]
    assert saved["messages"][1]["note"] == "stopped" and [c["index"] for c in saved["messages"][1]["cycles"]] == [0, 1]
    answer.cycles.append({**CYCLE, "index": 2})  # the same list, grown
    store.save(conv)
    (loaded,) = store.load_all()
    assert [c["index"] for c in loaded.messages[1].cycles] == [0, 1, 2] and loaded.messages[1].note == "stopped"
    assert not paths.set_aside_notices


def test_a_conversation_id_is_never_a_path(data_dirs):
    store = ConversationStore()
    settings = data_dirs / "config" / "settings.json"
    write(settings, {"max_tokens": 64})
    for bad in ("../../config/settings", "..", "a/b", "a\\b", "", "/etc/passwd"):
        with pytest.raises(ValueError):
            store.save(Conversation(id=bad, messages=[Message("user", "x")]))
        with pytest.raises(ValueError):
            store.delete(bad)
    assert json.loads(settings.read_text()) == {"max_tokens": 64}
    # A file whose stored id points outside is read under its own file name.
    write(store.folder / "evil.json", {"id": "../../config/settings", "messages": [{"role": "user", "content": "q"}]})
    (conversation,) = store.load_all()
    assert conversation.id == "evil"
    store.delete(conversation.id)
    assert settings.exists() and not (store.folder / "evil.json").exists()


def test_cycle_from_json_tolerates_missing_fields_and_refuses_wrong_types():
    assert Cycle.from_json({}).drafted == []
    assert Cycle.from_json({"index": 3, "future_field": [1]}).index == 3
    # An empty stored policy dict is no policy report.
    assert Cycle.from_json(CYCLE) == Cycle(**{k: (None if k == "policy" else v) for k, v in CYCLE.items()
                                              if k != "rejected"})
    for bad in ([], dict(CYCLE, drafted="56"), dict(CYCLE, n_accepted=3), dict(CYCLE, verify_s=float("inf")),
                dict(CYCLE, emitted_text=[1]), dict(CYCLE, n_accepted=True), dict(CYCLE, policy=[])):
        with pytest.raises(ValueError):
            Cycle.from_json(bad)


# --- the model library ---------------------------------------------------------------------------

@pytest.mark.parametrize("state, kept", [
    ([{"id": "a"}], 0),
    ({"pairs": None, "models": None}, 0),
    ({"pairs": [{"id": "p", "draft": "d.gguf"}, {"id": "q", "target": "t.gguf", "draft": "d.gguf", "name": 5},
                "x"], "models": [{"path": 3}, {"path": "m.gguf"}]}, 2),
])
def test_library_state_of_the_wrong_shape_keeps_what_is_valid(tmp_path, state, kept):
    library = Library(tmp_path / "models", pairs=[])
    write(library.state_path, state)
    (tmp_path / "models" / "t.gguf").write_bytes(b"x")
    (tmp_path / "models" / "d.gguf").write_bytes(b"x")

    pairs, models = library.pairs(), library.models()  # neither raises

    assert paths.set_aside_notices and "library.json" in paths.set_aside_notices[0]
    assert library.state_path.with_name("library.json.bad").exists()
    if kept:
        assert [p.id for p in pairs] == ["q"] and pairs[0].name == "q"
        state = json.loads(library.state_path.read_text())
        assert [e["path"] for e in state["models"]] == ["m.gguf"]
    assert {m.path.name for m in models} == {"t.gguf", "d.gguf"}
    paths.set_aside_notices.clear()
    library.check_state()
    assert paths.set_aside_notices == []  # said once
