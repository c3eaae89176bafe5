"""The llama.cpp backend: a GGUF model run by llama.cpp (llama-cpp-python's low-level API).

A token tree runs as one `llama_decode` whose tokens carry several sequence ids: leaf k of the
tree is sequence k, a node carries the ids of the leaves below it, and its position is the root's
plus its depth (docs/design.md, "Backends"; llamacpp_batch.TreeSeqs). Sequence 0 holds the
committed prefix; the first `run_tree` of a step copies it into the other leaf sequences (no data
moves: cells gain sequence ids), and `keep_path` keeps one leaf sequence up to the deepest kept
node and moves it back to sequence 0. The context is created with `kv_unified` (tokens with
several sequence ids need one shared cache).

Everything that would make llama.cpp abort the process (a batch larger than n_batch, a sequence
id >= n_seq_max, a non-causal model) is checked in Python first and raised as RedwoodError.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from redwood.backends.base import tree_limits_error
from redwood.backends.gguf_header import check_gguf, file_type_name
from redwood.backends.llamacpp_batch import (NativeBatch, TreeLayouts, TreeSeqs, check_path,
                                             check_tree_nodes, node_rows, tree_step)
from redwood.backends.llamacpp_logits import LogitsViews
from redwood.backends.llamacpp_native import (LLAMA_MAX_SEQ, clear_log, decode, free_cores,
                                             llama_cpp_module, native_errors, positive)
from redwood.errors import RedwoodError
from redwood.plan.tree import Tree

class LlamaCppBackend:
    """`Backend` for a GGUF causal LM on llama.cpp (CPU). n_ctx: cache cells (committed tokens
    plus tentative nodes); n_seq_max: the most leaves a tree may have; n_batch: the most tokens
    per decode (trees larger than this are refused by check_tree)."""

    kind = "llamacpp"
    # prefill_tree is two decodes here, so the engine does not fuse: it takes the first token
    # from the whole prompt's prefill instead, as llama.cpp's own loop and llama-server do
    fused_prefill_tree = False

    def __init__(self, path, n_ctx: int = 4096, n_threads: int | None = None,
                 n_seq_max: int = 64, n_batch: int = 512):
        self._model = self._ctx = self._batch = None
        path = Path(path)
        info = check_gguf(path)
        n_ctx = positive(n_ctx, "n_ctx")
        n_seq_max = positive(n_seq_max, "n_seq_max", LLAMA_MAX_SEQ)
        n_batch = positive(n_batch, "n_batch")
        threads = free_cores() if n_threads is None else positive(n_threads, "n_threads")
        llama = self._llama = llama_cpp_module()

        params = llama.llama_model_default_params()
        params.n_gpu_layers = 0
        clear_log()
        self._model = llama.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise RedwoodError(f"llama.cpp could not load {path} (architecture "
                               f"{info['architecture']!r}){native_errors()}")
        try:
            self._check_model(path, info["architecture"])
            cparams = llama.llama_context_default_params()
            cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = n_ctx, n_batch, n_batch
            cparams.n_seq_max = n_seq_max
            cparams.n_threads = cparams.n_threads_batch = threads
            cparams.kv_unified = True         # tokens with several sequence ids share cells
            cparams.swa_full = True           # sliding-window caches must allow seq_rm anywhere
            cparams.no_perf = True
            self._ctx = llama.llama_init_from_model(self._model, cparams)
            if not self._ctx:
                raise RedwoodError(f"llama.cpp could not create a context for {path} "
                                   f"(n_ctx={n_ctx}, n_batch={n_batch}){native_errors()}; "
                                   "try a smaller n_ctx")
            self._mem = llama.llama_get_memory(self._ctx)
            self.n_ctx = int(llama.llama_n_ctx(self._ctx))
            self.n_batch = min(int(llama.llama_n_batch(self._ctx)),
                               int(llama.llama_n_ubatch(self._ctx)))
            self.n_seq_max = min(int(llama.llama_n_seq_max(self._ctx)), n_seq_max)
            self._batch = NativeBatch(llama, self.n_batch, self.n_seq_max)
            vocab = llama.llama_model_get_vocab(self._model)
            self.vocab_size = int(llama.llama_vocab_n_tokens(vocab))
            self.eos_ids = frozenset(t for t in range(self.vocab_size)
                                     if llama.llama_vocab_is_eog(vocab, t))
            ftype = info["file_type"]
            if ftype is None and hasattr(llama, "llama_model_ftype"):
                ftype = llama.llama_model_ftype(self._model)
        except BaseException:
            self.close()
            raise
        self.name = str(path)
        self.device = torch.device("cpu")
        self.max_positions = self.n_ctx
        self.dtype_name = file_type_name(ftype)
        self.n_threads = threads
        self._length = 0             # committed tokens (sequence 0, positions 0..L-1)
        self._tokens: list[int] = []  # their ids: what keep_prefix compares a new prompt with
        self._step = None            # the tentative state of the current step, or None
        self._layouts = TreeLayouts(256)
        self._views = LogitsViews(self.vocab_size)  # the logits buffer in place

    def _check_model(self, path: Path, arch: str) -> None:
        llama = self._llama
        branch = "(its state cannot branch into a tree)"
        checks = [("llama_model_has_encoder", True, "has an encoder"),
                  ("llama_model_has_decoder", False, "has no decoder"),
                  ("llama_model_is_recurrent", True, f"is recurrent {branch}"),
                  ("llama_model_is_hybrid", True, f"is hybrid recurrent {branch}"),
                  ("llama_model_is_diffusion", True, "is a diffusion model")]
        for fn, bad, what in checks:
            if hasattr(llama, fn) and bool(getattr(llama, fn)(self._model)) == bad:
                raise RedwoodError(f"{path}: architecture {arch!r} {what}; the llama.cpp backend "
                                   "runs decoder-only transformer language models")

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Free the batch, context and model (idempotent)."""
        llama = getattr(self, "_llama", None)
        if getattr(self, "_views", None) is not None:
            self._views.clear()                     # they point into the context's buffer
        if getattr(self, "_batch", None) is not None:
            self._batch.free()
            self._batch = None
        if getattr(self, "_ctx", None):
            llama.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            llama.llama_model_free(self._model)
            self._model = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- Backend -------------------------------------------------------------------------
    def reset(self) -> None:
        self._live()
        self._llama.llama_memory_clear(self._mem, True)
        self._length, self._step, self._tokens = 0, None, []

    def keep_prefix(self, ids, most: int | None = None) -> int:
        """Keep the longest committed prefix that `ids` starts with (at most `most` tokens) and
        drop the rest of the cache: the prompt cache of one sequence, as llama-server keeps a
        slot's KV between requests. Returns the tokens kept; the caller appends ids[kept:].
        The kept cells hold exactly what a fresh prefill of those tokens would (the kernels
        differ by batch shape, as for trees: docs/design.md §5.3)."""
        self._live()
        ids = self._token_ids(ids)
        limit = len(ids) if most is None else max(0, min(int(most), len(ids)))
        kept, cached = 0, self._tokens
        while kept < min(limit, len(cached)) and cached[kept] == ids[kept]:
            kept += 1
        if self._step is not None:
            self.keep_path([])                       # drop tentative nodes first
        self._llama.llama_memory_seq_rm(self._mem, -1, kept, -1)
        self._length, self._tokens = kept, self._tokens[:kept]
        return kept

    def cache_length(self) -> int:
        return self._length

    def append(self, ids, rows: int = 1) -> torch.Tensor:
        out = self._append(ids, rows, copy=True)
        return torch.cat(out) if out else torch.empty(0, self.vocab_size)

    def append_logits_view(self, ids) -> np.ndarray:
        """append(ids, rows=1)[0] without its copy: the last token's logits [V] float32 as a
        view of llama.cpp's output buffer, valid until the next decode on this context (read
        it before then). The plain decoding path: copying a 151,936-float row into a fresh
        tensor and taking torch's argmax cost 0.3 ms of a 36 ms step here; numpy's argmax on
        the view costs 0.01 ms. Only the last chunk yields that row, so the view is current."""
        if isinstance(ids, list) and len(ids) == 1 and isinstance(ids[0], int) \
                and self._step is None and self._ctx:
            return self._append_one(ids[0])
        out = self._append(ids, 1, copy=False)
        if not out:
            raise RedwoodError("append_logits_view needs at least one token")
        return out[-1][0]

    def _append_one(self, token: int) -> np.ndarray:
        """append_logits_view of one token (every plain step): the batch's fields set through
        ctypes and the row's view kept while llama.cpp's buffer stays put. The general path's
        dozen small numpy calls cost 0.27 ms outside llama_decode right after a decode (cold
        caches), this 0.1 ms; same checks, same batch, same row."""
        if not 0 <= token < self.vocab_size:
            raise self._out_of_range(token)
        self._check_room(1, "appending 1 token")
        self._batch.fill_one(token, self._length)
        try:
            self._decode(f"appending 1 token at position {self._length}")
        except BaseException:
            self._llama.llama_memory_seq_rm(self._mem, -1, self._length, -1)
            raise
        self._length += 1
        self._tokens.append(token)
        return self._logits_rows(1)[0]

    def _append(self, ids, rows: int, copy: bool) -> list:
        """append's work: the logits of the last `rows` tokens per chunk, as tensors (copy) or
        numpy views of llama.cpp's buffer."""
        self._live()
        if self._step is not None:
            raise RedwoodError("append with tentative tree nodes pending: call keep_path first")
        ids = self._token_ids(ids)
        n, rows = len(ids), max(0, min(int(rows), len(ids)))
        if n == 0:
            return []
        self._check_room(n, f"appending {n} tokens")
        start, out = self._length, []
        try:
            for lo in range(0, n, self.n_batch):
                chunk = ids[lo:lo + self.n_batch]
                want = max(0, rows - (n - lo - len(chunk)))      # outputs among the last `rows`
                want = min(want, len(chunk))
                self._batch.fill_causal(chunk, start + lo, want)
                self._decode(f"appending {n} tokens at position {start}")
                if want:
                    out.append(self._logits(want) if copy else self._logits_view(want))
        except BaseException:
            self._llama.llama_memory_seq_rm(self._mem, -1, start, -1)
            raise
        self._length = start + n
        self._tokens.extend(int(t) for t in ids)
        return out

    def run_tree(self, tree: Tree, nodes: Sequence[int], tokens: torch.Tensor,
                 root_position: int, rows: Sequence[int] | None = None) -> torch.Tensor:
        self._live()
        self.check_tree(tree)
        layout = self._layout(tree)
        nodes = [int(u) for u in nodes]
        ids = self._token_ids(tokens)
        if len(ids) != len(nodes):
            raise RedwoodError(f"run_tree got {len(nodes)} nodes but {len(ids)} tokens")
        rows = node_rows(rows, len(nodes), "run_tree")
        if not nodes:
            return torch.empty(len(rows), self.vocab_size)
        step = tree_step(self._step, layout, root_position, self._length, "run_tree")
        check_tree_nodes(step, nodes)
        self._check_room(step["cells"] + len(nodes), f"running {len(nodes)} tree nodes")

        if self._step is None:                       # first call of the step: branch the prefix
            for s in range(1, layout.n_leaves):
                self._llama.llama_memory_seq_cp(self._mem, 0, s, -1, -1)
            self._step = step
        index = np.array(nodes)
        outputs = np.zeros(len(nodes), dtype=np.int8)
        outputs[rows] = 1
        self._batch.fill_tree(ids, root_position + layout.depths[index],
                              [layout.seqs[u] for u in nodes], outputs)
        try:
            self._decode(f"running {len(nodes)} tree nodes at position {root_position}")
        except BaseException:
            self.keep_path([])
            raise
        step["ran"].update(nodes)
        step["cells"] += len(nodes)
        step["tokens"].update(zip(nodes, (int(t) for t in ids)))
        if not rows:
            return torch.empty(0, self.vocab_size)
        kept = np.flatnonzero(outputs)               # logits come in batch order
        logits = self._logits(len(kept))
        order = np.searchsorted(kept, rows)
        if np.array_equal(order, np.arange(len(kept))):
            return logits                            # the usual case: no [n, V] gather copy
        return logits[torch.from_numpy(order)]

    def prefill_tree(self, ids, tree: Tree, tokens: torch.Tensor) -> torch.Tensor:
        """append(ids, rows=0), then run_tree over the whole tree: two decodes, not one. A
        prefill runs in n_batch-token chunks, and a tree's per-sequence-id layout (the prefix
        copied into every leaf sequence) is set up per tree call, so one fused batch would
        need the prompt and the tree in one ubatch with the prefix's cells shared by every
        leaf sequence; on a CPU the saving (one graph launch) is not worth that path here."""
        self.check_tree(tree)                        # before the prompt is committed
        self.append(ids, rows=0)
        return self.run_tree(tree, range(len(tree)), tokens, self._length)

    def keep_path(self, nodes: Sequence[int]) -> None:
        self._live()
        llama, mem, step = self._llama, self._mem, self._step
        nodes = [int(u) for u in nodes]
        if not nodes:                                # drop every tentative cell
            llama.llama_memory_seq_rm(mem, -1, self._length, -1)
            llama.llama_memory_seq_keep(mem, 0)
            self._step = None
            return
        if step is None:
            raise RedwoodError("keep_path: no tree nodes have been run since the last keep_path")
        check_path(step, nodes)
        last = nodes[-1]
        position = step["root"] + int(step["layout"].depths[last])
        seq = int(step["layout"].seqs[last][0])     # a leaf sequence through the kept path
        llama.llama_memory_seq_rm(mem, seq, position + 1, -1)
        llama.llama_memory_seq_keep(mem, seq)
        if seq != 0:
            llama.llama_memory_seq_cp(mem, seq, 0, -1, -1)
            llama.llama_memory_seq_keep(mem, 0)
        self._tokens.extend(step["tokens"][u] for u in nodes)
        self._length, self._step = position + 1, None

    def room_needed(self, tree: Tree) -> int:
        return len(tree)                      # every tentative node takes a cache cell

    def check_tree(self, tree: Tree) -> None:
        message = tree_limits_error(tree, self.n_batch, self.n_seq_max, "llama.cpp")
        if message:
            raise RedwoodError(message)

    # -- helpers -------------------------------------------------------------------------
    def _live(self) -> None:
        if self._ctx is None:
            raise RedwoodError(f"the llama.cpp backend for {self.name} is closed")

    def _layout(self, tree: Tree) -> TreeSeqs:
        return self._layouts.get(tree, [self._step["layout"]] if self._step else [])

    def _token_ids(self, ids) -> np.ndarray:
        if isinstance(ids, torch.Tensor):
            ids = ids.detach().cpu().numpy()
        ids = np.asarray(ids).reshape(-1)
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise RedwoodError(f"token ids must be integers, got dtype {ids.dtype}")
        bad = ids[(ids < 0) | (ids >= self.vocab_size)]
        if bad.size:
            raise self._out_of_range(int(bad[0]))
        return ids.astype(np.int32)

    def _out_of_range(self, token: int) -> RedwoodError:
        return RedwoodError(f"token id {token} is out of range for {self.name} "
                            f"(vocabulary of {self.vocab_size} tokens)")

    def _check_room(self, tentative: int, what: str) -> None:
        if self._length + tentative > self.n_ctx:
            raise RedwoodError(f"context overflow: {what} after {self._length} committed tokens "
                               f"needs {self._length + tentative} positions, but the context "
                               f"holds {self.n_ctx} (n_ctx); use a larger n_ctx or a shorter text")

    def _decode(self, what: str) -> None:
        decode(self._llama, self._ctx, self._batch.batch, what)

    def _logits(self, rows: int) -> torch.Tensor:
        return torch.from_numpy(np.array(self._logits_view(rows), dtype=np.float32))

    def _logits_view(self, rows: int) -> np.ndarray:
        """The first `rows` logits rows [rows, V] in place, valid until the next decode
        (backends/llamacpp_logits.py)."""
        return self._views.view(self._ctx, rows)

    def _logits_rows(self, rows: int) -> list[np.ndarray]:
        return self._views.rows(self._ctx, rows)

    def _logits_row_tensors(self, rows: int) -> list[torch.Tensor]:
        return self._views.row_tensors(self._ctx, rows)
