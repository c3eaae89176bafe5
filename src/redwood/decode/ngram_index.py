"""An n-gram index over a token stream (prompt + generated text), for deterministic drafts.

`NgramIndex` maps every n-gram (min_n <= n <= max_n) to the stream positions where it *ended*,
appended as tokens arrive: one dict update per n per token, never a rescan of the context, so a
long pasted file costs O(len) once and each lookup costs O(max_occurrences * max_length), not
O(len). `candidates` returns what followed earlier occurrences of the current suffix;
`build_trie` (decode/ngram_trie.py) merges them into the tree a drafter proposes
(docs/design.md §4.5).

Pure python: no torch.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

MAX_MATCH = 32          # match lengths are told apart up to here (the drafter buckets 16-31, 32+)
# Ranking credit of an occurrence where the copy is expected to go on (NgramIndex.occurrences'
# `near` window): it outranks an occurrence elsewhere unless that one matches 8 tokens longer.
NEAR_BONUS = 8


@dataclass(frozen=True)
class Continuation:
    """What followed earlier occurrences of the current suffix.

    tokens: the continuation (as long as the text allows, up to max_length);
    match: the longest suffix match among its occurrences (how many tokens before it equal
        the text's last ones; min_n..max_match: it may exceed max_n, the indexed n-grams);
    count: how many considered occurrences it followed;
    last: the end position of its most recent occurrence (larger = more recent);
    near: one of its occurrences lies in the lookup's `near` window (where the text is
        being copied from: NgramIndex.occurrences);
    start: the stream position of tokens[0] at that near occurrence, else at the most recent
        one (None for a memory's continuation: another stream). Not part of equality;
    edited_at: set on a continuation rewritten by an edit rule (decode/ngram_edits.py): the
        index of its first changed token;
    own: every occurrence it followed lies in the generated text (at or after the index's
        `prompt_end`): the answer repeating itself, not copying its prompt."""
    tokens: tuple[int, ...]
    match: int
    count: int
    last: int
    near: bool = False
    start: int | None = field(default=None, compare=False)
    edited_at: int | None = None
    own: bool = False

    def rank_key(self):
        """Sort key, best first: longer match (a near one counts NEAR_BONUS tokens longer,
        and wins ties), then more often, then more recently."""
        return (-(self.match + NEAR_BONUS * self.near), not self.near, -self.count, -self.last)


class NgramIndex:
    """positions[n][gram] = end positions (ascending) of every occurrence of the n-gram `gram`.

    Which occurrences a lookup considers (the definition the brute-force test replays): for
    n = max_n down to min_n, take the `max_occurrences` most recent occurrences of the last n
    tokens that end before the last token; skip those already taken at a longer n. An
    occurrence's match length is how far the text before it agrees with the text's end: the
    common suffix of the two, at least the n it was taken at, capped at max_match. Only
    n-grams up to max_n are indexed; the match is extended by comparing tokens backwards
    (at most max_match per occurrence), so a 30-token match, which predicts a long copy, is
    told from a 6-token one.
    """

    def __init__(self, min_n: int = 1, max_n: int = 6, max_occurrences: int = 32,
                 max_match: int = MAX_MATCH):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        if max_occurrences < 1:
            raise ValueError(f"max_occurrences must be >= 1, got {max_occurrences}")
        if max_match < max_n:
            raise ValueError(f"max_match must be >= max_n ({max_n}), got {max_match}")
        self.min_n, self.max_n, self.max_occurrences = min_n, max_n, max_occurrences
        self.max_match = max_match
        self.tokens: list[int] = []
        self.positions: dict[int, dict[tuple[int, ...], list[int]]] = {
            n: {} for n in range(min_n, max_n + 1)}
        self.entries = 0                  # positions stored in all: linear in len(tokens)
        self.prompt_end: int | None = None  # where the generated text starts (None: unknown)
        # occurrences()'s last ((length, near), result): the copy tracker and the lookup ask
        # for the same suffix's in one step (a plain chat step paid the scan twice)
        self._memo: tuple | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens) -> None:
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        """Add one token: record the n-grams ending at it (O(max_n^2) work, whatever the length)."""
        self.tokens.append(int(token))
        end = len(self.tokens) - 1
        for n in range(self.min_n, min(self.max_n, end + 1) + 1):
            gram = tuple(self.tokens[end - n + 1:])
            self.positions[n].setdefault(gram, []).append(end)
            self.entries += 1

    def occurrences(self, near: tuple[int, int] | None = None) -> list[tuple[int, int, bool]]:
        """(end position, match length, is near) of the considered earlier occurrences of
        the suffix, longest n-gram first, most recent first within one.

        near = (lo, hi): occurrences ending in lo..hi are considered too, however old (an
        edit's copy resumes there after a rename or an insertion, while a common n-gram has
        hundreds of more recent occurrences elsewhere), and flagged as near. The list is
        shared with the next caller at the same length and window: do not change it."""
        key = (len(self.tokens), near)
        if self._memo is not None and self._memo[0] == key:
            return self._memo[1]
        tokens, last = self.tokens, len(self.tokens) - 1
        taken: set[int] = set()
        found = []
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            ends = self.positions[n].get(tuple(tokens[len(tokens) - n:]), [])
            # ends[-1] is the suffix itself (it ends at `last`): the K before it.
            recent = ends[-self.max_occurrences - 1:-1] if ends and ends[-1] == last else []
            for end in list(reversed(recent)) + _in_window(ends, near, last):
                if end not in taken:
                    taken.add(end)
                    found.append((end, common_suffix(tokens, end, tokens, last, n,
                                                     self.max_match),
                                  near is not None and near[0] <= end <= near[1]))
        self._memo = (key, found)
        return found

    def candidates(self, max_continuations: int, max_length: int,
                   near: tuple[int, int] | None = None) -> list[Continuation]:
        """The best `max_continuations` distinct continuations of the current suffix, each
        the up-to-`max_length` tokens that followed an occurrence; ranked near first (see
        `occurrences`), then by match length, count and recency (`Continuation.rank_key`).
        Empty when nothing matches."""
        if max_continuations < 1 or max_length < 1:
            return []
        return rank_continuations(self.tokens, self.occurrences(near), max_continuations,
                                  max_length, self.prompt_end)


def _in_window(ends: list[int], near: tuple[int, int] | None, last: int) -> list[int]:
    """The end positions (ascending `ends`) in the window near = (lo, hi), before `last`."""
    if near is None:
        return []
    out, i = [], bisect_left(ends, near[0])
    while i < len(ends) and ends[i] <= near[1] and ends[i] < last:
        out.append(ends[i])
        i += 1
    return out


def common_suffix(stream, end: int, text, last: int, known: int, limit: int) -> int:
    """How many tokens ending at stream[end] equal those ending at text[last] (both lists),
    given that the last `known` do; at most `limit`, never past either's start nor across a
    None (a memory's stream separator)."""
    m = known
    while m < limit and end - m >= 0 and last - m >= 0:
        token = stream[end - m]
        if token is None or token != text[last - m]:
            break
        m += 1
    return m


def rank_continuations(tokens, occurrences, max_continuations: int, max_length: int,
                       prompt_end: int | None = None) -> list[Continuation]:
    """Group occurrences [(end, match, near)] by what followed them; rank the groups. A
    group's start is that of its near occurrence if it has one, else of its most recent; it is
    `own` when every occurrence ends at or after prompt_end (None: never)."""
    # continuation -> [match, count, last, near, start, own]
    groups: dict[tuple[int, ...], list] = {}
    for end, match, near in occurrences:
        follow = tuple(tokens[end + 1:end + 1 + max_length])
        own = prompt_end is not None and end >= prompt_end
        stats = groups.get(follow)
        if stats is None:
            groups[follow] = [match, 1, end, near, end + 1, own]
            continue
        if near and not stats[3]:
            stats[3], stats[4] = True, end + 1
        elif not stats[3] and end + 1 > stats[4]:
            stats[4] = end + 1
        stats[0], stats[1], stats[2] = max(stats[0], match), stats[1] + 1, max(stats[2], end)
        stats[5] = stats[5] and own
    ranked = sorted((Continuation(follow, match, count, last, near, start, own=own)
                     for follow, (match, count, last, near, start, own) in groups.items()),
                    key=Continuation.rank_key)
    return ranked[:max_continuations]
