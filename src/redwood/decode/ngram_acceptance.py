"""The n-gram drafter's acceptance model: how likely a looked-up continuation is to be what
the target says next, by match length, depth and rank (decode/ngram_drafter.py's module doc
says how it is learnt without wasting target time; measure/ngram_calibration.py measures its
priors per bundle)."""
from __future__ import annotations

from redwood.decode.ngram_trie import TrieNode
from redwood.errors import RedwoodError

# Match lengths 1, 2, 3, 4-7, 8-15, 16-31, 32+: a long match predicts a long copy (the text
# is being repeated), a short one an accident, so the drafter tells them apart up to
# ngram_index.MAX_MATCH. Two more buckets come from decode/ngram_edits.py: "near", a match
# shorter than 8 found just after where the text was last copied from (an edit's copy
# resuming after a renamed identifier, far likelier than the same short match anywhere
# else), and "edit", the first token an edit rule changed in a draft (does the rule hold here?).
# A near match of a single token is a bucket of its own ("near-1"): one token agreeing where the
# copy was is often chance, while two or more say the copy resumed. Replayed on recorded greedy
# answers, a near-1 first node was kept 0.44 (chat), 0.51 (HumanEval), 0.67 (agent steps) and
# 0.86 (whole-file edits) of the time, near matches of 2-7 tokens 0.75-1.0 (docs/design.md
# §3.3). It comes last so that the indices stored in calibration files keep their meaning.
# "self-8+": a match of 8 or more tokens whose every occurrence lies in the answer itself (an
# answer repeating its own list or code, not copying its prompt; ngram_index.Continuation.own).
# The bundle's calibration comes from edits, where a long match copies the prompt and 32+ chains
# are kept 0.99 even at T 0.6; replayed on recorded answers (2-core EPYC), a self-repetition's
# node was kept 0.90 greedy (chat + HumanEval; agent steps 0.95) and 0.76-0.89 at T 0.6, and
# its long chains break where a list item starts like the one before it. Before this bucket,
# those chains drew the edit's 0.95-0.99: chat predicted 16 % (T 0) and 37 % (T 0.6) more
# tokens per drafted step than it kept (docs/design.md §3.3).
MATCH_BUCKETS = 11
MATCH_LABELS = ("1", "2", "3", "4-7", "8-15", "16-31", "32+", "near", "edit", "near-1", "self-8+")
NEAR_BUCKET, NEAR_BELOW, EDIT_BUCKET, NEAR1_BUCKET, SELF_BUCKET = 7, 8, 8, 9, 10
SELF_FROM = 8                # the shortest match a self-repetition is told apart at
DEPTH_BUCKETS = 6            # depths 1..5, 6+
# Prior conditional acceptance of a rank-1 child by match-length bucket: short matches are a
# coin flip, long ones usually repeat. Later siblings start at half (they are checked only
# after the first was rejected).
PRIOR_RANK1 = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.8, 0.8, 0.6, 0.9)
# A sampled answer repeats itself less faithfully than a greedy one (0.76-0.89 against 0.90 in
# the replays above); 0.75 (against 0.8 and 0.9) brought chat's predicted / kept nearest 1.
PRIOR_SELF_SAMPLED = 0.75
PRIOR_LATER = 0.5
PRIOR_WEIGHT = 4.0           # the prior counts as this many observations
# Requests are pooled by the length of their prompt: "short" (a question, a function to
# write) and "long" (a file to edit, a document or a conversation to answer from). A long
# prompt is material to copy, and requests of the two kinds keep the same key at different
# rates (a resumed copy, "near" at depth 1: 0.96 over whole-file edits at T 0.6, 0.74 over
# chat). One pool for both carried edits' rates to chat: on a 2-core EPYC, chat at T 0.6 run
# after whole-file edits predicted 9.6 tokens per drafted step and kept 1.2 in its first round
# (+163 % over the run), and replayed on recorded answers after the edits taught the pool,
# chat and HumanEval predicted +27 % / +45 % against +9 % / +16 % from the priors alone
# (docs/design.md §3.3). Every prompt set measured has all its prompts on one side of 256
# tokens except retrieval answers (161-894).
# A short prompt is told apart once more by its format: a chat turn (the prompt ends by
# opening the assistant's turn in the model's chat template) is answered in prose that
# restates the question and goes its own way, a raw completion continues its text. They keep
# the same keys at different rates: replayed on recorded answers at T 0.6, an 8-15-token prompt
# match at depth 1 was kept 0.61 of the time in chat and 0.87 in HumanEval, a 4-7 match 0.65
# and 0.80, an edit rule 0.11 and 0.81; and the learnt-rates file carried HumanEval's rates to
# chat, whose live runs predicted +13 % over what they kept (docs/design.md §3.3).
LONG_PROMPT = 256
PROMPT_KINDS = ("short", "long", "chat")
SHORT_KIND, LONG_KIND, CHAT_KIND = 0, 1, 2


