"""`NgramMemory`: a bounded store of earlier responses, so the n-gram drafter can draft from them.

A server that answers similar requests (an agent loop repeating its tool-call format, the same
file edited again) writes text it has written before, but `NgramIndex` only sees the current
request. The memory keeps the generated tokens of finished requests, one *stream* per request,
and an index n-gram -> occurrences over them, so a lookup also finds what followed the current
suffix in earlier answers: the "global cache of earlier responses" of SuffixDecoding
(arXiv 2411.04975), and llama-server's ngram-mod pool kept across requests.

Bounded: at most `max_tokens` tokens are kept; adding a stream evicts whole oldest streams
(FIFO) with their index entries, so `tokens` <= max_tokens and `entries` <=
(max_n - min_n + 1) * tokens at all times. A stream longer than max_tokens keeps its last
max_tokens tokens. In CPython that is up to ~1.5 KB per token when every n-gram is distinct
(~100 MB at the default 65536 tokens, max_n 6), less on repetitive text; adding costs ~10 µs
per token, eviction included, once per request.

Exactness is untouched: the memory changes only between requests (`add`), so within a request
the drafter's proposals remain point masses fixed by the prefix and the drafter's own state
(docs/design.md §4.5).

Pure python: no torch.
"""
from __future__ import annotations

from bisect import bisect_left
from collections import deque

from redwood.decode.ngram_index import MAX_MATCH, Continuation, common_suffix
from redwood.errors import RedwoodError

SEPARATOR = None             # between streams in the flat buffer: continuations stop there


