"""Hub names that lie or escape, concurrent downloads of one file, damaged download records,
and removing models: against the local Hub (tests/hubserver.py) and real files."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import speculum
from hubserver import make_gguf
from speculum import paths
from speculum.cli import main
from speculum.errors import SpeculumError
from speculum.models import catalog
from speculum.models.download import STAGING, CancelToken, DownloadPaused, FileRequest, download
from speculum.models.filelock import CancelRequested, FileLock
from speculum.models.library import Library
from speculum.models.remote import HubRef
from speculum.models.stamps import read_stamp, stamp_path

MiB = 1 << 20
APP = str(Path(speculum.__file__).parents[1])


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "models"


# ---- 3. Hub names that escape their repository or the models folder ------------------------------------


def test_a_link_climbing_out_of_its_repo_is_refused_before_any_request(hub, capsys, monkeypatch, root):
    monkeypatch.setenv("SPECULUM_MODELS_DIR", str(root))
    evil = make_gguf(1 * MiB, 99, "evil")
    hub.add_bytes("Qwen/Qwen3-8B-GGUF", "Qwen3-8B-Q4_K_M.gguf", make_gguf(1 * MiB, 98, "qwen"))
    hub.add_bytes("attacker/evil", "Qwen3-8B-Q4_K_M.gguf", evil)

    link = "hf:Qwen/Qwen3-8B-GGUF/../../../../attacker/evil/resolve/main/Qwen3-8B-Q4_K_M.gguf"
    assert main(["models", "add", link]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("speculum: Refusing the Hub file 'Qwen/Qwen3-8B-GGUF/../../../../attacker/evil/")
    assert "'..'" in err
    assert hub.log == [] and files_under(root) == []


BAD_REFS = {
    "parent folder": ("o/r", "../x.gguf", "main"),
    "dot folder": ("o/r", "a/./x.gguf", "main"),
    "empty part": ("o/r", "a//x.gguf", "main"),
    "absolute path": ("o/r", "/etc/x.gguf", "main"),
    "backslash": ("o/r", "a\\..\\x.gguf", "main"),
    "encoded backslash": ("o/r", "..%5C..%5Cx.gguf", "main"),
    "encoded dots": ("o/r", "%2e%2e/x.gguf", "main"),
    "drive letter": ("o/r", "D:\\x.gguf", "main"),
    "drive-relative": ("o/r", "D:x.gguf", "main"),
    "NUL byte": ("o/r", "x\0.gguf", "main"),
    "newline": ("o/r", "x\n.gguf", "main"),
    "Windows device": ("o/r", "sub/NUL.gguf", "main"),
    "trailing dot": ("o/r", "x.gguf.", "main"),
    "empty path": ("o/r", "", "main"),
    "repo climbing": ("../evil", "x.gguf", "main"),
    "repo of three parts": ("a/b/c", "x.gguf", "main"),
    "repo with a space": ("a b/c", "x.gguf", "main"),
    "repo folder collision": ("a--b/c", "x.gguf", "main"),
    "repo with a control char": ("o/r\x1b", "x.gguf", "main"),
    "revision climbing": ("o/r", "x.gguf", "../main"),
    "revision with a backslash": ("o/r", "x.gguf", "a\\b"),
    "revision with a newline": ("o/r", "x.gguf", "ma\nin"),
    "empty revision": ("o/r", "x.gguf", ""),
}


@pytest.mark.parametrize("case", BAD_REFS)
def test_unsafe_repo_path_or_revision_is_refused(case):
    repo, path, revision = BAD_REFS[case]
    with pytest.raises(SpeculumError, match="^Refusing the Hub file") as err:
        HubRef(repo, path, revision)
    assert "\n" not in str(err.value) and "\x1b" not in str(err.value) and "\0" not in str(err.value)


@pytest.mark.parametrize("link", [
    "hf:o/r/..%5C..%5Cx.gguf",
    "hf:o/r@../../x/x.gguf",
    "https://huggingface.co/o/r/resolve/main/..%5C..%5Cevil.gguf",
    "https://huggingface.co/o/r/resolve/main/D%3A%5Cevil.gguf",
    "https://huggingface.co/o/r/resolve/main/a/../../evil.gguf",
    "https://huggingface.co/o/..%2F..%2Fevil/resolve/main/x.gguf",
])
def test_unsafe_links_are_refused(link):
    with pytest.raises(SpeculumError, match="^Refusing the Hub file"):
        HubRef.parse(link)


def test_real_names_are_accepted():
    assert HubRef("bartowski/Llama-3.2-3B-Instruct-GGUF", "Llama-3.2-3B-Instruct-Q4_K_M.gguf")
    assert HubRef("unsloth/Qwen3-235B-A22B-GGUF", "Q4_K_M/Qwen3-235B-A22B-Q4_K_M-00001-of-00003.gguf", "refs/pr/1")
    assert HubRef.parse("hf:Qwen/Qwen2.5-Coder-7B-Instruct-GGUF@" + "a" * 40 + "/qwen2.5-coder-7b-q4_k_m.gguf")


def test_catalog_entries_with_unsafe_names_are_invalid(tmp_path):
    entry = _pair_entry("unsafe", ("test-org/Llama-3.1-8B-GGUF", "../../Llama-3.1-8B.gguf", b"x"),
                        ("test-org/Llama-3.2-1B-GGUF", "llama-3.2-1b.gguf", b""))
    (tmp_path / "catalog.json").write_text(json.dumps({"version": 1, "pairs": [entry]}))
    [pair] = catalog.load(tmp_path / "catalog.json")
    assert any("target file '../../Llama-3.1-8B.gguf' of 'test-org/Llama-3.1-8B-GGUF' is unsafe" in p
               for p in catalog.validate(pair))
    library = Library(tmp_path / "models", pairs=[pair])
    assert library.pairs() == []  # listed as not installed, without failing the whole list
    with pytest.raises(SpeculumError, match="^Refusing the Hub file"):
        library.install(pair)


def test_a_repo_folder_linked_outside_the_library_is_not_written(hub, root, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root.mkdir()
    (root / "test-org--Linked-GGUF").symlink_to(outside, target_is_directory=True)
    hub.add_bytes("test-org/Linked-GGUF", "linked.gguf", make_gguf(1 * MiB, 97))

    with pytest.raises(SpeculumError, match="Refusing to write .*linked.gguf: it lies outside"):
        download([FileRequest(HubRef("test-org/Linked-GGUF", "linked.gguf"))], root)
    assert files_under(outside) == [] and hub.requests("GET", "cdn") == []


def test_a_file_of_the_same_name_in_another_folder_is_not_taken_for_it(hub, root, monkeypatch):
    q4, q8 = make_gguf(2 * MiB, 1, "q4"), make_gguf(3 * MiB, 2, "q8")
    hub.add_bytes("test-org/Multi-GGUF", "Q4/model.gguf", q4)
    hub.add_bytes("test-org/Multi-GGUF", "Q8/model.gguf", q8)
    want_q4 = [FileRequest(HubRef("test-org/Multi-GGUF", "Q4/model.gguf"))]
    want_q8 = [FileRequest(HubRef("test-org/Multi-GGUF", "Q8/model.gguf"))]

    [p4] = download(want_q4, root)
    [p8] = download(want_q8, root)

    assert p4 != p8 and p4.read_bytes() == q4 and p8.read_bytes() == q8  # the Q4 file is not replaced either
    assert read_stamp(p8)["path"] == "Q8/model.gguf" and read_stamp(p4)["path"] == "Q4/model.gguf"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert download(want_q8, root) == [p8] and download(want_q4, root) == [p4]
    with pytest.raises(SpeculumError, match="Offline mode is on"):  # another revision is another file
        download([FileRequest(HubRef("test-org/Multi-GGUF", "Q4/model.gguf", "v2"))], root)


# ---- 4. two downloads of one file at once --------------------------------------------------------------


def _pair_entry(pair_id: str, target: tuple[str, str, bytes], draft: tuple[str, str, bytes]) -> dict:
    def model(repo, path, data):
        return {"name": repo.split("/")[1], "repo": repo, "quantization": "Q4_K_M", "params_b": len(data) / 1e9,
                "files": [{"path": path, "size": len(data), "sha256": None}]}
    return {"id": pair_id, "name": pair_id, "family": "llama3", "good_at": ["chat"], "memory_gb": 1.0,
            "target": model(*target), "draft": model(*draft)}


def test_two_pairs_sharing_a_draft_download_at_once(hub, tmp_path, root):
    draft = ("test-org/Llama-3.2-1B-GGUF", "llama-3.2-1b.gguf", make_gguf(6 * MiB, 10, "draft"))
    targets = [(f"test-org/Llama-3.1-{n}B-GGUF", f"llama-3.1-{n}b.gguf", make_gguf(1 * MiB, n, "target"))
               for n in (8, 70)]
    for repo, path, data in (draft, *targets):
        hub.add_bytes(repo, path, data)
    hub.delay = 0.004  # the draft takes ~0.4 s, so both downloads are inside it at once
    (tmp_path / "catalog.json").write_text(json.dumps(
        {"version": 1, "pairs": [_pair_entry(f"pair-{i}", t, draft) for i, t in enumerate(targets)]}))
    pairs = catalog.load(tmp_path / "catalog.json")
    library = Library(root, pairs=pairs)
    results, errors = {}, []

    def install(pair):
        try:
            results[pair.id] = library.install(pair)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=install, args=(p,)) for p in pairs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert errors == [] and sorted(results) == ["pair-0", "pair-1"]
    assert results["pair-0"].draft.path == results["pair-1"].draft.path
    assert results["pair-0"].draft.path.read_bytes() == draft[2]
    for i, (_repo, _path, data) in enumerate(targets):
        assert results[f"pair-{i}"].target.path.read_bytes() == data
    assert hub.bytes_sent(sha(draft[2])) == len(draft[2])  # fetched once, the second download reused it
    assert files_under(root / STAGING) == []  # no part, record or lock file left behind
    assert sorted(p.id for p in library.pairs()) == ["pair-0", "pair-1"]


CHILD = """
import sys
from pathlib import Path
from speculum.models.download import FileRequest, download
from speculum.models.remote import HubRef
print(download([FileRequest(HubRef(sys.argv[1], sys.argv[2]))], Path(sys.argv[3]))[0], flush=True)
"""


def test_a_download_in_another_process_is_waited_for_and_reused(hub, root, tmp_path):
    data = make_gguf(6 * MiB, 11, "shared")
    hub.add_bytes("test-org/Shared-GGUF", "shared.gguf", data)
    hub.delay = 0.01  # ~1 s for the whole file
    env = {**os.environ, "PYTHONPATH": APP, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"),
           "HF_TOKEN_PATH": str(tmp_path / "no-token")}
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(var, None)
    child = subprocess.Popen([sys.executable, "-c", CHILD, "test-org/Shared-GGUF", "shared.gguf", str(root)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # start ours once the other process is streaming the file
        deadline = 60
        while not any(r.sent for r in hub.requests("GET", "cdn")):
            assert child.poll() is None, child.communicate()
            threading.Event().wait(0.02)
            deadline -= 0.02
            assert deadline > 0
        [mine] = download([FileRequest(HubRef("test-org/Shared-GGUF", "shared.gguf"))], root)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, err
    assert Path(out.strip()) == mine and mine.read_bytes() == data
    assert hub.bytes_sent(sha(data)) == len(data)


def test_the_file_lock_holds_across_processes(tmp_path):
    lock_path = tmp_path / "x.gguf.part.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from speculum.models.filelock import "
         "FileLock; lock = FileLock(Path(sys.argv[1])); lock.acquire(); print('held', flush=True); "
         "sys.stdin.readline(); lock.release()", str(lock_path)],
        env={**os.environ, "PYTHONPATH": APP}, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        mine = FileLock(lock_path)
        assert not mine.acquire(blocking=False)
        token = CancelToken()
        token.cancel()
        with pytest.raises(CancelRequested):  # waiting gives way to a cancel
            FileLock(lock_path, token).acquire()
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(30) == 0
        assert mine.acquire(blocking=False)
        mine.release()
    finally:
        holder.kill()
    assert not lock_path.exists()  # the last holder cleans up


# ---- 5. damaged download records -----------------------------------------------------------------------


def _paused_download(hub, root, seed: int) -> tuple[bytes, list[FileRequest], Path]:
    data = make_gguf(6 * MiB, seed)
    hub.add_bytes("test-org/Paused-GGUF", "paused.gguf", data)
    request = [FileRequest(HubRef("test-org/Paused-GGUF", "paused.gguf"))]
    token = CancelToken()

    def stop_half_way(p):
        if p.file_done >= 2 * MiB:
            token.pause()

    with pytest.raises(DownloadPaused):
        download(request, root, progress=stop_half_way, cancel=token)
    [meta] = (root / STAGING).rglob("*.part.json")
    return data, request, meta


@pytest.mark.parametrize("record", ["[1, 2]", '"text"', '{"etag": 5, "size": "6 MB"}', "{not json"])
def test_a_partial_record_of_the_wrong_shape_starts_the_file_over(hub, root, record):
    data, request, meta = _paused_download(hub, root, 30)
    meta.write_text(record)
    notices = len(paths.set_aside_notices)

    [path] = download(request, root)

    assert path.read_bytes() == data
    assert hub.requests("GET", "cdn")[-1].range is None  # started over: these bytes had no valid record
    assert meta.with_name(meta.name + ".bad").read_text() == record
    assert len(paths.set_aside_notices) == notices + 1 and "paused.gguf.part.json" in paths.set_aside_notices[-1]


@pytest.mark.parametrize("stamp", ["[]", "null", '{"sha256": 7, "mtime_ns": "yesterday"}', "\xff\xfe"])
def test_a_stamp_of_the_wrong_shape_is_checked_again_not_trusted(hub, root, stamp):
    data = make_gguf(3 * MiB, 31)
    hub.add_bytes("test-org/Stamped-GGUF", "stamped.gguf", data)
    request = [FileRequest(HubRef("test-org/Stamped-GGUF", "stamped.gguf"))]
    [path] = download(request, root)
    stamp_path(path).write_text(stamp, encoding="latin-1")
    gets = len(hub.requests("GET", "cdn"))

    assert read_stamp(path) is None  # treated as absent, and kept aside
    assert stamp_path(path).with_name(stamp_path(path).name + ".bad").exists()
    assert download(request, root) == [path]  # the bytes on disk are hashed again, not fetched again
    assert len(hub.requests("GET", "cdn")) == gets
    assert read_stamp(path)["sha256"] == sha(data) and path.read_bytes() == data


def test_a_file_whose_bytes_differ_from_the_hub_is_not_reused(hub, root):
    data = make_gguf(2 * MiB, 32)
    hub.add_bytes("test-org/Changed-GGUF", "changed.gguf", data)
    request = [FileRequest(HubRef("test-org/Changed-GGUF", "changed.gguf"))]
    [path] = download(request, root)
    stamp_path(path).unlink()
    path.write_bytes(make_gguf(2 * MiB, 33))  # same size, other bytes, no stamp: someone else's file

    [again] = download(request, root)
    assert again.read_bytes() == data and again != path and path.exists()


# ---- 7. removing models ----------------------------------------------------------------------------------


def test_remove_never_deletes_a_file_added_by_a_path_out_of_the_library(tmp_path, monkeypatch, capsys):
    root = tmp_path / "models"
    root.mkdir()
    downloads = tmp_path / "Downloads"
    downloads.mkdir()
    mine = downloads / "mine.gguf"
    mine.write_bytes(make_gguf(1 * MiB, 40))
    monkeypatch.setenv("SPECULUM_MODELS_DIR", str(root))
    monkeypatch.chdir(root)

    assert main(["models", "add", "../Downloads/mine.gguf"]) == 0
    assert main(["models", "remove", "mine"]) == 0
    assert "deleted" not in capsys.readouterr().out
    assert mine.read_bytes() == make_gguf(1 * MiB, 40)
    assert Library(root).models() == []


def test_remove_forgets_but_keeps_a_users_file_inside_the_library(tmp_path, monkeypatch, capsys):
    root = tmp_path / "models"
    root.mkdir()
    mine = root / "mine.gguf"
    mine.write_bytes(make_gguf(1 * MiB, 41))
    link = root / "linked.gguf"
    outside = tmp_path / "outside.gguf"
    outside.write_bytes(make_gguf(1 * MiB, 42))
    link.symlink_to(outside)
    monkeypatch.setenv("SPECULUM_MODELS_DIR", str(root))

    assert main(["models", "add", str(mine)]) == 0
    assert main(["models", "remove", "mine"]) == 0
    assert mine.exists()
    assert Library(root).remove("linked") == [] and outside.exists()


def test_remove_still_deletes_what_it_downloaded(hub, root):
    data = make_gguf(1 * MiB, 43)
    hub.add_bytes("test-org/Ours-GGUF", "ours.gguf", data)
    library = Library(root, pairs=[])
    model = library.add_from_hub(HubRef("test-org/Ours-GGUF", "ours.gguf"))
    assert library.remove("ours") == [model.path]
    assert files_under(root) == [root / "library.json"]
