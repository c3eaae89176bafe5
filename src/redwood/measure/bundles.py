"""Trees shipped with the package, tuned bundles, and `--tree auto`.

A tuned bundle (written by `redwood tune`) is a directory:
    bundle.json            index: models, machine, settings, one entry per temperature
    profile.json           latency profile of this machine
    acceptance-<T>.json    acceptance vector measured at temperature T
    tree-<T>.json          the tree the planner chose for T (its "source" says how)
    summary.md, *.png      what was chosen and why, for people
`--tree auto` uses the bundle in $REDWOOD_BUNDLE if set, else the one shipped for the model
pair (src/redwood/data/bundles/<pair>-cpu/), and picks the tree whose temperature is nearest
to the request's.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from redwood.errors import RedwoodError
from redwood.plan.tree import Tree, default_tree, read_json  # noqa: F401

BUNDLE_FORMAT = 1
BUNDLE_INDEX = "bundle.json"
BUNDLE_ENV = "REDWOOD_BUNDLE"
DEFAULT_PAIR = "qwen2.5-coder"


@dataclass
class BundleEntry:
    """One tuned tree of a bundle."""
    temperature: float
    top_p: float
    tree: str                      # file name inside the bundle
    acceptance: str
    budget: int
    depth: int
    tokens_per_step: float
    predicted_speedup: float
    adaptive_tree: str | None = None        # optional: the deeper tree pruned by draft confidence
    draft_confidence: float = 0.0           # its pruning threshold
    threshold_from: str = "estimate"        # "given": measured, keep it on other machines too
    drafter: str = "hybrid"                 # default drafter here (`--drafter auto`): ngram|hybrid


@dataclass
class Bundle:
    directory: Path
    entries: list[BundleEntry]
    draft_quantize: str | None = None      # the draft variant the trees were tuned for
    index: dict = field(default_factory=dict)
    fast_linear: bool = False              # profiled with --fast-linear (load models so)

    @property
    def ngram_acceptance(self) -> Path | None:
        """The n-gram drafter's calibration (`tune --drafter ngram|hybrid|auto`), if any."""
        name = self.index.get("ngram_acceptance")
        return None if name is None else self.directory / name

    def entry(self, temperature: float) -> BundleEntry:
        """The entry whose temperature is nearest to `temperature` (ties: the lower one)."""
        if not isinstance(temperature, (int, float)) or temperature != temperature or temperature < 0:
            raise RedwoodError(f"temperature must be a number >= 0, got {temperature!r}")
        return min(self.entries, key=lambda e: (abs(e.temperature - temperature), e.temperature))

    def tree(self, temperature: float) -> Tree:
        """The static tuned tree of the entry nearest `temperature`."""
        entry = self.entry(temperature)
        return self._load(entry.tree, entry)

    def drafting(self, temperature: float, draft_confidence: float | None = None):
        """(tree, draft_confidence) for a request at `temperature`.

        draft_confidence None: the entry's adaptive tree and threshold when it has them, else
        its static tree with no pruning. 0: the static tree, unpruned. Above 0: that threshold
        on the adaptive tree (the static one if the entry has none)."""
        entry = self.entry(temperature)
        if entry.adaptive_tree and draft_confidence != 0:
            threshold = entry.draft_confidence if draft_confidence is None else draft_confidence
            return self._load(entry.adaptive_tree, entry), float(threshold)
        return self._load(entry.tree, entry), float(draft_confidence or 0.0)

    def _load(self, name: str, entry: BundleEntry) -> Tree:
        tree = Tree.load(self.directory / name)
        tree.source.setdefault("bundle", str(self.directory))
        tree.source.setdefault("bundle_temperature", entry.temperature)
        return tree


def shipped_bundle_dir(pair: str = DEFAULT_PAIR, device: str = "cpu", backend: str = "hf") -> Path:
    """Where the bundle tuned for `pair` on `device` with `backend` ships inside the package
    (may not exist): <pair>-cpu for transformers, <pair>-llamacpp-cpu for llama.cpp."""
    runtime = "" if backend == "hf" else f"{backend}-"
    return Path(str(resources.files("redwood") / "data" / "bundles" / f"{pair}-{runtime}{device}"))


def is_bundle_dir(path) -> bool:
    return Path(path).is_dir() and (Path(path) / BUNDLE_INDEX).is_file()


