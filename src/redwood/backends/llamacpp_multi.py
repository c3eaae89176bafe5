"""Several requests in one llama.cpp context: continuous batching of token trees.

A `MultiSeqContext` wraps one `LlamaCppBackend` (its model, its `kv_unified` context and its
native batch) and splits the context's sequence ids into `lanes`: lane i owns the ids
[i * width, (i + 1) * width). A request holds one lane:
- its committed prefix lives on the lane's first id (`base`) at positions 0..length-1, its own
  positions, independent of every other lane's;
- a tree run for it gives leaf k the id base + k (llamacpp_batch.TreeSeqs shifted by base), so
  the tree's leaves are bounded by the lane's width.
A token attends to the cells carrying its first sequence id (docs/design.md §5.3), and no id
is shared between lanes, so requests never see each other's cells although they share one KV
cache and one `llama_decode`.

One `decode(jobs)` carries any mix of `Append` (causal tokens committed at once: prompt chunks,
the draft's pending tokens) and `TreeNodes` (tentative tree nodes) for distinct lanes, bounded
by n_batch. `keep_path(lane, nodes)` compacts one lane to its accepted path and `release(lane)`
removes every cell of the lane (seq_rm of all its ids); neither touches other lanes.

Prefix cache (docs/design.md §5.5): a lane records the token ids of its committed cells
(`Lane.tokens`, appended only after a decode succeeded, so it never names a cell that was not
fully evaluated). `release(lane, keep=True)` leaves a finished request's cells resident and
indexes them in a radix tree; `cached_prefix(ids)` finds the idle lane sharing the longest
prefix, `acquire(lane, keep)` takes it with the first `keep` cells, `share(src, dst, end)`
lets a lane reuse another lane's committed cells by `seq_cp` (the cells are shared, not
copied), and `evict(lane)` frees an idle lane's cache. What to keep and evict is the
scheduler's policy (serve/prefix_reuse.py).

Everything that would abort the process (more tokens than n_batch, more leaves than the lane
holds, more cells than the context) is refused in Python before the native call; the jobs and
their checks are in llamacpp_jobs.py.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from redwood.backends.base import tree_limits_error
from redwood.backends.llamacpp import LlamaCppBackend
from redwood.backends.llamacpp_native import LLAMA_MAX_SEQ
from redwood.backends.llamacpp_batch import TreeLayouts, TreeSeqs, check_path
from redwood.backends.llamacpp_jobs import (Append, Lane, Prepared, TreeNodes, one_token,
                                           prepare_append, prepare_tree, take_rows)
from redwood.backends.radix_tree import RadixTree, common_prefix
from redwood.errors import RedwoodError
from redwood.plan.tree import Tree


class MultiSeqContext:
    """One llama.cpp model and context shared by `lanes` requests (see the module doc)."""

    def __init__(self, backend: LlamaCppBackend, lanes: int):
        if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
            raise RedwoodError(f"lanes must be a positive integer, got {lanes!r}")
        width = backend.n_seq_max // lanes
        if width < 1:
            raise RedwoodError(f"{lanes} lanes need at least {lanes} sequence ids, but the context "
                               f"has n_seq_max = {backend.n_seq_max}")
        backend.reset()
        self.backend = backend
        self.lanes = [Lane(i, i * width, width) for i in range(lanes)]
        self.n_ctx, self.n_batch = backend.n_ctx, backend.n_batch
        self.vocab_size, self.eos_ids, self.name = backend.vocab_size, backend.eos_ids, backend.name
        self._layouts = TreeLayouts(512)
        self.index = RadixTree()          # idle lanes' cached tokens, by lane index
        self._clock = 0

    @classmethod
    def load(cls, path, lanes: int, leaves_per_lane: int = 16, n_ctx: int = 8192,
             n_batch: int = 512, n_threads: int | None = None) -> "MultiSeqContext":
        """A fresh context for `lanes` requests of up to `leaves_per_lane` leaves each
        (n_seq_max = lanes * leaves_per_lane, at most llama.cpp's 256)."""
        n_seq = min(LLAMA_MAX_SEQ, lanes * max(1, int(leaves_per_lane)))
        backend = LlamaCppBackend(path, n_ctx=n_ctx, n_threads=n_threads, n_seq_max=n_seq,
                                  n_batch=n_batch)
        try:
            return cls(backend, lanes)
        except BaseException:
            backend.close()
            raise

    def close(self) -> None:
        self.backend.close()

    # -- lanes -------------------------------------------------------------------------
    def acquire(self, lane: Lane | None = None, keep: int = 0) -> Lane:
        """Hold a lane. lane None: a free lane with nothing cached, else the least recently
        used idle lane, its cache evicted. An idle `lane` given: it keeps its first `keep`
        cached cells (the rest are removed). RedwoodError when every lane is taken."""
        if lane is None:
            lane, keep = self.free_lane(), 0
        elif lane.busy or lane not in self.lanes:
            raise RedwoodError("acquire: that lane is not an idle lane of this context")
        self.backend._live()
        keep = max(0, min(int(keep), lane.length))
        if lane.index in self.index:
            self.index.remove(lane.index)
        if keep < lane.length:
            self.backend._llama.llama_memory_seq_rm(self.backend._mem, lane.base, keep, -1)
        lane.busy, lane.length, lane.step, lane.tokens = True, keep, None, lane.tokens[:keep]
        return lane

    def free_lane(self) -> Lane:
        """The idle lane acquire() takes when not told which: one with nothing cached, else
        the least recently used. RedwoodError when every lane is taken."""
        idle = [x for x in self.lanes if not x.busy]
        if not idle:
            raise RedwoodError(f"all {len(self.lanes)} lanes of {self.name} are in use")
        return min(idle, key=lambda x: (x.length > 0, x.used))

    def release(self, lane: Lane, keep: bool = False) -> None:
        """Free the lane. keep False: remove every cell of it (all its ids). keep True: its
        tentative nodes go, its committed cells stay cached (indexed by their tokens)."""
        self.backend._live()
        if keep:
            self.drop_tentative(lane)
        else:
            seq_rm, mem = self.backend._llama.llama_memory_seq_rm, self.backend._mem
            for seq in range(lane.base, lane.base + lane.width):
                seq_rm(mem, seq, -1, -1)
            lane.length, lane.tokens = 0, []
        self._clock += 1
        lane.busy, lane.step, lane.used = False, None, self._clock
        if lane.length:
            self.index.insert(lane.index, lane.tokens)

    def evict(self, lane: Lane) -> int:
        """Drop an idle lane's cached cells; returns how many there were."""
        if lane.busy:
            raise RedwoodError("evict: the lane is in use")
        cells = lane.length
        if cells:
            self.index.remove(lane.index)
            self.backend._live()
            self.backend._llama.llama_memory_seq_rm(self.backend._mem, lane.base, -1, -1)
            lane.length, lane.tokens = 0, []
        return cells

    def cached_prefix(self, ids) -> tuple[int, Lane | None]:
        """(length, idle lane): the idle lane whose cache shares the longest prefix with `ids`
        (the most recently used of equals), or (0, None)."""
        length, owners = self.index.longest_prefix(ids)
        if not length or not owners:
            return 0, None
        return length, max((self.lanes[i] for i in owners), key=lambda x: x.used)

    def live_prefix(self, ids, exclude: Lane | None = None) -> tuple[int, Lane | None]:
        """(length, busy lane): the busy lane whose committed tokens share the longest prefix
        with `ids` (a scan: at most a batch of lanes), or (0, None)."""
        best, source = 0, None
        for lane in self.lanes:
            if lane.busy and lane is not exclude and lane.length > best:
                k = common_prefix(lane.tokens, ids)
                if k > best:
                    best, source = k, lane
        return best, source

    def share(self, source: Lane, lane: Lane, end: int) -> None:
        """Give `lane` the committed cells of `source` at positions lane.length..end-1: the
        tokens must agree up to `end` (the cells are shared through seq_cp, not copied)."""
        if not lane.busy or lane.step is not None or source.step is not None:
            raise RedwoodError("share: both lanes must be held, with no tentative nodes")
        if not lane.length <= end <= source.length \
                or common_prefix(source.tokens, lane.tokens) < lane.length:
            raise RedwoodError(f"share: the lanes do not agree on positions 0..{end - 1}")
        self.backend._live()
        self.backend._llama.llama_memory_seq_cp(self.backend._mem, source.base, lane.base,
                                                lane.length, end)
        lane.tokens.extend(source.tokens[lane.length:end])
        lane.length = end

    def used_cells(self) -> int:
        """Cells held by lanes (busy ones' committed and tentative cells, idle caches); shared
        cells count once per lane, so this bounds what llama.cpp really holds."""
        return sum(lane.cells for lane in self.lanes)

    def idle_cells(self) -> int:
        return sum(lane.length for lane in self.lanes if not lane.busy)

    def seq_pos_max(self, seq: int) -> int:
        """The last position held by sequence id `seq` (-1: no cells), from llama.cpp itself."""
        return int(self.backend._llama.llama_memory_seq_pos_max(self.backend._mem, seq))

    def _live_layouts(self) -> list[TreeSeqs]:
        return [lane.step["layout"] for lane in self.lanes if lane.step is not None]

    def check_tree(self, tree: Tree, lane: Lane | None = None) -> None:
        width = lane.width if lane is not None else self.lanes[0].width
        message = tree_limits_error(tree, self.n_batch, width, "llama.cpp (per batched request)")
        if message:
            raise RedwoodError(message)

    # -- one decode for many lanes -----------------------------------------------------
    def decode(self, jobs: Sequence[Append | TreeNodes], copy: bool = True) -> list[torch.Tensor]:
        """Run every job in one `llama_decode`; returns each job's logits [rows, V] (float32
        copies), in job order. Nothing changes unless every job is valid and fits. copy=False:
        views of llama.cpp's output buffer instead (rows in batch order are zero-copy slices),
        valid until the next decode on this context: the scheduler's target step reads them
        all before that, and the 0.6 MB copy per row cost ~0.2 ms of a plain step."""
        self._check_jobs(jobs)
        if jobs and all(one_token(j) for j in jobs):
            n = self._decode_tokens(jobs)
            if not copy:
                return list(self.backend._logits_row_tensors(n))
            logits = torch.from_numpy(np.array(self.backend._logits_view(n)))
            return [logits[i:i + 1] for i in range(n)]
        prepared = [self._prepare(job) for job in jobs]
        total = sum(len(p.ids) for p in prepared)
        self._check_fits(total)
        out = [torch.empty(0, self.vocab_size) for _ in jobs]
        if total == 0:
            return out
        for p in prepared:
            if p.first:                       # branch the prefix into the tree's leaf ids
                lane = p.job.lane
                for k in range(1, p.step["layout"].n_leaves):
                    self.backend._llama.llama_memory_seq_cp(self.backend._mem, lane.base,
                                                            lane.base + k, -1, -1)
                lane.step = p.step
        outputs = np.concatenate([p.outputs for p in prepared])
        self.backend._batch.fill_tree(np.concatenate([p.ids for p in prepared]),
                                      np.concatenate([p.positions for p in prepared]),
                                      [s for p in prepared for s in p.seqs], outputs)
        try:
            self.backend._decode(f"a batched decode of {total} tokens for {len(jobs)} requests")
        except BaseException:
            self._roll_back(prepared)
            raise
        for p in prepared:
            self._commit(p)
        rows, logits = int(outputs.sum()), None
        if rows:
            logits = self.backend._logits(rows) if copy else \
                torch.from_numpy(self.backend._logits_view(rows))
        start = 0
        for i, p in enumerate(prepared):
            kept = np.flatnonzero(p.outputs)          # this job's output rows, batch order
            if p.rows:
                out[i] = take_rows(logits, start + np.searchsorted(kept, p.rows))
            start += len(kept)
        return out

    def decode_rows(self, jobs: Sequence[Append]) -> list[np.ndarray]:
        """decode() of one token per lane with its logits (Append(lane, [int], rows=1) each:
        every plain step of the batch), returning each job's row [V] as a numpy view of
        llama.cpp's buffer, valid until the next decode on this context. Skips the tensors
        that decode(copy=False) wraps the rows in: ~0.1 ms right after a decode."""
        if not jobs or not all(one_token(j) for j in jobs):
            raise RedwoodError("decode_rows takes one Python-int token with its row per job")
        self._check_jobs(jobs)
        return self.backend._logits_rows(self._decode_tokens(jobs))

    def _decode_tokens(self, jobs: Sequence[Append]) -> int:
        """Run one token per lane (the short path of decode and decode_rows): the batch filled
        through ctypes, no per-job numpy arrays (the general path's cost ~0.35 ms of a 35 ms
        step outside llama_decode right after a decode: cold caches); same checks, same batch.
        Returns the rows decoded (job order)."""
        rows = []
        for job in jobs:
            lane, token = job.lane, job.ids[0]
            self._check_held(lane)
            self._check_no_tree(lane)
            if not 0 <= token < self.vocab_size:
                raise self.backend._out_of_range(token)
            rows.append((token, lane.length, lane.base))
        self._check_fits(len(rows))
        self.backend._batch.fill_tokens(rows)
        try:
            self.backend._decode(f"a batched decode of {len(rows)} tokens for {len(rows)} "
                                 "requests")
        except BaseException:
            for job in jobs:
                self.backend._llama.llama_memory_seq_rm(self.backend._mem, job.lane.base,
                                                        job.lane.length, -1)
            raise
        for job in jobs:
            job.lane.length += 1
            job.lane.tokens.append(job.ids[0])
        return len(rows)

    def _check_jobs(self, jobs) -> None:
        """The context is open and no lane has two jobs (decode and decode_rows)."""
        self.backend._live()
        if len({id(job.lane) for job in jobs}) != len(jobs):
            raise RedwoodError("decode: at most one job per lane per decode")

    def _check_held(self, lane: Lane) -> None:
        if not lane.busy or lane not in self.lanes:
            raise RedwoodError("decode: the job's lane is not held in this context")

    @staticmethod
    def _check_no_tree(lane: Lane) -> None:
        if lane.step is not None:
            raise RedwoodError("append with tentative tree nodes pending: call keep_path first")

    def _check_fits(self, total: int) -> None:
        """A decode of `total` new tokens fits one batch and the KV cache."""
        if total > self.n_batch:
            raise RedwoodError(f"decode of {total} tokens exceeds n_batch = {self.n_batch}")
        if self.used_cells() + total > self.n_ctx:
            raise RedwoodError(f"KV cache full: {self.used_cells()} cells in use + {total} new "
                               f"> n_ctx = {self.n_ctx}")

    def _prepare(self, job) -> Prepared:
        self._check_held(job.lane)
        if isinstance(job, Append):
            self._check_no_tree(job.lane)
            return prepare_append(job, self.backend._token_ids(job.ids))
        if isinstance(job, TreeNodes):
            self.check_tree(job.tree, job.lane)
            layout = self._layouts.get(job.tree, self._live_layouts())
            return prepare_tree(job, layout, self.backend._token_ids(job.tokens))
        raise RedwoodError(f"decode: unknown job {type(job).__name__}")

    def _commit(self, p: Prepared) -> None:
        lane = p.job.lane
        if isinstance(p.job, Append):
            lane.length += len(p.ids)
            lane.tokens.extend(p.ids.tolist())
        else:
            p.step["ran"].update(int(u) for u in p.job.nodes)
            p.step["tokens"].update(zip((int(u) for u in p.job.nodes), p.ids.tolist()))
            p.step["cells"] += len(p.ids)

    def _roll_back(self, prepared: list[Prepared]) -> None:
        """After a failed decode: drop the appended tokens and the lanes' whole tentative step."""
        seq_rm, mem = self.backend._llama.llama_memory_seq_rm, self.backend._mem
        for p in prepared:
            if isinstance(p.job, Append):
                seq_rm(mem, p.job.lane.base, p.extra["start"], -1)
            else:
                self.drop_tentative(p.job.lane)

    # -- compaction --------------------------------------------------------------------
    def keep_path(self, lane: Lane, nodes: Sequence[int]) -> None:
        """Commit the lane's tentative `nodes` (a chain from the root, or from a child of the
        committed root) and drop its other tentative nodes (Backend.keep_path, per lane)."""
        self.backend._live()
        nodes = [int(u) for u in nodes]
        if not nodes:
            self.drop_tentative(lane)
            return
        step = lane.step
        if step is None:
            raise RedwoodError("keep_path: no tree nodes have been run since the last keep_path")
        check_path(step, nodes)
        last = nodes[-1]
        position = step["root"] + int(step["layout"].depths[last])
        keep = lane.base + int(step["layout"].seqs[last][0])    # a leaf id through the path
        llama, mem = self.backend._llama, self.backend._mem
        llama.llama_memory_seq_rm(mem, keep, position + 1, -1)
        for k in range(step["layout"].n_leaves):                # only this lane's ids
            if lane.base + k != keep:
                llama.llama_memory_seq_rm(mem, lane.base + k, -1, -1)
        if keep != lane.base:                                   # move the path back to base
            llama.llama_memory_seq_cp(mem, keep, lane.base, -1, -1)
            llama.llama_memory_seq_rm(mem, keep, -1, -1)
        lane.tokens.extend(step["tokens"][u] for u in nodes)
        lane.length, lane.step = position + 1, None

    def drop_tentative(self, lane: Lane) -> None:
        """Drop every tentative node of the lane (its committed prefix stays)."""
        if lane.step is None:
            return
        llama, mem = self.backend._llama, self.backend._mem
        for k in range(1, lane.step["layout"].n_leaves):
            llama.llama_memory_seq_rm(mem, lane.base + k, -1, -1)
        llama.llama_memory_seq_rm(mem, lane.base, lane.length, -1)
        lane.step = None

    def truncate(self, lane: Lane, length: int) -> None:
        """Drop the lane's tentative nodes and its committed tokens from `length` on (undoing a
        step that failed half-way)."""
        self.drop_tentative(lane)
        if 0 <= length < lane.length:
            self.backend._llama.llama_memory_seq_rm(self.backend._mem, lane.base, length, -1)
            lane.length, lane.tokens = length, lane.tokens[:length]
