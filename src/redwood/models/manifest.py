"""Integrity of redwood's model cache: a manifest.json describing every file of a directory.

A model directory's `manifest.json` (written last) lists every file with its size, sha256, and
a sampled fingerprint. A directory is trusted only if its manifest matches the files on disk
(sizes + fingerprint by default, full sha256 with `verify="full"`). A leaf module: stdlib only.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
_CHUNK = 16 << 20            # streaming copy / hash block (16 MiB)
_SAMPLE_BLOCK = 64 << 10     # fingerprint: head, tail and evenly spaced 64 KiB blocks
_SAMPLE_COUNT = 32


def file_fingerprint(path: Path) -> str:
    """sha256 over the head, tail and evenly spaced 64 KiB blocks: catches truncation, header
    damage and most overwrites while reading ~2 MiB even of a 7 GB file."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        if size <= _SAMPLE_BLOCK * (_SAMPLE_COUNT + 2):
            digest.update(f.read())
            return digest.hexdigest()
        step = (size - _SAMPLE_BLOCK) // (_SAMPLE_COUNT + 1)
        for k in range(_SAMPLE_COUNT + 2):
            f.seek(min(k * step, size - _SAMPLE_BLOCK))
            digest.update(f.read(_SAMPLE_BLOCK))
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(model_dir: Path, source: dict, extra: dict | None = None) -> dict:
    """Describe every file in `model_dir` and write manifest.json (fsynced) last; `extra` is
    informational (e.g. build timings) and not checked."""
    files = {}
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file() and p.name != MANIFEST):
        _fsync_file(path)
        files[path.relative_to(model_dir).as_posix()] = {
            "size": path.stat().st_size, "sha256": file_sha256(path), "fingerprint": file_fingerprint(path)}
    manifest = {"format": MANIFEST_FORMAT, "source": source, "files": files, **(extra or {})}
    tmp = model_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    _fsync_file(tmp)
    os.replace(tmp, model_dir / MANIFEST)
    return manifest


def check_manifest(model_dir: Path, source: dict | None = None, verify: str = "quick") -> str | None:
    """None if `model_dir` matches its manifest (and `source`, when given); else why not.

    verify: "quick" (sizes + sampled fingerprint), "full" (sizes + sha256 of every byte)."""
    if verify not in ("quick", "full"):
        raise ValueError(f"verify must be 'quick' or 'full', got {verify!r}")
    try:
        manifest = json.loads((Path(model_dir) / MANIFEST).read_text())
    except FileNotFoundError:
        return "no manifest (incomplete build)"
    except (OSError, ValueError) as err:
        return f"unreadable manifest ({err})"
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return "manifest of an unknown format"
    if source is not None and manifest.get("source") != source:
        return "built from different part packages"
    for rel, meta in manifest.get("files", {}).items():
        path = Path(model_dir) / rel
        if not path.is_file():
            return f"{rel} is missing"
        if path.stat().st_size != meta["size"]:
            return f"{rel} has the wrong size"
        if verify == "quick" and file_fingerprint(path) != meta["fingerprint"]:
            return f"{rel} does not match its fingerprint"
        if verify == "full" and file_sha256(path) != meta["sha256"]:
            return f"{rel} does not match its sha256"
    return None


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