class NgramMemory:
    """Earlier token streams and positions[n][gram] = global positions (ascending) where `gram`
    ended, for every n-gram (min_n <= n <= max_n) that has at least one token after it in its
    stream (an n-gram ending a stream has nothing to propose).

    Layout: every stored stream sits in one flat buffer, each followed by SEPARATOR; a global
    position g is buffer index g - offset and only grows, so positions order occurrences by
    recency (newer stream, then later in it) and eviction drops a prefix of the buffer and of
    every occurrence list.

    Not thread-safe and needs no lock as used: the server calls `add` (through
    NgramDrafter.finish/prefill) from its one worker thread only, the thread that also looks up.
    """

    def __init__(self, max_tokens: int = 65536, min_n: int = 1, max_n: int = 6,
                 max_occurrences: int = 32, max_match: int = MAX_MATCH):
        if max_tokens < 1:
            raise RedwoodError(f"max_tokens must be >= 1, got {max_tokens}")
        if not 1 <= min_n <= max_n:
            raise RedwoodError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        if max_occurrences < 1:
            raise RedwoodError(f"max_occurrences must be >= 1, got {max_occurrences}")
        self.max_tokens, self.min_n, self.max_n = int(max_tokens), min_n, max_n
        if max_match < max_n:
            raise RedwoodError(f"max_match must be >= max_n ({max_n}), got {max_match}")
        self.max_occurrences, self.max_match = max_occurrences, int(max_match)
        self.positions: dict[int, dict[tuple[int, ...], list[int]]] = {
            n: {} for n in range(min_n, max_n + 1)}
        self.buffer: list[int | None] = []       # streams, each followed by SEPARATOR
        self.offset = 0                          # global position of buffer[0]
        self.lengths: deque[int] = deque()       # stored streams' lengths, oldest first
        self.tokens = 0                          # tokens stored (separators not counted)
        self.entries = 0                         # occurrences indexed in all

    def __len__(self) -> int:
        """How many streams are stored."""
        return len(self.lengths)

    @property
    def end(self) -> int:
        """The global position the next stream starts at."""
        return self.offset + len(self.buffer)

    def streams(self) -> list[list[int]]:
        """The stored streams, oldest first (a copy, for inspection and tests)."""
        out, at = [], 0
        for length in self.lengths:
            out.append(list(self.buffer[at:at + length]))
            at += length + 1
        return out

    # -- adding and evicting -----------------------------------------------------------------
    def add(self, tokens) -> None:
        """Store one finished stream (a request's generated tokens), evicting the oldest
        streams while the total would exceed max_tokens. Empty streams are ignored."""
        stream = [int(t) for t in tokens][-self.max_tokens:]
        if not stream:
            return
        while self.lengths and self.tokens + len(stream) > self.max_tokens:
            self._evict_oldest()
        start = self.end
        self.buffer.extend(stream)
        self.buffer.append(SEPARATOR)
        self.lengths.append(len(stream))
        self.tokens += len(stream)
        for n, table in self.positions.items():
            for end in range(n - 1, len(stream) - 1):
                table.setdefault(tuple(stream[end - n + 1:end + 1]), []).append(start + end)
        self.entries += sum(max(0, len(stream) - n) for n in self.positions)

    def _evict_oldest(self) -> None:
        """Drop the oldest stream and its occurrences: they are the first entries of their
        lists (positions ascend), so each list loses a prefix; emptied grams are removed."""
        length = self.lengths.popleft()
        stream = self.buffer[:length]
        stop = self.offset + length                  # positions below this are the stream's
        for n, table in self.positions.items():
            for end in range(n - 1, length - 1):
                gram = tuple(stream[end - n + 1:end + 1])
                ends = table.get(gram)
                if ends is None or ends[0] >= stop:  # this gram's entries already dropped
                    continue
                keep = bisect_left(ends, stop)
                self.entries -= keep
                if keep == len(ends):
                    del table[gram]
                else:
                    del ends[:keep]
        del self.buffer[:length + 1]
        self.offset += length + 1
        self.tokens -= length

    # -- lookup --------------------------------------------------------------------------------
    def occurrences(self, suffix) -> list[tuple[int, int]]:
        """(global end position, match length) of the considered occurrences of `suffix`'s
        tail: for n = max_n down to min_n, the max_occurrences most recent occurrences of its
        last n tokens, skipping those taken at a longer n (NgramIndex's definition; the
        current text is not in the memory, so no occurrence is the suffix itself). The match
        is the common suffix of `suffix` and the stream up to the occurrence (within its
        stream), capped at max_match: pass the text's last max_match tokens to tell long
        matches apart."""
        suffix = [int(t) for t in suffix][-self.max_match:]
        taken: set[int] = set()
        found, last = [], len(suffix) - 1
        for n in range(min(self.max_n, len(suffix)), self.min_n - 1, -1):
            ends = self.positions[n].get(tuple(suffix[len(suffix) - n:]), [])
            for end in reversed(ends[-self.max_occurrences:]):
                if end not in taken:
                    taken.add(end)
                    match = common_suffix(self.buffer, end - self.offset, suffix, last, n,
                                          self.max_match)
                    found.append((end, match))
        return found

    def follow(self, end: int, max_length: int) -> tuple[int, ...]:
        """The up-to-max_length tokens after global position `end`, within its stream."""
        at = end - self.offset + 1
        out = self.buffer[at:at + max_length]
        if SEPARATOR in out:
            del out[out.index(SEPARATOR):]
        return tuple(out)

    def candidates(self, suffix, max_continuations: int, max_length: int) -> list[Continuation]:
        """The best max_continuations distinct continuations of `suffix` in the stored streams,
        ranked as NgramIndex.candidates (match, count, recency). `last` is the most recent
        occurrence's position minus `end`: negative, so a memory hit ranks as older than any
        occurrence in the current request (positions >= 0) and ties go to the request's text."""
        if max_continuations < 1 or max_length < 1:
            return []
        groups: dict[tuple[int, ...], list[int]] = {}    # continuation -> [match, count, last]
        for end, match in self.occurrences(suffix):
            follow = self.follow(end, max_length)
            stats = groups.get(follow)
            if stats is None:
                groups[follow] = [match, 1, end - self.end]
            else:
                stats[0], stats[1] = max(stats[0], match), stats[1] + 1
                stats[2] = max(stats[2], end - self.end)
        ranked = sorted((Continuation(follow, *stats) for follow, stats in groups.items()),
                        key=Continuation.rank_key)
        return ranked[:max_continuations]


def merge_continuations(ours: list[Continuation], theirs: list[Continuation],
                        max_continuations: int) -> list[Continuation]:
    """The best max_continuations of two ranked lists (the request's, the memory's), equal
    continuations merged (longest match, counts added, most recent last). Sorting is stable
    and the request's `last` values exceed the memory's, so on equal match and count the
    request's continuation comes first."""
    merged: dict[tuple[int, ...], Continuation] = {}
    for item in list(ours) + list(theirs):
        seen = merged.get(item.tokens)
        merged[item.tokens] = item if seen is None else Continuation(
            item.tokens, max(seen.match, item.match), seen.count + item.count,
            max(seen.last, item.last), seen.near or item.near,
            seen.start if seen.start is not None else item.start,
            own=seen.own and item.own)
    return sorted(merged.values(), key=Continuation.rank_key)[:max_continuations]
