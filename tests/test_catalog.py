"""The catalog of matched pairs (resources/catalog.json) and the fit to the machine."""

from __future__ import annotations

import dataclasses
import json

import pytest

from speculum.errors import SpeculumError
from speculum.models import bundled, catalog, hardware
from speculum.models.hardware import Fit, Machine

PAIRS = catalog.load()
GB = 1e9
MTP_PAIRS = [p for p in PAIRS if p.mtp]


@pytest.mark.parametrize("pair", PAIRS, ids=[p.id for p in PAIRS])
def test_every_catalog_entry_is_valid(pair):
    assert catalog.validate(pair) == []
    # every file named, with sizes; the pair's family shows in every name
    for model in pair.models:
        assert model.repo.count("/") == 1 and model.files
        assert all(f.path.endswith(".gguf") and f.size > 1e8 for f in model.files)
        assert model.quantization and model.params_b > 0
    if pair.mtp:
        assert pair.models == (pair.target,) and pair.download_size == pair.target.size
        assert pair.source and pair.memory_note  # where the figures come from, how memory was estimated
    else:
        assert pair.target.params_b > pair.draft.params_b
    assert pair.memory_gb * GB >= pair.download_size
    assert pair.summary and set(pair.good_at) <= set(catalog.USES)


def test_catalog_spans_families_and_machine_sizes():
    assert len(PAIRS) >= 7  # six pairs plus the offline demo
    assert len({p.id for p in PAIRS}) == len(PAIRS)
    assert {p.family for p in PAIRS} == {"qwen2", "qwen3", "llama3", "gemma3", "qwen35"}
    assert any(p.target.repo.startswith("Qwen/Qwen2.5-Coder") for p in PAIRS)  # Qwen2.5-Coder and Qwen2.5
    assert any(p.target.repo.startswith("Qwen/Qwen2.5-7B") for p in PAIRS)
    sizes = sorted(p.download_size for p in PAIRS)
    assert sizes[0] <= 2 * GB  # a laptop pair
    assert sizes[-1] >= 20 * GB  # a workstation pair
    assert {u for p in PAIRS for u in p.good_at} == {"code", "chat", "documents"}


def test_offline_demo_pair_is_the_bundled_qwen_coder_pair():
    [demo] = [p for p in PAIRS if p.offline]
    assert demo.offline == "demo"
    for model, bundled_model in zip((demo.target, demo.draft), bundled.DEMO_PAIR):
        [f] = model.files
        assert (f.filename, f.size, f.sha256) == (bundled_model.filename, bundled_model.size, bundled_model.sha256)


def test_sharded_entries_list_every_shard_in_order():
    split = [m for p in PAIRS for m in p.models if len(m.files) > 1]
    assert split, "the catalog should exercise a gguf-split model"
    for model in split:
        names = [f.filename for f in model.files]
        assert names == catalog.shard_names(names[-1])


def test_shard_names():
    assert catalog.shard_names("m-Q4_K_M-00002-of-00003.gguf") == [
        "m-Q4_K_M-00001-of-00003.gguf", "m-Q4_K_M-00002-of-00003.gguf", "m-Q4_K_M-00003-of-00003.gguf"]
    assert catalog.shard_names("m-Q4_K_M.gguf") is None


def test_validation_names_what_is_wrong():
    good = PAIRS[1]
    bad = dataclasses.replace(good, family="gemma3", good_at=("poetry",), memory_gb=0.1,
                              draft=dataclasses.replace(good.draft, files=()))
    problems = " | ".join(catalog.validate(bad))
    assert "does not look like a gemma3 model" in problems
    assert "good_at" in problems and "memory_gb" in problems and "draft names no file" in problems
    shard = catalog.CatalogFile("x-00001-of-00002.gguf", 10, None)
    half = dataclasses.replace(good, target=dataclasses.replace(good.target, files=(shard,)))
    assert any("does not list all shards" in p for p in catalog.validate(half))


def test_catalog_has_targets_that_draft_for_themselves_across_sizes():
    assert len(MTP_PAIRS) >= 3
    assert {p.family for p in MTP_PAIRS} <= set(catalog.MTP_FAMILIES)
    sizes = sorted(p.download_size for p in MTP_PAIRS)
    assert sizes[0] < 4 * GB and sizes[-1] > 12 * GB  # a laptop model and a 27B
    # the 27B is a hybrid: its estimate is far below what a KV cache on all 64 layers would need and says so
    [iq3] = [p for p in MTP_PAIRS if p.id == "qwen3.6-27b-mtp"]
    assert "16 of its 64 layers" in iq3.memory_note and iq3.memory_gb * GB > iq3.download_size + 2 * GB


def _mtp_raw(**changes) -> dict:
    raw = {"id": "x-mtp", "name": "X (MTP)", "family": "qwen35", "good_at": ["chat"], "memory_gb": 20.0,
           "source": "https://huggingface.co/org/Qwen3.6-27B-MTP-GGUF/tree/main",
           "target": {"name": "Qwen3.6-27B", "repo": "org/Qwen3.6-27B-MTP-GGUF", "quantization": "Q4_K_M",
                      "params_b": 27.3, "files": [{"path": "Qwen3.6-27B-Q4_K_M.gguf", "size": 16_800_000_000}]},
           "draft": "mtp"}
    raw.update(changes)
    return raw


def _load_one(tmp_path, raw: dict) -> catalog.CatalogPair:
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"version": 1, "pairs": [raw]}))
    [pair] = catalog.load(path)
    return pair


