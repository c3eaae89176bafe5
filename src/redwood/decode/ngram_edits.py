"""`CopyTracker`: where an edit's answer is copying from, and the changes it made so far.

An edit that returns the file ("rename f to f_checked everywhere", "replace print with
logging") copies its source except at a few places, and usually makes the *same* change at
every place: each `f(` becomes `f_checked(`. An n-gram lookup drafts the source verbatim, so
every such place breaks the draft, and right after it the suffix is short and common, so the
lookup picks an arbitrary occurrence. The tracker follows the copy from the text alone:

- cursor (src, txt): text position txt was copied from stream position src (the stream is
  the request's prompt + text so far, NgramIndex.tokens). Each new token that equals
  stream[src + 1] advances both; one that does not opens an edit at the cursor.
- an open edit is closed when the text's last tokens (at least RESYNC of them, all written
  after the edit opened) equal the stream ending within `window` tokens after the cursor: the
  copy resumed there. The source span skipped S and the text written instead Y become a rule
  "after these source tokens, S reads Y" (a rename is S empty, Y = `_checked`; a
  replacement both non-empty). A rule first needs only its last `context` tokens to apply
  (a renamed one-token identifier is preceded by anything); where the text then copies S
  verbatim after the same tokens, the rule was too loose (`triples_sum_to_zero` renamed,
  `pairs_sum_to_zero` not): it needs one token more than that place shares with it, and is
  dropped when it has none left (MAX_CONTEXT).
- with no copy to follow (at the start, or an edit never closed within the window), the
  cursor anchors on the longest earlier occurrence of the text's suffix once it is at least
  ANCHOR tokens long.

`near()` is the window where the copy is expected to resume (NgramIndex.occurrences ranks
occurrences there first); `splice()` rewrites a continuation read from the stream with the
rules, so the draft carries the edit through the next place it applies. Everything here
depends on the text already emitted only, so proposals stay point masses fixed before
verification (exactness, docs/design.md §4.5).

Pure python: no torch.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from redwood.decode.ngram_index import Continuation, NgramIndex, common_suffix

RESYNC = 2          # tokens that must match again before an edit counts as closed
ANCHOR = 8          # a suffix match this long anchors the cursor where nothing is followed
MAX_EDIT = 16       # longest S or Y kept as a rule (longer: a rewrite, not a repeated edit)
MAX_CONTEXT = 8     # source tokens kept before a rule's span
MAX_RULES = 64      # the most recent rules kept


@dataclass
class EditRule:
    """After `context` (its last `needs` tokens must match), the source's `skipped` reads
    `written` in the text."""
    context: tuple[int, ...]
    skipped: tuple[int, ...]
    written: tuple[int, ...]
    needs: int

    def applies(self, tokens: list[int], at: int) -> bool:
        """Whether the rule applies to the stream at position `at` (its span starts there)."""
        k = self.needs
        return at >= k and tuple(tokens[at - k:at]) == self.context[-k:] and \
            tuple(tokens[at:at + len(self.skipped)]) == self.skipped


class CopyTracker:
    def __init__(self, window: int = 16, context: int = 1):
        if window < 1 or not 1 <= context <= MAX_CONTEXT:
            raise ValueError(f"need window >= 1 and 1 <= context <= {MAX_CONTEXT}, "
                             f"got {window}, {context}")
        self.window, self.context = int(window), int(context)
        self.reset()

    def reset(self) -> None:
        """A new request: its own cursor; rules learnt on another text do not carry over."""
        self.cursor: tuple[int, int] | None = None       # (src, txt): txt was copied from src
        self.open = False                                # an edit is open at the cursor
        self.rules: dict[int, list[EditRule]] = {}       # by the context's last token
        self._order: list[EditRule] = []                 # oldest first

    def near(self) -> tuple[int, int] | None:
        """Stream positions (lo, hi) where an occurrence of the suffix continues the copy: the
        cursor itself while the text follows it, the window after it while an edit is open;
        None without a cursor."""
        if self.cursor is None:
            return None
        src = self.cursor[0]
        return src + self.open, src + self.window

    def step(self, index: NgramIndex) -> None:
        """The text grew (its newest token is index.tokens[-1]): follow it."""
        tokens, last = index.tokens, len(index.tokens) - 1
        if self.cursor is not None and not self.open:
            src, txt = self.cursor
            while txt < last and src + 1 < txt + 1 and tokens[src + 1] == tokens[txt + 1]:
                src, txt = src + 1, txt + 1
                self._check_rules(tokens, src)
            self.cursor, self.open = (src, txt), txt < last
        if self.open and self._resync(tokens, last):
            return
        if self.cursor is None or self.open:
            best = max(index.occurrences(), key=lambda o: (o[1], o[0]), default=None)
            if best is not None and best[1] >= ANCHOR:
                self.cursor, self.open = (best[0], last), False

    def rule_at(self, tokens: list[int], at: int) -> EditRule | None:
        """The newest rule that applies at stream position `at`."""
        for rule in reversed(self.rules.get(tokens[at - 1], []) if at > 0 else []):
            if rule.applies(tokens, at):
                return rule
        return None

    def _check_rules(self, tokens: list[int], at: int) -> None:
        """The text copied stream[at] verbatim: each rule that would have changed it there
        was too loose; it now needs one context token more than this place shares with it."""
        for rule in list(self.rules.get(tokens[at - 1], []) if at > 0 else []):
            after = at + len(rule.skipped)               # what the rule says comes at `at`
            said = rule.written[0] if rule.written else \
                (tokens[after] if after < len(tokens) else None)
            if not rule.applies(tokens, at) or said == tokens[at]:
                continue
            k = len(rule.context)
            rule.needs = common_suffix(tokens, at - 1, rule.context, k - 1, 0, k) + 1
            if rule.needs > len(rule.context):
                self._drop(rule)

    def _resync(self, tokens: list[int], last: int) -> bool:
        """Close the open edit if the copy resumed in the window: learn its rule, move the
        cursor there. The longest match wins, then the earliest position."""
        src, txt = self.cursor
        best_m, best_e = 0, None
        for e in range(src + 1, min(src + self.window, last - 1) + 1):
            m = common_suffix(tokens, e, tokens, last, 0, min(last - txt, e - src))
            if m > best_m:
                best_m, best_e = m, e
        if best_m < RESYNC:
            return False
        skipped = tuple(tokens[src + 1:best_e - best_m + 1])
        written = tuple(tokens[txt + 1:last - best_m + 1])
        if (skipped or written) and len(skipped) <= MAX_EDIT and len(written) <= MAX_EDIT:
            context = tuple(tokens[max(0, src - MAX_CONTEXT + 1):src + 1])
            self._add(EditRule(context, skipped, written, min(self.context, len(context))))
        self.cursor, self.open = (best_e, last), False
        return True

    def _add(self, rule: EditRule) -> None:
        for old in list(self.rules.get(rule.context[-1], [])):
            if old.context == rule.context and old.skipped == rule.skipped:
                self._drop(old)                          # relearnt: the new one replaces it
        self.rules.setdefault(rule.context[-1], []).append(rule)
        self._order.append(rule)
        while len(self._order) > MAX_RULES:
            self._drop(self._order[0])

    def _drop(self, rule: EditRule) -> None:
        self._order.remove(rule)
        mine = self.rules[rule.context[-1]]
        mine.remove(rule)
        if not mine:
            del self.rules[rule.context[-1]]

    def with_edits(self, tokens: list[int], continuations: list[Continuation],
                   max_length: int) -> list[Continuation]:
        """The continuations, each one a rule rewrites preceded by its rewritten form."""
        out = []
        for item in continuations:
            spliced = self.splice(tokens, item, max_length)
            out += [item] if spliced is None else [spliced, item]
        return out

    def splice(self, tokens: list[int], continuation: Continuation,
               max_length: int) -> Continuation | None:
        """The continuation with every rule applied where it applies, read on from the
        stream past each skipped span; None if no rule applies (or it has no stream
        position: a memory's). `edited_at` is the index of its first changed token."""
        if not self.rules or continuation.start is None:
            return None
        start, rules = continuation.start, self.rules
        end = min(len(tokens), start + max_length)
        # up to the first position a rule applies at, the continuation is the stream's text
        first = next((at for at in range(max(start, 1), end) if tokens[at - 1] in rules
                      and self.rule_at(tokens, at) is not None), None)
        if first is None:
            return None
        out, at, edited_at, just = tokens[start:first], first, None, False
        while len(out) < max_length and at < len(tokens):
            rule = None if just else self.rule_at(tokens, at)
            if rule is not None:
                edited_at = len(out) if edited_at is None else edited_at
                out.extend(rule.written)
                at, just = at + len(rule.skipped), True
                continue
            out.append(tokens[at])
            at, just = at + 1, False
        if edited_at is None or edited_at >= max_length:
            return None
        return replace(continuation, tokens=tuple(out[:max_length]), edited_at=edited_at)
