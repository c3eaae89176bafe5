"""The copy tracker (decode/ngram_edits.py): it follows where an edit's answer copies from,
learns the edit it makes, carries it into the next draft, and tightens a rule that applied
where the text did not make the edit."""
import torch

from redwood.decode.drafter import ChildChooser
from redwood.decode.layout import TreeLayout
from redwood.decode.ngram_drafter import COPY_DEPTH, NgramDrafter
from redwood.decode.ngram_trees import ngram_budget_tree
from redwood.decode.ngram_edits import CopyTracker, EditRule
from redwood.decode.ngram_index import Continuation, NgramIndex

# A "module" of integer tokens: a preamble long enough to anchor the copy (ANCHOR), then the
# identifier F = (7, 8) three times, after different tokens; G = (6, 8) shares F's last
# token. The answer renames F to F + (50,).
SOURCE = list(range(101, 111)) + [1, 2, 7, 8, 30, 31, 32, 33, 34, 35, 3, 7, 8, 40, 41, 42, 43, 44,
          4, 6, 8, 60, 61, 62, 5, 7, 8, 70, 71, 72, 73]
SEPARATOR = [99, 98]


def renamed(tokens):
    out = []
    for i, token in enumerate(tokens):
        out.append(token)
        if token == 8 and tokens[i - 1] == 7:
            out.append(50)
    return out


def follow(tracker, text):
    """Feed the tracker the text one token at a time, as a drafter's steps would."""
    index = NgramIndex(1, 6, 32)
    for token in text:
        index.append(token)
        tracker.step(index)
    return index


def test_a_rename_becomes_a_rule_and_the_cursor_follows_the_copy():
    tracker = CopyTracker()
    answer = renamed(SOURCE)
    stop = answer.index(41) + 1                         # F's second site and 2 tokens: resynced
    follow(tracker, SOURCE + SEPARATOR + answer[:stop])
    rules = [rule for mine in tracker.rules.values() for rule in mine]
    assert [(rule.skipped, rule.written) for rule in rules] == [((), (50,))] * len(rules)
    assert len(rules) == 2                              # one per site: after (2, 7, 8), (3, 7, 8)
    assert tracker.cursor == (SOURCE.index(41), len(SOURCE) + len(SEPARATOR) + stop - 1)
    assert not tracker.open


def test_the_rule_is_carried_into_a_continuation_read_from_the_source():
    tracker = CopyTracker(context=2)                    # (7, 8): G = (6, 8) does not match
    answer = renamed(SOURCE)
    stop = answer.index(41) + 1
    index = follow(tracker, SOURCE + SEPARATOR + answer[:stop])
    start = SOURCE.index(4)                             # ... 4 6 8 60 ... 5 7 8 70 ...
    verbatim = Continuation(tuple(SOURCE[start:start + 12]), 3, 1, start - 1, start=start)
    spliced = tracker.splice(index.tokens, verbatim, 12)
    assert spliced.tokens == (4, 6, 8, 60, 61, 62, 5, 7, 8, 50, 70, 71)
    assert spliced.edited_at == 9                       # G (6, 8) is left alone: 8 after 6
    assert tracker.splice(index.tokens, Continuation((9,), 1, 1, 0), 4) is None   # no position


def test_a_rule_that_applied_where_the_text_did_not_edit_is_tightened():
    """The text copies G = (6, 8) verbatim, after which a context-1 rule "after 8 insert 50"
    would fire: each such rule now needs what G's place does not share with it."""
    tracker = CopyTracker(context=1)
    answer = renamed(SOURCE)
    stop = answer.index(41) + 1
    index = follow(tracker, SOURCE + SEPARATOR + answer[:stop])
    assert tracker.rule_at(index.tokens, SOURCE.index(60)) is not None     # 8 then 60: fires
    follow_on = answer[stop:answer.index(62) + 1]                          # through "6 8 60 61 62"
    for token in follow_on:
        index.append(token)
        tracker.step(index)
    assert tracker.rule_at(index.tokens, SOURCE.index(60)) is None         # G: not any more
    assert tracker.rule_at(index.tokens, SOURCE.index(70)) is not None     # F at its third site
    assert all(rule.needs == 2 for mine in tracker.rules.values() for rule in mine)


