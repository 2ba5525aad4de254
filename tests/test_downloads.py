"""Downloads and the local library, against a local Hub (tests/hubserver.py) and the real huggingface_hub."""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from hubserver import HubServer, closed_port_url, make_gguf, point_hub
from speculum.cli import main
from speculum.errors import SpeculumError
from speculum.models import catalog
from speculum.models.download import (
    STAGING, CancelToken, DownloadCancelled, DownloadPaused, FileRequest, _disk_error, download, read_stamp,
)
from speculum.models.library import IncompatiblePair, Library
from speculum.models.remote import HubRef

MiB = 1 << 20
Usage = namedtuple("Usage", "total used free")


def _entry(repo: str, path: str, data: bytes) -> dict:
    return {"name": repo.split("/")[1], "repo": repo, "quantization": "Q4_K_M", "params_b": len(data) / 1e9,
            "files": [{"path": path, "size": len(data), "sha256": None}]}


def serve_pair(hub: HubServer, tmp_path: Path, target: bytes, draft: bytes, pair_id: str = "test-pair"):
    """Put a target and a draft on the local Hub and return a catalog entry naming them."""
    hub.add_bytes("test-org/Target-GGUF", "target-Q4_K_M.gguf", target)
    hub.add_bytes("test-org/Draft-GGUF", "draft-Q4_K_M.gguf", draft)
    raw = {"version": 1, "pairs": [{
        "id": pair_id, "name": "Test pair", "family": "qwen2", "good_at": ["code"], "memory_gb": 1.0,
        "target": _entry("test-org/Target-GGUF", "target-Q4_K_M.gguf", target),
        "draft": _entry("test-org/Draft-GGUF", "draft-Q4_K_M.gguf", draft)}]}
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(raw))
    return catalog.load(path)[0]


def gguf_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.gguf") if STAGING not in p.parts)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "models"


# ---- transport ---------------------------------------------------------------------------------


def test_pair_downloads_with_progress_into_the_library(hub, tmp_path, root):
    target, draft = make_gguf(6 * MiB, 1, "target"), make_gguf(3 * MiB, 2, "draft")
    pair = serve_pair(hub, tmp_path, target, draft)
    events = []
    library = Library(root, pairs=[pair])
    installed = library.install(pair, progress=events.append)

    assert installed.target.path == root / "test-org--Target-GGUF" / "target-Q4_K_M.gguf"
    assert installed.draft.path == root / "test-org--Draft-GGUF" / "draft-Q4_K_M.gguf"
    assert installed.target.path.read_bytes() == target and installed.draft.path.read_bytes() == draft
    assert read_stamp(installed.target.path)["sha256"] == sha(target)
    # total progress only grows and ends at the size of both files; each file reaches 100%
    totals = [e.done for e in events]
    assert totals == sorted(totals) and totals[-1] == events[-1].total == len(target) + len(draft)
    assert len(events) >= 8  # about one event per MiB, not just start and end
    for index, size in ((1, len(target)), (2, len(draft))):
        mine = [e for e in events if e.file_index == index]
        assert mine[-1].file_done == mine[-1].file_total == size and mine[-1].phase == "done"
        assert {e.file_count for e in mine} == {2}
    assert any(e.speed > 0 for e in events) and events[-1].eta == 0
    # the Hub saw one HEAD per file on its own port, and the bytes came from the "CDN"
    assert [r.method for r in hub.requests(port="hub") if "/resolve/" in r.path] == ["HEAD", "HEAD"]
    assert [r.status for r in hub.requests("GET", "cdn")] == [200, 200]
    # the pair is now in the library, and nothing is left half-way
    assert [p.id for p in library.pairs()] == ["test-pair"]
    assert not any(root.rglob("*.part"))


