"""models/shipped.py + manifest.py: assembling part packages and the integrity of the model
cache, with fake part packages (real wheels' layout: module with get_part_path() + dist-info
with a RECORD) and a fake dequantiser, so no real model is loaded."""
from __future__ import annotations

import base64
import hashlib
import importlib
import json
import os
from pathlib import Path

import pytest

from redwood.cache_dirs import cache_root
from redwood.errors import RedwoodError
from redwood.models import manifest, shipped

PART_BYTES = [b"GGUF" + bytes(range(256)) * 40, bytes(range(255, -1, -1)) * 50, b"tail" * 999]


def make_part_package(site: Path, package: str, module: str, index: int, data: bytes,
                      version="1.0", record_data: bytes | None = None):
    """Install a fake part package into `site`, as pip would lay it out."""
    pkg = site / f"{module}{index}"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import os\ndef get_part_path():\n"
        f"    return os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'part{index:02d}.bin')\n")
    (pkg / "data" / f"part{index:02d}.bin").write_bytes(data)
    digest = base64.urlsafe_b64encode(hashlib.sha256(record_data or data).digest()).rstrip(b"=").decode()
    dist = site / f"{module}{index}-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}{index}\nVersion: {version}\n")
    (dist / "RECORD").write_text(f"{module}{index}/data/part{index:02d}.bin,sha256={digest},{len(data)}\n")


@pytest.fixture
def fake_pair(tmp_path, monkeypatch):
    """A shipped pair "fake" whose target has 3 parts and draft 1; the dequantiser is replaced
    by one that stores the assembled bytes as the "weights" and counts its calls."""
    site = tmp_path / "site"
    site.mkdir()
    token = tmp_path.name.replace("-", "_")[-12:]           # unique module names per test
    target = shipped.ShippedModel("Fake target", f"rwfake-t{token}-part", f"rwfake_t{token}_part", 3, "1.0")
    draft = shipped.ShippedModel("Fake draft", f"rwfake-d{token}-part", f"rwfake_d{token}_part", 1, "1.0")
    for i, data in enumerate(PART_BYTES, start=1):
        make_part_package(site, target.package, target.module, i, data)
    make_part_package(site, draft.package, draft.module, 1, b"draft-bytes" * 100)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    monkeypatch.setitem(shipped.SHIPPED_PAIRS, "fake", shipped.ShippedPair(target, draft))
    calls = []

    def fake_dequantise(gguf_path: Path, out_dir: Path):
        calls.append(out_dir)
        (out_dir / "model.safetensors").write_bytes(gguf_path.read_bytes())
        (out_dir / "config.json").write_text(json.dumps({"vocab_size": 64}))

    monkeypatch.setattr(shipped, "_dequantise_to", fake_dequantise)
    return {"site": site, "target": target, "draft": draft, "calls": calls,
            "cache": tmp_path / "cache"}


def build(fake, role="target"):
    return shipped.shipped_model_dir(role, name="fake", cache_dir=fake["cache"], progress=False)


def test_first_use_builds_then_trusts_the_cache(fake_pair):
    final = build(fake_pair)
    assert final == fake_pair["cache"] / "fake" / "target"
    assert (final / "model.safetensors").read_bytes() == b"".join(PART_BYTES)
    assert not (final / "model.gguf").exists()                    # assembled GGUF deleted
    recorded = json.loads((final / manifest.MANIFEST).read_text())
    assert set(recorded["files"]) == {"model.safetensors", "config.json"}
    assert recorded["files"]["model.safetensors"]["sha256"] == hashlib.sha256(b"".join(PART_BYTES)).hexdigest()
    assert [p.name for p in final.parent.iterdir() if p.name.startswith(".")] == [".lock"]
    assert build(fake_pair) == final and len(fake_pair["calls"]) == 1
    target_dir, draft_dir = shipped.shipped_pair_dirs(fake_pair["cache"], progress=False, name="fake")
    assert (target_dir, len(fake_pair["calls"])) == (final, 2)     # only the draft was built
    assert (draft_dir / "model.safetensors").read_bytes() == b"draft-bytes" * 100