def test_an_mtp_entry_is_one_target_and_no_draft(tmp_path):
    pair = _load_one(tmp_path, _mtp_raw())
    assert pair.mtp and pair.draft is None and pair.models == (pair.target,)
    assert pair.download_size == 16_800_000_000
    assert catalog.validate(pair) == []


def test_validate_rejects_malformed_mtp_entries(tmp_path):
    def problems(**changes) -> str:
        return " | ".join(catalog.validate(_load_one(tmp_path, _mtp_raw(**changes))))

    # a family none of whose architectures carries NextN layers in llama.cpp
    assert "needs a family whose models carry NextN layers" in problems(
        family="llama3", target=dict(_mtp_raw()["target"], repo="org/Llama-3.1-8B-GGUF",
                                     files=[{"path": "Llama-3.1-8B-Q4_K_M.gguf", "size": 5 * 10**9}]))
    assert "cannot be one" in problems(offline="demo")  # the offline pairs are assembled with a draft file
    assert "names the page" in problems(source=None)
    assert "not a web address" in problems(source="my notes")
    assert "memory_gb is less than the weights" in problems(memory_gb=10.0)
    assert "target names no file" in problems(target=dict(_mtp_raw()["target"], files=[]))
    with pytest.raises(SpeculumError, match="neither a model nor 'mtp'"):
        _load_one(tmp_path, _mtp_raw(draft="MTP-head"))
    with pytest.raises(SpeculumError, match="damaged"):
        _load_one(tmp_path, _mtp_raw(draft=None))  # a missing draft is damage, never a silent MTP entry


def test_damaged_catalog_is_a_plain_error(tmp_path):
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"pairs": [{"id": "x"}]}))
    with pytest.raises(SpeculumError, match="damaged"):
        catalog.load(path)
    with pytest.raises(SpeculumError, match="There is no pair 'nope'"):
        catalog.find("nope", PAIRS)


# ---- fit to the machine -------------------------------------------------------------------------------


def by_id(pair_id):
    return catalog.find(pair_id, PAIRS)


def test_fit_marks_on_a_small_cpu_laptop():
    laptop = Machine(ram_bytes=int(8 * GB))
    assert hardware.fit(by_id("qwen2.5-coder-1.5b"), laptop) is Fit.FITS
    assert hardware.fit(by_id("qwen3-8b"), laptop) is Fit.TOO_BIG  # 7 GB of an 8 GB machine
    assert hardware.fit(by_id("llama3.2-3b"), laptop) is Fit.FITS
    assert hardware.recommend(PAIRS, laptop).id == "llama3.2-3b"
    assert hardware.recommend(PAIRS, laptop, use="code").id == "qwen2.5-coder-1.5b"


def test_fit_on_a_gpu_uses_vram_and_spills_to_ram():
    gpu = Machine(ram_bytes=int(32 * GB), gpu_name="RTX 4090", vram_bytes=int(24 * GB))
    assert hardware.fit(by_id("gemma3-12b"), gpu) is Fit.FITS
    assert hardware.fit(by_id("qwen3-32b"), gpu) is Fit.TIGHT  # 24.5 GB: a few layers on the CPU
    assert hardware.fit(by_id("llama3.3-70b"), gpu) is Fit.TOO_BIG
    # the most capable pair that fits 24 GB: the 27B that drafts for itself (19 GB with its snapshots)
    assert hardware.fit(by_id("qwen3.6-27b-mtp-iq4"), gpu) is Fit.FITS
    assert hardware.recommend(PAIRS, gpu).id == "gemma3-12b"  # not a community MTP upload we never loaded
    sixteen = dataclasses.replace(gpu, vram_bytes=int(16 * GB))
    assert hardware.fit(by_id("qwen3.6-27b-mtp"), sixteen) is Fit.TIGHT  # 17 GB: not all on a 16 GB card


def test_fit_on_apple_silicon_unified_memory():
    mac = Machine(ram_bytes=int(64 * GB), gpu_name="Apple M2 Max", vram_bytes=int(64 * GB), unified=True)
    assert hardware.fit(by_id("qwen3-32b"), mac) is Fit.FITS
    assert hardware.fit(by_id("llama3.3-70b"), mac) is Fit.TIGHT
    assert hardware.recommend(PAIRS, mac).id == "qwen3-32b"
    big_mac = dataclasses.replace(mac, ram_bytes=int(128 * GB), vram_bytes=int(128 * GB))
    assert hardware.recommend(PAIRS, big_mac).id == "llama3.3-70b"


def test_cpu_only_machines_get_a_pair_they_can_run_quickly():
    server = Machine(ram_bytes=int(256 * GB))  # everything fits, but a 70B on a CPU is too slow
    assert hardware.fit(by_id("llama3.3-70b"), server) is Fit.FITS
    assert hardware.recommend(PAIRS, server).memory_bytes <= hardware.CPU_RECOMMEND_LIMIT


def test_too_small_for_everything_still_suggests_the_smallest():
    tiny = Machine(ram_bytes=int(3 * GB))
    assert all(hardware.fit(p, tiny) is not Fit.FITS for p in PAIRS)
    assert hardware.recommend(PAIRS, tiny).id == "qwen2.5-coder-1.5b"


def test_detect_reads_this_machine():
    machine = hardware.detect()
    assert machine.ram_bytes > 1 * GB
    assert "GB RAM" in machine.describe()