def test_rules_need_their_context_and_are_bounded():
    rule = EditRule(context=(3, 7, 8), skipped=(), written=(50,), needs=2)
    assert rule.applies([3, 7, 8, 40], 3) and not rule.applies([4, 6, 8, 40], 3)
    tracker = CopyTracker()
    for i in range(100):
        tracker._add(EditRule((i,), (), (i + 1,), 1))
    assert sum(len(mine) for mine in tracker.rules.values()) == 64
    assert 0 not in tracker.rules and 99 in tracker.rules                 # the oldest went first


def drive(drafter, prompt, text, depth=COPY_DEPTH):
    """Prefill `prompt`, then emit `text` through plain steps (propose, keep nothing), as a
    request would one token at a time; returns the proposal at text's last token."""
    layout = TreeLayout.build(ngram_budget_tree(depth=depth), "cpu")
    drafter.prefill(torch.tensor(prompt))
    for token in text[:-1]:
        proposal = drafter.propose(token, layout, ChildChooser(True))
        drafter.commit([0], proposal.tokens)
    return drafter.propose(text[-1], layout, ChildChooser(True))


def first_path(proposal) -> list[int]:
    """The tokens along the first-ranked child at every level."""
    tokens, parents = proposal.tokens.tolist(), proposal.layout.tree.parents
    chain, at = [], 0
    while True:
        kids = [u for u in range(len(parents)) if parents[u] == at]
        if not kids:
            return chain
        at = kids[0]
        chain.append(tokens[at])


def test_the_drafter_drafts_the_rename_at_its_next_site():
    """With a flat cost model the whole useful trie is proposed: at F's third site the
    first-ranked chain carries the inserted token (the verbatim copy is its sibling), and the
    node the rule changed is counted under "edit"."""
    drafter = NgramDrafter(target_ms=None, max_length=COPY_DEPTH)
    answer = renamed(SOURCE)
    upto = answer.index(5) + 1                          # "... 5": F's third site comes next
    proposal = drive(drafter, SOURCE + SEPARATOR, answer[:upto])
    assert first_path(proposal)[:5] == [7, 8, 50, 70, 71]
    drafter.commit(list(range(6)), proposal.tokens)     # the target kept 7 8 50 70 71
    accepted, proposed = drafter.match_counts["edit"]
    assert accepted == 1 and proposed >= 1


def test_without_edits_the_chain_copies_verbatim():
    """The control: the same step on a text that never renamed F drafts F verbatim."""
    drafter = NgramDrafter(target_ms=None, max_length=COPY_DEPTH)
    upto = SOURCE.index(5) + 1
    proposal = drive(drafter, SOURCE + SEPARATOR, SOURCE[:upto])
    assert first_path(proposal)[:4] == [7, 8, 70, 71]


def test_near_occurrences_outrank_a_more_recent_similar_one():
    """Two functions share their last lines; the text copies the first, then makes an edit.
    Right after it the suffix is one token, and the second function's occurrence is the more
    recent: the tracker's window ranks the first function's first."""
    first = [11, 12, 13, 14, 15, 16, 17, 18, 20, 21, 22, 23, 24, 25, 26, 27]
    second = [31, 32, 33, 34, 35, 36, 37, 38, 20, 21, 22, 23, 24, 25, 46, 47]
    drafter = NgramDrafter(target_ms=None, max_length=8)
    text = first[:10] + [90, 91] + [22]                 # copy, edit (90 91), resume at 22
    proposal = drive(drafter, first + [0] + second + SEPARATOR, text, depth=8)
    assert first_path(proposal)[:5] == [23, 24, 25, 26, 27]
    drafter.copy.reset()                                # the control: no cursor, no window
    assert drafter.candidates(8)[0].tokens[:5] != (23, 24, 25, 26, 27)