@pytest.mark.parametrize("damage", ["truncate", "overwrite_head", "delete_manifest", "delete_file",
                                    "garble_manifest", "other_source"])
def test_damaged_cache_is_rebuilt(fake_pair, damage, capsys):
    final = build(fake_pair)
    weights = final / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:-10])
    elif damage == "overwrite_head":
        weights.write_bytes(b"XXXX" + weights.read_bytes()[4:])
    elif damage == "delete_manifest":
        (final / manifest.MANIFEST).unlink()
    elif damage == "delete_file":
        (final / "config.json").unlink()
    elif damage == "garble_manifest":
        (final / manifest.MANIFEST).write_text("{not json")
    else:   # the cache was built from different part packages (e.g. an older redwood pinned others)
        recorded = json.loads((final / manifest.MANIFEST).read_text())
        recorded["source"]["version"] = "0.9"
        (final / manifest.MANIFEST).write_text(json.dumps(recorded))
    assert manifest.check_manifest(final) is not None or damage == "other_source"
    assert build(fake_pair) == final
    assert len(fake_pair["calls"]) == 2
    assert weights.read_bytes() == b"".join(PART_BYTES)
    assert manifest.check_manifest(final) is None
    assert "not usable" in capsys.readouterr().err


def test_quick_check_samples_and_full_check_reads_everything(tmp_path):
    size = 3 << 20
    data = bytearray(os.urandom(size))
    (tmp_path / "w.bin").write_bytes(data)
    manifest.write_manifest(tmp_path, {"test": 1})
    assert manifest.check_manifest(tmp_path, {"test": 1}) is None
    assert manifest.check_manifest(tmp_path, {"test": 2}) == "built from different part packages"
    # a byte between the first two sampled blocks: the quick check cannot see it, the full one does
    step = (size - manifest._SAMPLE_BLOCK) // (manifest._SAMPLE_COUNT + 1)
    offset = manifest._SAMPLE_BLOCK + (step - manifest._SAMPLE_BLOCK) // 2
    data[offset] ^= 0xFF
    (tmp_path / "w.bin").write_bytes(data)
    assert manifest.check_manifest(tmp_path, verify="quick") is None
    assert "sha256" in manifest.check_manifest(tmp_path, verify="full")
    data[step + 5] ^= 0xFF                       # inside the second sampled block
    (tmp_path / "w.bin").write_bytes(data)
    assert "fingerprint" in manifest.check_manifest(tmp_path, verify="quick")


def test_leftovers_of_a_killed_build_are_never_trusted(fake_pair):
    pair_dir = fake_pair["cache"] / "fake"
    leftover = pair_dir / ".target.tmp-killed"
    leftover.mkdir(parents=True)
    (leftover / "model.safetensors").write_bytes(b"half")
    final = build(fake_pair)
    assert not leftover.exists()
    assert (final / "model.safetensors").read_bytes() == b"".join(PART_BYTES)