def test_dropped_connection_resumes_where_it_stopped(hub, root):
    data = make_gguf(8 * MiB, 3)
    blob = hub.add_bytes("test-org/Flaky-GGUF", "flaky.gguf", data)
    hub.drop_after[blob.sha256] = 3_000_000

    [path] = download([FileRequest(HubRef("test-org/Flaky-GGUF", "flaky.gguf"))], root)

    assert path.read_bytes() == data
    gets = hub.requests("GET", "cdn")
    assert len(gets) == 2
    assert gets[0].range is None and gets[0].sent == 3_000_000
    resumed_at = int(gets[1].range.removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 3_000_000  # continues from the bytes it kept, not from zero
    assert gets[1].status == 206 and gets[1].sent == len(data) - resumed_at


def test_restart_resumes_the_partial_file(hub, root):
    data = make_gguf(8 * MiB, 4)
    blob = hub.add_bytes("test-org/Big-GGUF", "big.gguf", data)
    request = [FileRequest(HubRef("test-org/Big-GGUF", "big.gguf"))]
    token = CancelToken()

    def stop_half_way(p):
        if p.file_done >= 3 * MiB:
            token.pause()  # as if the app were closed mid-download

    with pytest.raises(DownloadPaused, match="resume"):
        download(request, root, progress=stop_half_way, cancel=token)
    [part] = list((root / STAGING).rglob("*.part"))
    kept = part.stat().st_size
    assert 3 * MiB <= kept < len(data)
    assert gguf_files(root) == []  # not in the library yet

    [path] = download(request, root)  # a fresh run, as after a restart

    assert path.read_bytes() == data
    # the second run asked only for the missing tail, and got only that
    last = hub.requests("GET", "cdn")[-1]
    assert last.range == f"bytes={kept}-" and last.sent == len(data) - kept
    assert len(hub.requests("GET", "cdn")) == 2 and hub.blob(blob.sha256) is blob


def test_hub_outage_keeps_the_partial_and_the_next_run_resumes(hub, root):
    data = make_gguf(6 * MiB, 5)
    blob = hub.add_bytes("test-org/Outage-GGUF", "outage.gguf", data)
    hub.drop_after[blob.sha256] = 2 * MiB
    request = [FileRequest(HubRef("test-org/Outage-GGUF", "outage.gguf"))]

    def go_down(p):
        if p.file_done >= 1 * MiB:
            hub.outage = True

    with pytest.raises(SpeculumError, match="server problem.*resumes"):
        download(request, root, progress=go_down)
    assert any(r.status == 503 for r in hub.requests("GET", "cdn"))
    kept = next((root / STAGING).rglob("*.part")).stat().st_size
    assert kept > 0

    hub.outage = False
    [path] = download(request, root)
    assert path.read_bytes() == data
    assert hub.requests("GET", "cdn")[-1].range == f"bytes={kept}-"


def test_corrupted_file_is_caught_by_the_hash_and_not_added(hub, tmp_path, root):
    target, draft = make_gguf(4 * MiB, 6), make_gguf(2 * MiB, 7)
    pair = serve_pair(hub, tmp_path, target, draft)
    hub.corrupt.add(sha(target))
    library = Library(root, pairs=[pair])

    with pytest.raises(SpeculumError, match="failed its checksum") as err:
        library.install(pair)

    assert "nothing was added" in str(err.value)
    assert gguf_files(root) == [] and library.pairs() == []
    assert not list((root / STAGING).rglob("*.part"))  # the damaged bytes are gone too
    assert hub.requests("GET", "cdn")[-1].path.endswith(sha(target))  # the draft was not fetched


def test_cancel_leaves_nothing_half_added(hub, tmp_path, root):
    target, draft = make_gguf(4 * MiB, 8), make_gguf(4 * MiB, 9)
    pair = serve_pair(hub, tmp_path, target, draft)
    library = Library(root, pairs=[pair])
    token = CancelToken()

    def cancel_in_draft(p):
        if p.file_index == 2 and p.file_done >= 1 * MiB:
            token.cancel()  # the target is complete and verified, the draft is half-way

    with pytest.raises(DownloadCancelled, match="nothing was added"):
        library.install(pair, progress=cancel_in_draft, cancel=token)

    assert [p for p in root.rglob("*") if p.is_file()] == []
    assert library.pairs() == [] and library.models() == []


def test_not_enough_disk_space_refuses_before_starting(hub, tmp_path, root):
    target, draft = make_gguf(4 * MiB, 10), make_gguf(2 * MiB, 11)
    pair = serve_pair(hub, tmp_path, target, draft)
    seen = []

    def tiny_disk(path):
        seen.append(Path(path))
        return Usage(100 * MiB, 99 * MiB, 1 * MiB)

    with pytest.raises(SpeculumError, match=r"Not enough disk space .* needs 0\.01 GB more and only 0\.00 GB"):
        Library(root, pairs=[pair]).install(pair, disk_usage=tiny_disk)

    assert seen  # the check ran, on the library's disk
    assert hub.requests("GET", "cdn") == []  # refused before a single byte
    assert gguf_files(root) == []


def test_offline_mode_uses_what_is_on_disk(hub, tmp_path, root, monkeypatch):
    target, draft = make_gguf(2 * MiB, 12), make_gguf(1 * MiB, 13)
    pair = serve_pair(hub, tmp_path, target, draft)
    requests = [FileRequest(HubRef("test-org/Target-GGUF", "target-Q4_K_M.gguf")),
                FileRequest(HubRef("test-org/Draft-GGUF", "draft-Q4_K_M.gguf"))]
    online = download(requests, root)
    hub.stop()
    seen = len(hub.log)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    assert download(requests, root) == online
    installed = Library(root, pairs=[pair]).install(pair)  # found on disk, added without the Hub
    assert (installed.target.path, installed.draft.path) == tuple(online)

    hub.add_bytes("test-org/Other-GGUF", "other.gguf", make_gguf(1 * MiB, 14))
    with pytest.raises(SpeculumError, match=r"Offline mode is on \(HF_HUB_OFFLINE=1\).*other\.gguf"):
        download([FileRequest(HubRef("test-org/Other-GGUF", "other.gguf"))], root)
    assert len(hub.log) == seen  # not one request while offline


# ---- errors in plain words -------------------------------------------------------------------------


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


def test_repo_not_found(hub, capsys, monkeypatch, root):
    monkeypatch.setenv("SPECULUM_MODELS_DIR", str(root))
    err = _one_line_error(capsys, ["models", "add", "hf:nobody/no-such-model-GGUF/model.gguf"])
    assert err.startswith("speculum: The repository nobody/no-such-model-GGUF was not found on the Hub")


def test_file_not_found(hub, capsys, monkeypatch, root):
    monkeypatch.setenv("SPECULUM_MODELS_DIR", str(root))
    hub.add_bytes("test-org/Real-GGUF", "real.gguf", make_gguf(1 * MiB, 15))
    err = _one_line_error(capsys, ["models", "add", "hf:test-org/Real-GGUF/missing-Q4_K_M.gguf"])
    assert "missing-Q4_K_M.gguf was not found in the repository test-org/Real-GGUF" in err


def test_gated_repo_asks_to_accept_the_licence_and_works_with_a_token(hub, capsys, monkeypatch, root):
    monkeypatch.setenv("SPECULUM_MODELS_DIR", str(root))
    data = make_gguf(1 * MiB, 16)
    hub.add_bytes("gated-org/Gated-GGUF", "gated.gguf", data)
    hub.gated.add("gated-org/Gated-GGUF")
    hub.tokens.add("hf_accepted")

    err = _one_line_error(capsys, ["models", "add", "hf:gated-org/Gated-GGUF/gated.gguf"])
    assert "gated-org/Gated-GGUF is a gated repository" in err
    assert f"open {hub.url}/gated-org/Gated-GGUF and accept its licence" in err and "HF_TOKEN" in err

    monkeypatch.setenv("HF_TOKEN", "hf_accepted")
    assert main(["models", "add", "hf:gated-org/Gated-GGUF/gated.gguf"]) == 0
    assert (root / "gated-org--Gated-GGUF" / "gated.gguf").read_bytes() == data
    heads = [r for r in hub.requests("HEAD", "hub") if r.path.endswith("gated.gguf")]
    assert heads[-1].authorization == "Bearer hf_accepted"  # HF_TOKEN reaches the Hub...
    assert all(r.authorization is None for r in hub.requests("GET", "cdn"))  # ...but never the CDN


def test_no_network(monkeypatch, capsys, root):
    point_hub(monkeypatch, closed_port_url())
    monkeypatch.setenv("SPECULUM_MODELS_DIR", str(root))
    err = _one_line_error(capsys, ["models", "add", "hf:Qwen/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q8_0.gguf"])
    assert "Cannot reach the Hugging Face Hub at http://127.0.0.1:" in err and "no network" in err


def test_disk_full_mid_download_is_one_sentence(tmp_path):
    err = _disk_error(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    assert str(err).startswith(f"The disk holding {tmp_path} is full") and "resume" in str(err)


# ---- the CLI ------------------------------------------------------------------------------------------


def test_cli_download_a_catalog_pair_from_the_hub(hub, capsys, monkeypatch, root, smollm_path):
    """`speculum models download PAIR` end to end: real GGUF weights served under a catalog pair's names."""
    monkeypatch.setenv("SPECULUM_MODELS_DIR", str(root))
    pair = catalog.find("llama3.2-3b")
    smol_sha = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    for model in (pair.target, pair.draft):
        hub.add_file(model.repo, model.files[0].path, smollm_path, smol_sha)

    assert main(["models", "download", "llama3.2-3b"]) == 0
    out, err = capsys.readouterr()
    target = root / "bartowski--Llama-3.2-3B-Instruct-GGUF" / "Llama-3.2-3B-Instruct-Q4_K_M.gguf"
    assert str(target) in out
    assert "[2/2]" in err and "ETA" in err and "/s" in err  # per-file and total progress on stderr
    assert read_stamp(target)["sha256"] == smol_sha

    assert main(["models", "list"]) == 0
    listing = capsys.readouterr().out
    assert "pair  llama3.2-3b" in listing and "installed" in listing

    assert main(["models", "remove", "llama3.2-3b"]) == 0
    assert gguf_files(root) == []


# ---- targets that draft with their own MTP head ----------------------------------------------------------


def test_an_mtp_entry_downloads_only_its_target_and_is_a_pair_on_its_own(hub, capsys, monkeypatch, root):
    """`speculum models download` of a shipped "draft": "mtp" entry, its file served by the local Hub:
    one file comes down (the catalog's rounded size does not matter), and the library holds it
    as a complete pair whose draft is the target's own head."""
    monkeypatch.setenv("SPECULUM_MODELS_DIR", str(root))
    pair = catalog.find("qwen3.5-4b-mtp")
    data = make_gguf(3 * MiB, 50, "Qwen3.5-4B-MTP", nextn=1)
    [f] = pair.target.files
    hub.add_bytes(pair.target.repo, f.path, data)

    assert main(["models", "download", pair.id]) == 0
    out, err = capsys.readouterr()
    target = root / "localweights--Qwen3.5-4B-MTP-Q4_K_M-GGUF" / "Qwen3.5-4B-MTP-Q4_K_M.gguf"
    assert out.strip() == f"{pair.name}: {target} + built-in MTP"
    assert "[1/1]" in err and "[2/" not in err
    assert gguf_files(root) == [target] and target.read_bytes() == data
    assert {r.path.split("?")[0] for r in hub.requests(port="hub") if "/resolve/" in r.path} == {
        f"/{pair.target.repo}/resolve/main/{f.path}"}  # nothing asked for a draft

    state = json.loads((root / "library.json").read_text())
    assert [(e["id"], e["draft"]) for e in state["pairs"]] == [(pair.id, catalog.MTP)]
    [installed] = Library(root).pairs()
    assert installed.mtp and installed.draft is None and installed.target.path == target
    assert installed.size == len(data) and installed.catalog_id == pair.id
    assert Library(root).singles() == []  # the target belongs to its pair, not listed on its own

    assert main(["models", "list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    [entry] = [e for e in listing["catalog"] if e["id"] == pair.id]
    assert entry["installed"] and entry["drafts_with"] == "mtp" and entry["download_bytes"] == f.size
    assert entry["source"] == pair.source and entry["memory_note"] == pair.memory_note
    [mine] = listing["library"]["pairs"]
    assert (mine["target"], mine["draft"], mine["drafts_with"]) == (str(target), None, "mtp")
    assert main(["models", "list"]) == 0
    assert "Qwen3.5-4B-MTP-Q4_K_M.gguf + built-in MTP" in capsys.readouterr().out

    assert main(["models", "remove", pair.id]) == 0
    assert gguf_files(root) == [] and Library(root).pairs() == []


def test_an_mtp_entry_whose_file_has_no_nextn_layers_is_refused(hub, tmp_path, root):
    hub.add_bytes("test-org/Qwen3.6-27B-MTP-GGUF", "Qwen3.6-27B-Q4_K_M.gguf", make_gguf(2 * MiB, 51))
    raw = {"version": 1, "pairs": [{
        "id": "x-mtp", "name": "X (MTP)", "family": "qwen35", "good_at": ["chat"], "memory_gb": 1.0,
        "source": "https://example.org/x", "draft": "mtp",
        "target": _entry("test-org/Qwen3.6-27B-MTP-GGUF", "Qwen3.6-27B-Q4_K_M.gguf", b"x" * 2 * MiB)}]}
    (tmp_path / "catalog.json").write_text(json.dumps(raw))
    [pair] = catalog.load(tmp_path / "catalog.json")
    library = Library(root, pairs=[pair])
    with pytest.raises(IncompatiblePair, match="has no NextN \\(MTP\\) layers"):
        library.install(pair)
    assert library.pairs() == [] and library.installed(pair) is None


def test_a_local_target_with_nextn_layers_is_a_pair_without_a_draft(root, tmp_path):
    own = tmp_path / "mine.gguf"
    own.write_bytes(make_gguf(1 * MiB, 52, "Mine", nextn=1))
    library = Library(root, pairs=[])
    pair = library.add_pair(own, None)
    assert pair.mtp and pair.name == "mine (MTP)" and [p.id for p in Library(root, pairs=[]).pairs()] == [pair.id]
    plain = tmp_path / "plain.gguf"
    plain.write_bytes(make_gguf(1 * MiB, 53))
    with pytest.raises(IncompatiblePair, match="needs a draft"):
        library.add_pair(plain, None)
    assert library.remove(pair.id) == [] and own.exists()  # the user's file: forgotten, never deleted


# ---- the library ---------------------------------------------------------------------------------------


@pytest.fixture
def own_files(tmp_path) -> tuple[Path, Path]:
    """Two compatible GGUF files of the user's, outside the library folder."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "big.gguf").write_bytes(make_gguf(2 * MiB, 20))
    (folder / "small.gguf").write_bytes(make_gguf(1 * MiB, 21))
    return folder / "big.gguf", folder / "small.gguf"


def test_add_two_local_files_as_a_pair_and_remove_it(root, own_files):
    library = Library(root, pairs=[])
    pair = library.add_pair(*own_files, name="My pair")

    assert (pair.id, pair.name) == ("my-pair", "My pair")
    assert not pair.target.in_library  # the user's files stay where they are
    state = json.loads((root / "library.json").read_text())
    assert state["pairs"][0]["target"] == str(own_files[0])
    assert [p.id for p in Library(root, pairs=[]).pairs()] == ["my-pair"]

    deleted = library.remove("my-pair")
    assert deleted == [] and all(f.exists() for f in own_files)  # forgotten, never deleted
    assert library.pairs() == []


def test_incompatible_local_pair_is_refused(root, own_files, smollm_path):
    with pytest.raises(IncompatiblePair, match="tokenizer|vocabulary|BOS"):
        Library(root, pairs=[]).add_pair(own_files[0], smollm_path)


def test_library_lists_pairs_singles_and_disk_use(root, own_files):
    folder = root / "someone--Single-GGUF"
    folder.mkdir(parents=True)
    shards = [folder / f"single-Q4_K_M-0000{i}-of-00002.gguf" for i in (1, 2)]
    shards[0].write_bytes(make_gguf(1 * MiB, 30))
    shards[1].write_bytes(b"\0" * MiB)
    library = Library(root, pairs=[])
    library.add_pair(*own_files)

    [single] = library.singles()
    assert single.path == shards[0] and single.files == tuple(shards) and single.name == "single-Q4_K_M"
    assert single.size == 2 * MiB and single.in_library
    assert library.disk_use() == 2 * MiB  # only what lives in the library folder

    assert library.remove("single-Q4_K_M") == shards
    assert not folder.exists() and library.singles() == []


def test_cli_add_remote_pair_is_checked_before_downloading(hub, capsys, monkeypatch, root, smollm_path):
    monkeypatch.setenv("SPECULUM_MODELS_DIR", str(root))
    hub.add_bytes("test-org/Synth-GGUF", "synth.gguf", make_gguf(2 * MiB, 40))
    hub.add_file("test-org/Smol-GGUF", "smol.gguf", smollm_path,
                 "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")

    assert main(["models", "add", "hf:test-org/Synth-GGUF/synth.gguf", "hf:test-org/Smol-GGUF/smol.gguf"]) == 1
    assert "cannot speculate" in capsys.readouterr().out
    assert all(r.range for r in hub.requests("GET", "cdn"))  # only header ranges were read
    assert gguf_files(root) == []

    hub.add_bytes("test-org/Synth-draft-GGUF", "synth-draft.gguf", make_gguf(1 * MiB, 41))
    assert main(["models", "add", "hf:test-org/Synth-GGUF/synth.gguf",
                 "hf:test-org/Synth-draft-GGUF/synth-draft.gguf", "--name", "Synth"]) == 0
    assert "Added pair 'synth'" in capsys.readouterr().out
    assert [p.id for p in Library(root).pairs()] == ["synth"]


def test_sharded_model_downloads_every_shard(hub, root):
    first = make_gguf(2 * MiB, 50)
    hub.add_bytes("test-org/Split-GGUF", "Q4_K_M/split-Q4_K_M-00001-of-00002.gguf", first)
    hub.add_bytes("test-org/Split-GGUF", "Q4_K_M/split-Q4_K_M-00002-of-00002.gguf", b"\1" * MiB)

    model = Library(root).add_from_hub(HubRef("test-org/Split-GGUF", "Q4_K_M/split-Q4_K_M-00001-of-00002.gguf"))

    assert [f.name for f in model.files] == ["split-Q4_K_M-00001-of-00002.gguf", "split-Q4_K_M-00002-of-00002.gguf"]
    assert all(f.parent == root / "test-org--Split-GGUF" for f in model.files)
    assert model.size == 3 * MiB and model.source == "hf:test-org/Split-GGUF/Q4_K_M/split-Q4_K_M-00001-of-00002.gguf"


def test_shutil_disk_usage_is_the_default_probe(hub, root):
    # the real free-space probe runs (on the test machine's disk) and lets a small download through
    hub.add_bytes("test-org/Small-GGUF", "small.gguf", make_gguf(1 * MiB, 60))
    assert shutil.disk_usage(root.parent).free > 1 * MiB
    [path] = download([FileRequest(HubRef("test-org/Small-GGUF", "small.gguf"))], root)
    assert path.stat().st_size == 1 * MiB