def prompt_kind(prompt_tokens: int, chat: bool = False) -> int:
    """The pool a request of `prompt_tokens` prompt tokens learns in (PROMPT_KINDS index);
    chat: its prompt opens the assistant's turn of a chat template (chat_turn_opened)."""
    if prompt_tokens >= LONG_PROMPT:
        return LONG_KIND
    return CHAT_KIND if chat else SHORT_KIND


def chat_turn_opened(prompt: list[int], chat_turn: tuple[int, ...]) -> bool:
    """Whether `prompt` ends with `chat_turn`, the tokens that open the assistant's turn in the
    model's chat template (prompts.assistant_turn_ids; empty: the model has no template), or
    with all of them but the last: a drafter is often given the prompt before its first root
    (the last prompt token)."""
    turn = tuple(chat_turn)
    if not turn:
        return False
    tail = tuple(prompt[-len(turn):])
    return tail == turn or (len(turn) > 1 and tail[1:] == turn[:-1])


def match_bucket(match: int) -> int:
    """0, 1, 2 for matches of 1, 2, 3 tokens; then 3 + log2(match / 4), capped: 4-7 -> 3,
    8-15 -> 4, 16-31 -> 5, 32+ -> 6."""
    if match < 4:
        return max(0, match - 1)
    return min(NEAR_BUCKET - 1, 3 + (int(match) // 4).bit_length() - 1)


def node_bucket(node: TrieNode) -> int:
    """A trie node's bucket (MATCH_LABELS index): "edit" for the first token an edit rule
    changed, "near" / "near-1" for a short match where the copy resumes, else its match
    length's."""
    if node.edited:
        return EDIT_BUCKET
    if node.near and node.match < NEAR_BELOW:
        return NEAR1_BUCKET if node.match <= 1 else NEAR_BUCKET
    if node.own and node.match >= SELF_FROM:
        return SELF_BUCKET
    return match_bucket(node.match)


class AcceptanceModel:
    """Estimated c = P(node accepted | parent accepted, earlier siblings rejected), by
    key = (greedy, match-length bucket, depth bucket, rank 1 or later), as a Beta-style mean:
    (accepted + prior · w) / (trials + w).

    calibration: measured counts per key (measure/ngram_calibration.py); a key observed at
    least CALIBRATED_MIN times there takes its measured rate as its prior, others the guesses.
    by_prompt: requests learn in one pool per prompt kind (pool_for; by_kind), each from the
    same priors; else every request learns in this model's own counts. chat_turn: the token
    ids that open the assistant's turn in the model's chat template (a short prompt ending
    with them is a chat request, its own pool; empty: no chat template, none is)."""

    CALIBRATED_MIN = 8

    def __init__(self, prior_rank1=PRIOR_RANK1, prior_later=PRIOR_LATER,
                 prior_weight: float = PRIOR_WEIGHT, calibration: dict | None = None,
                 prior_self_sampled: float | None = PRIOR_SELF_SAMPLED, by_prompt: bool = False,
                 chat_turn: tuple[int, ...] = ()):
        """prior_rank1: by match bucket (greedy and sampled keys); prior_self_sampled: the
        self-8+ bucket's for sampled keys instead (None: prior_rank1's)."""
        if len(prior_rank1) != MATCH_BUCKETS or not all(0 <= p <= 1 for p in prior_rank1):
            raise RedwoodError(f"prior_rank1 needs {MATCH_BUCKETS} probabilities in [0, 1]")
        if prior_self_sampled is not None and not 0 <= prior_self_sampled <= 1:
            raise RedwoodError("prior_self_sampled must be a probability in [0, 1]")
        self.prior_self_sampled = prior_self_sampled
        self.prior_rank1, self.prior_later = tuple(prior_rank1), float(prior_later)
        self.prior_weight = float(prior_weight)
        self.counts: dict[tuple, list[float]] = {}          # key -> [accepted, trials]
        self.drafts: dict[tuple, list[float]] = {}  # draft_key -> [drafted kept, predicted]
        self.calibrated = {key: accepted / trials for key, (accepted, trials)
                           in (calibration or {}).items() if trials >= self.CALIBRATED_MIN}
        # persist(model) after each request (measure/learned_rates.py), or None: not kept
        self.persist = None
        self.by_prompt = bool(by_prompt)
        self.chat_turn = tuple(int(t) for t in chat_turn)  # opens the assistant's turn
        self.by_kind: dict[int, AcceptanceModel] = {}       # prompt_kind -> its pool

    def pool_for(self, prompt: list[int]) -> AcceptanceModel:
        """The model a request with the token ids `prompt` learns in: this one, or with
        by_prompt its prompt kind's pool (its length, and whether it opens the assistant's
        turn of self.chat_turn)."""
        if not self.by_prompt:
            return self
        return self.kind_pool(prompt_kind(len(prompt), chat_turn_opened(prompt, self.chat_turn)))

    def kind_pool(self, kind: int) -> AcceptanceModel:
        """The pool of prompt kind `kind` (PROMPT_KINDS index), made on first use with this
        model's priors."""
        if kind not in self.by_kind:
            pool = AcceptanceModel(self.prior_rank1, self.prior_later, self.prior_weight,
                                   prior_self_sampled=self.prior_self_sampled)
            pool.calibrated = self.calibrated
            self.by_kind[kind] = pool
        return self.by_kind[kind]

    @staticmethod
    def key(greedy: bool, node: TrieNode) -> tuple:
        return (bool(greedy), node_bucket(node), min(node.depth, DEPTH_BUCKETS) - 1,
                node.rank > 1)

    def prior(self, key: tuple) -> float:
        if key in self.calibrated:
            return self.calibrated[key]
        first = self.prior_rank1[key[1]]
        if key[1] == SELF_BUCKET and not key[0] and self.prior_self_sampled is not None:
            first = self.prior_self_sampled
        return first * self.prior_later if key[3] else first

    def rate(self, key: tuple) -> float:
        return _mean(self.counts, key, self.prior(key), self.prior_weight)

    def observe(self, key: tuple, accepted: bool) -> None:
        self.teach(key, float(accepted), 1.0)

    def teach(self, key: tuple, accepted: float, trials: float) -> None:
        """Add (accepted, trials) to the key's counts; either may be negative (a request
        re-weighting what it taught, RequestEstimates.observe). The counts stay within
        0 <= accepted <= trials (a save may have scaled them down since)."""
        entry = self.counts.setdefault(key, [0.0, 0.0])
        entry[1] = max(0.0, entry[1] + trials)
        entry[0] = min(entry[1], max(0.0, entry[0] + accepted))

    def request_done(self) -> None:
        """A request using this model finished: keep what it taught (persist), if asked to."""
        if self.persist is not None:
            self.persist(self)

    def draft_ratio(self, greedy: bool, predicted: float = 0.0) -> float:
        """Drafted tokens kept per drafted token predicted, over every shadow tree of the
        class of `predicted` (draft_key) resolved so far (DRAFT_PRIOR_TOKENS of prior at 1:
        the node estimates taken at their word)."""
        return _ratio(self.drafts.get(draft_key(greedy, predicted)), 1.0, DRAFT_PRIOR_TOKENS)

    def observe_draft(self, greedy: bool, predicted: float, kept: int) -> None:
        _add_draft(self.drafts, draft_key(greedy, predicted), predicted, kept)


# Whole drafts are calibrated too. The node estimates are conditional rates multiplied along a
# path, so a long match's chain of c = 0.95-1.0 predicts 20+ tokens where one wrong node (a list
# item that starts like the one before it; an edit rule that held in a file but not in prose)
# keeps 2, and on a steep CPU such a step costs t(32) = 16 t(1). So the drafter scales every
# step's predicted drafted tokens by the draft ratio, kept / predicted over the trees its
# unscaled estimates chose (every step's, drafted or not: decode/ngram_shadow.py): the
# request's own, with the pooled ratio (all requests of that temperature kind) as its prior
# worth DRAFT_OWN_TOKENS predicted tokens, the pooled one starting at 1 worth
# DRAFT_PRIOR_TOKENS. Replayed on recorded answers (benchmarks/copy_ceiling.py, a 2-core EPYC's
# costs) 64 / 16 raised the worst prompt of agent steps 0.90 -> 0.99x, of HumanEval at T 0.6
# (redwood's own answers) 0.94 -> 0.99x and of chat 0.90 -> 0.93x, with whole-file edits
# level (median 1.35x) (docs/design.md §3.3).
DRAFT_PRIOR_TOKENS = 64.0
DRAFT_OWN_TOKENS = 16.0
DRAFT_RATIO_RANGE = (0.05, 1.5)
# Long drafts are calibrated apart from short ones. The steps that draft are those whose
# estimates are highest, and the estimates that over-predict most are the long chains: replayed
# on redwood's own chat answers at T 0.6, trees predicting under 8 drafted tokens kept 0.92-1.18
# of it, the three predicting 20+ kept 0.15 (a list item repeating the one before it for 32+
# tokens, then diverging), while the ratio over all shadows, most of them short and right, stayed
# near 1. So a shadow predicting LONG_DRAFT_TOKENS or more counts toward the long class's ratio,
# and a step whose unscaled best tree is long is scaled by it.
LONG_DRAFT_TOKENS = 8.0


def draft_key(greedy: bool, predicted: float) -> tuple[bool, bool]:
    """(greedy, long): the draft-ratio class of a tree predicting `predicted` drafted tokens."""
    return bool(greedy), predicted >= LONG_DRAFT_TOKENS


# A key's rate for one request: its own observations of the key (every child its text walked
# past, decode/ngram_drafter.py) with the pooled rate counted as this many observations. The
# pooled model mixes requests (a whole-file edit keeps one-token "near" resumptions 0.86 of the
# time, an agent step answering with new arguments 0.67 or less), so a request whose text keeps
# rejecting a key stops drafting on it after tens of observations while a copy is not talked
# out of its chains by a few. Replayed on recorded answers (benchmarks/copy_ceiling.py, 2-core
# Xeon costs), 64 raised the mean policy speed on every set (whole-file 1.93 -> 1.94, HumanEval
# 1.15 -> 1.18) with no prompt 0.02 lower; 4 and 16 lost up to 10 % on single whole-file edits.
OWN_WEIGHT = 64.0
# What one request teaches the pool: its own rate of each key at a weight of at most
# REQUEST_TRIALS trials. Counted per observation, the pool was a rate over observations, and a
# code answer or an edit observes a resumed copy ("near") or a long prompt match many times as
# often as a chat answer does, so chat drafted on code's rates: on a 2-core EPYC the pooled
# "near" depth-1 rate read 0.87 where chat kept 0.74, and chat's drafted 8-15 matches (an
# answer restating the question, then going its own way) kept 0.36 of their nodes where
# HumanEval's kept 0.83. Capped, the pool is nearer a rate over requests, and a request whose
# text keeps a key more often learns that from its own counts (OWN_WEIGHT). Replayed on
# recorded answers (benchmarks/copy_ceiling.py's policy, that EPYC's costs; chat, HumanEval and
# whole-file edits at T 0 and 0.6, a fresh pool and then the pool they taught), predicted /
# kept tokens per drafted step summed over the 12 cells 146 points of error uncapped, 112 at
# 16, 107 at 4 and 97 at 8 (HumanEval T 0.6 +25 / +28 % -> +16 / +11 %; chat +8 ... +12 %),
# whole-file decode speed level (docs/design.md §3.3).
REQUEST_TRIALS = 8.0


class RequestEstimates:
    """One request's view of a shared AcceptanceModel: observations go to both (to the pool
    as the request's rate at a weight of at most REQUEST_TRIALS per key), rates are the
    request's own counts with the pooled rate as their prior (OWN_WEIGHT)."""

    def __init__(self, model: AcceptanceModel):
        self.model = model
        self.counts: dict[tuple, list[float]] = {}          # key -> [accepted, trials]
        self.taught: dict[tuple, list[float]] = {}  # key -> [accepted, trials] in the pool
        self.drafts: dict[tuple, list[float]] = {}  # draft_key -> [drafted kept, predicted]

    def rate(self, key: tuple) -> float:
        return _mean(self.counts, key, self.model.rate(key), OWN_WEIGHT)

    def observe(self, key: tuple, accepted: bool) -> None:
        """One walk observation: the request's own count, and its share of the pool's (the
        first REQUEST_TRIALS observations one by one, then its rate at that weight)."""
        _count(self.counts, key, accepted)
        own_accepted, own_trials = self.counts[key]
        weight = min(1.0, REQUEST_TRIALS / own_trials)
        share = [own_accepted * weight, own_trials * weight]
        taught = self.taught.setdefault(key, [0.0, 0.0])
        self.model.teach(key, share[0] - taught[0], share[1] - taught[1])
        taught[:] = share

    def draft_ratio(self, greedy: bool, predicted: float = 0.0) -> float:
        """This request's kept / predicted drafted tokens in the class of `predicted`
        (draft_key), the pooled ratio as its prior."""
        return _ratio(self.drafts.get(draft_key(greedy, predicted)),
                      self.model.draft_ratio(greedy, predicted), DRAFT_OWN_TOKENS)

    def observe_draft(self, greedy: bool, predicted: float, kept: int) -> None:
        """A step's shadow tree (decode/ngram_shadow.py) predicted `predicted` drafted tokens
        kept (its unscaled E(n) - 1) and the text followed `kept` of its nodes."""
        self.model.observe_draft(greedy, predicted, kept)
        _add_draft(self.drafts, draft_key(greedy, predicted), predicted, kept)


def _mean(counts: dict, key: tuple, prior: float, weight: float) -> float:
    """Beta-style mean: (accepted + prior * weight) / (trials + weight)."""
    accepted, trials = counts.get(key, (0.0, 0.0))
    return (accepted + prior * weight) / (trials + weight)


def _count(counts: dict, key: tuple, accepted: bool) -> None:
    entry = counts.setdefault(key, [0.0, 0.0])
    entry[0] += float(accepted)
    entry[1] += 1.0


def _ratio(drafts: list[float] | None, prior: float, weight: float) -> float:
    """(kept + prior * weight) / (predicted + weight), within DRAFT_RATIO_RANGE."""
    kept, predicted = drafts or (0.0, 0.0)
    low, high = DRAFT_RATIO_RANGE
    return min(high, max(low, (kept + prior * weight) / (predicted + weight)))


def _add_draft(drafts: dict, key: tuple, predicted: float, kept: int) -> None:
    entry = drafts.setdefault(key, [0.0, 0.0])
    entry[0] += float(kept)
    entry[1] += float(predicted)
