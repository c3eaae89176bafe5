"""Checks of a GGUF file made before llama.cpp sees it (a bad file can abort the process inside
llama.cpp), from a minimal reader of the GGUF header.

The reader returns the scalar and string key/values and skips arrays. gguf's GGUFReader would
do, but it builds a numpy view for every item of every array: on a 151k-token vocabulary (token
list, types, merges) it takes seconds, where this reader takes a fraction of one.
"""
from __future__ import annotations

import mmap
import struct
from pathlib import Path

from redwood.errors import RedwoodError

# Architectures llama.cpp loads but cannot run as a causal LM (encoders / embedding models,
# encoder-decoders that need llama_encode, vision projectors, vocoders, diffusion LMs).
NOT_CAUSAL_LM = frozenset({
    "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert", "jina-bert-v2",
    "jina-bert-v3", "eurobert", "t5", "t5encoder", "clip", "wavtokenizer-dec", "llada",
    "llada-moe", "dream", "gemma-embedding", "llama-embed",
})

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def read_gguf_metadata(path) -> dict:
    """{key: value} of a GGUF header's scalars and strings (arrays map to None).
    Raises ValueError on a malformed header."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise ValueError("bad magic")
        version, = struct.unpack_from("<I", data, 4)
        if version < 2 or version > 0xFFFF:
            raise ValueError(f"GGUF version {version} is not supported "
                             "(need 2 or 3, little-endian)")
        _, kv_count = struct.unpack_from("<QQ", data, 8)
        offset, out = 24, {}

        def string(at):
            length, = struct.unpack_from("<Q", data, at)
            end = at + 8 + length
            if end > len(data):
                raise ValueError("string past the end of the file")
            return data[at + 8:end].decode("utf-8", errors="replace"), end

        def skip(kind, at):
            if kind in _SCALAR:
                return at + struct.calcsize(_SCALAR[kind])
            if kind == _STRING:
                return string(at)[1]
            raise ValueError(f"unknown value type {kind}")

        for _ in range(kv_count):
            key, offset = string(offset)
            kind, = struct.unpack_from("<I", data, offset)
            offset += 4
            if kind in _SCALAR:
                out[key], = struct.unpack_from(_SCALAR[kind], data, offset)
                offset += struct.calcsize(_SCALAR[kind])
            elif kind == _STRING:
                out[key], offset = string(offset)
            elif kind == _ARRAY:
                item, count = struct.unpack_from("<IQ", data, offset)
                offset += 12
                if item in _SCALAR:
                    offset += count * struct.calcsize(_SCALAR[item])
                else:
                    for _ in range(count):
                        offset = skip(item, offset)
                if offset > len(data):
                    raise ValueError("array past the end of the file")
                out[key] = None
            else:
                raise ValueError(f"unknown value type {kind} for key {key!r}")
        return out


def check_gguf(path: Path) -> dict:
    """Check that `path` is a GGUF file of a causal LM before any native call.
    Returns {"architecture", "file_type"}."""
    if not path.is_file():
        raise RedwoodError(f"model file not found: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise RedwoodError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF'); "
                           "the llama.cpp backend loads .gguf models: convert the model with "
                           "llama.cpp's convert_hf_to_gguf.py or use the transformers backend")
    try:
        meta = read_gguf_metadata(path)
    except (ValueError, struct.error, OSError) as exc:
        raise RedwoodError(f"{path}: cannot read the GGUF header ({exc}); "
                           "the file is truncated or corrupt") from None
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise RedwoodError(f"{path}: the GGUF has no general.architecture; not a llama.cpp model")
    what = None
    if arch in NOT_CAUSAL_LM:
        what = "an encoder, embedding or non-autoregressive model"
    elif meta.get(f"{arch}.attention.causal") is False:
        what = "a model with non-causal attention"
    elif meta.get(f"{arch}.pooling_type") not in (None, 0):
        what = "an embedding model (it pools its outputs)"
    if what:
        raise RedwoodError(f"{path}: architecture {arch!r} is {what}, not a causal language "
                           "model; the llama.cpp backend needs a text-generation model")
    return {"architecture": arch, "file_type": meta.get("general.file_type")}


def file_type_name(ftype) -> str:
    """'Q4_K_M', 'F32', ... from llama.cpp's file type number (gguf's LlamaFileType)."""
    from gguf import LlamaFileType

    if ftype is None:
        return "unknown"
    ftype = int(ftype) & ~1024                        # LLAMA_FTYPE_GUESSED
    try:
        name = LlamaFileType(ftype).name
    except ValueError:
        return f"ftype{ftype}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")