def test_failed_build_leaves_nothing_behind(fake_pair, monkeypatch):
    def crash(gguf_path, out_dir):
        (out_dir / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt                       # e.g. Ctrl-C while dequantising

    monkeypatch.setattr(shipped, "_dequantise_to", crash)
    with pytest.raises(KeyboardInterrupt):
        build(fake_pair)
    assert [p.name for p in (fake_pair["cache"] / "fake").iterdir()] == [".lock"]


def test_missing_part_package_names_the_install_command(fake_pair, monkeypatch):
    spec = fake_pair["target"]
    monkeypatch.setitem(shipped.SHIPPED_PAIRS, "fake",
                        shipped.ShippedPair(shipped.ShippedModel(spec.description, spec.package,
                                                                 spec.module, 4, "1.0"), fake_pair["draft"]))
    with pytest.raises(RedwoodError) as info:
        build(fake_pair)
    message = str(info.value)
    assert f"{spec.package}4 is not installed" in message
    assert "make models" in message and "--no-deps" in message and f"{spec.package}1==1.0" in message
    assert not (fake_pair["cache"] / "fake").exists()               # failed before creating anything


def test_corrupt_or_wrong_version_part_is_reported(tmp_path, fake_pair):
    spec = fake_pair["draft"]
    part = fake_pair["site"] / f"{spec.module}1" / "data" / "part01.bin"
    part.write_bytes(b"draft-bytes" * 99 + b"xxxxxxxxxxx")           # differs from the RECORD hash
    with pytest.raises(RedwoodError, match=r"part1 is corrupt.*--force-reinstall --no-deps"):
        build(fake_pair, "draft")
    assert not (fake_pair["cache"] / "fake" / "draft").exists()
    wrong = shipped.ShippedModel(spec.description, spec.package, spec.module, 1, "2.0")
    with pytest.raises(RedwoodError, match=r"1\.0 is installed but redwood needs 2\.0"):
        shipped.part_files(wrong)


def test_disk_full_and_other_errors(fake_pair, monkeypatch):
    import errno
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    real_disk_usage = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 10**12, 1000))
    with pytest.raises(RedwoodError, match="not enough disk space .* REDWOOD_CACHE"):
        build(fake_pair)
    monkeypatch.setattr(shutil, "disk_usage", real_disk_usage)

    def disk_full(gguf_path, out_dir):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shipped, "_dequantise_to", disk_full)
    with pytest.raises(RedwoodError, match="cannot write the model cache .*No space left"):
        build(fake_pair)

    def unreadable(gguf_path, out_dir):               # not a cache-writing problem: re-raised
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(shipped, "_dequantise_to", unreadable)
    with pytest.raises(OSError, match="Input/output"):
        build(fake_pair)
    assert [p.name for p in (fake_pair["cache"] / "fake").iterdir()] == [".lock"]


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("REDWOOD_CACHE", str(tmp_path / "a"))
    assert cache_root() == tmp_path / "a"
    assert cache_root(tmp_path / "b") == tmp_path / "b"
    monkeypatch.delenv("REDWOOD_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "redwood"


def test_real_part_packages_are_complete():
    """The installed shipped parts are all present, at the pinned versions, with RECORD hashes."""
    pair = shipped.SHIPPED_PAIRS["qwen2.5-coder"]
    for spec in (pair.target, pair.draft):
        try:
            parts = shipped.part_files(spec)
        except RedwoodError as err:
            if "is not installed" in str(err):
                pytest.skip(str(err))
            raise
        assert len(parts) == spec.parts
        assert all(path.is_file() and expected for path, expected in parts)
        with open(parts[0][0], "rb") as first:
            assert first.read(4) == b"GGUF"


@pytest.mark.real
def test_tokenizer_dir_without_the_float_cache(tmp_path):
    """Tokenizer-only users get the tokenizer from the assembled GGUF, no float cache built."""
    from redwood.models.hf_loading import load_tokenizer

    try:
        directory = shipped.shipped_tokenizer_dir(cache_dir=tmp_path, progress=False)
    except RedwoodError as err:
        pytest.skip(f"shipped model pair unavailable: {err}")
    assert directory == tmp_path / "qwen2.5-coder" / "tokenizer"
    assert not (tmp_path / "qwen2.5-coder" / "target").exists()
    assert (tmp_path / "qwen2.5-coder" / "gguf" / "target.gguf").is_file()
    tokenizer = load_tokenizer(directory)
    assert tokenizer.decode(tokenizer("def add(a, b):")["input_ids"]) == "def add(a, b):"
    assert shipped.shipped_tokenizer_dir(cache_dir=tmp_path, progress=False) == directory