def load_bundle(directory) -> Bundle:
    """Read and check a bundle directory's index (every listed tree file must exist)."""
    directory = Path(directory)
    if not is_bundle_dir(directory):
        raise RedwoodError(f"{directory} is not a tuned bundle (no {BUNDLE_INDEX}); "
                           "make one with `redwood tune --out DIR`")
    index = read_json(directory / BUNDLE_INDEX, "bundle index")
    where = str(directory / BUNDLE_INDEX)
    if not isinstance(index, dict) or index.get("kind") != "bundle":
        raise RedwoodError(f"{where}: not a bundle index (kind must be 'bundle')")
    if index.get("format") != BUNDLE_FORMAT:
        raise RedwoodError(f"{where}: format {index.get('format')!r} is not supported "
                           f"(this redwood reads format {BUNDLE_FORMAT})")
    trees = index.get("trees")
    if not isinstance(trees, list) or not trees:
        raise RedwoodError(f"{where}: 'trees' must be a non-empty list")
    entries = [_entry(item, directory, where) for item in trees]
    extra = index.get("ngram_acceptance")
    if extra is not None and not (directory / str(extra)).is_file():
        raise RedwoodError(f"{where}: lists {extra}, which is missing from the bundle")
    return Bundle(directory, entries, index.get("draft_quantize"), index,
                  bool(index.get("fast_linear", False)))


def _entry(item, directory: Path, where: str) -> BundleEntry:
    try:
        entry = BundleEntry(temperature=float(item["temperature"]), top_p=float(item["top_p"]),
                            tree=str(item["tree"]), acceptance=str(item["acceptance"]),
                            budget=int(item["budget"]), depth=int(item["depth"]),
                            tokens_per_step=float(item["tokens_per_step"]),
                            predicted_speedup=float(item["predicted_speedup"]),
                            drafter=str(item.get("drafter", "hybrid")))
        adaptive = item.get("adaptive")
        if adaptive is not None:
            entry.adaptive_tree = str(adaptive["tree"])
            entry.draft_confidence = float(adaptive["draft_confidence"])
            entry.threshold_from = str(adaptive.get("threshold_from", "estimate"))
    except (KeyError, TypeError, ValueError) as exc:
        raise RedwoodError(f"{where}: malformed tree entry {item!r} ({exc})") from None
    if entry.drafter not in ("ngram", "hybrid"):
        raise RedwoodError(f"{where}: drafter must be ngram or hybrid, got {entry.drafter!r}")
    if entry.adaptive_tree is not None and not 0 < entry.draft_confidence < 1:
        raise RedwoodError(f"{where}: adaptive draft_confidence must be in (0, 1), got "
                           f"{entry.draft_confidence}")
    for name in (entry.tree, entry.adaptive_tree):
        if name is not None and not (directory / name).is_file():
            raise RedwoodError(f"{where}: lists {name}, which is missing from the bundle")
    return entry


def find_bundle(spec, pair: str | None = None, backend: str = "hf") -> Bundle | None:
    """The bundle a --tree value means, or None when it names a tree file (or nothing).

    "auto": $REDWOOD_BUNDLE if set, else the bundle shipped for `pair` (None = the default
    pair; explicit --target/--draft models have no shipped bundle). A directory: that bundle.
    """
    if spec is None:
        return None
    if spec == "auto":
        env = os.environ.get(BUNDLE_ENV)
        if env:
            if not is_bundle_dir(env):
                raise RedwoodError(f"{BUNDLE_ENV}={env} is not a tuned bundle directory "
                                   f"(no {BUNDLE_INDEX}); make one with `redwood tune --out DIR`")
            return load_bundle(env)
        if pair is None or pair == "":
            raise RedwoodError("--tree auto: no tuned bundle ships for these models; make one "
                               "with `redwood tune --target T --draft D --out DIR`, then pass "
                               f"--tree DIR or set {BUNDLE_ENV}=DIR")
        shipped = shipped_bundle_dir(pair, backend=backend)
        if not is_bundle_dir(shipped):
            raise RedwoodError(f"--tree auto: no tuned bundle ships for the pair {pair!r} on the "
                               f"{backend} backend; make one with `redwood tune --model {pair} "
                               f"--backend {backend} --out DIR`, then pass "
                               f"--tree DIR or set {BUNDLE_ENV}=DIR")
        return load_bundle(shipped)
    path = Path(spec)
    if path.is_dir():
        return load_bundle(path)
    return None


def resolve_tree(spec, temperature: float = 0.0, pair: str | None = DEFAULT_PAIR,
                 backend: str = "hf") -> Tree:
    """The tree a --tree value means for a request at `temperature`.

    spec: None -> the default shipped tree; "auto" -> the tuned bundle (see find_bundle),
    tree of the nearest temperature; a bundle directory -> likewise; a file -> that tree JSON.
    """
    if spec is None:
        return default_tree()
    bundle = find_bundle(spec, pair, backend)
    if bundle is not None:
        return bundle.tree(temperature)
    path = Path(spec)
    if not path.exists():
        raise RedwoodError(f"tree {spec} does not exist; give a tree JSON (`redwood plan`), a "
                           "bundle directory (`redwood tune`) or 'auto'")
    return Tree.load(path)
