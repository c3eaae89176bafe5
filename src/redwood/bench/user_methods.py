"""The bench's methods that are what a user gets by default, and llama-cpp-python's prompt
lookup at its best grid entry.

- `ngram`: redwood's prompt-lookup drafter alone (decode.ngram_drafter.NgramDrafter), each
  step's tree sized by its cost model on this machine's measured t(n), the request governed
  by the machine profile: what `redwood generate --drafter ngram` builds (cli.textgen's
  use_ngram_drafter). A fresh drafter per request, so its online acceptance model starts
  from its priors every time, as in a fresh `redwood generate` (a long-running server would
  carry what it learned from one request to the next).
- `hybrid`: n-gram continuations grafted onto the draft model's tree
  (decode.hybrid_drafter), the model's trees the tuned bundle's vectors planned for this
  machine (measure.hybrid_plans; without a bundle, the run's acceptance vector on the default
  tree), governed: what `redwood generate --drafter hybrid` builds. Fresh per request.
- `sequoia_grown`: per-step trees grown best-first (decode.tree_growth) inside the largest
  tree the bundle's vector allows on this machine (measure.growth_plans), governed: what
  `redwood generate --grow` builds. Without a bundle, the run's acceptance vector.
- `sequoia_governed`: the draft model on the tuned bundle's acceptance vectors re-planned for
  this machine's profile (measure.machine_profile.replan, adaptive when the bundle has
  adaptive trees), governed by that profile: what `redwood generate` does by default with a
  tuned bundle (cli.textgen.load_engine). Without a bundle (--acceptance given), the vector
  is planned for the machine profile by `choose_tree` (a static tree), still governed.
- `llamacpp_prompt_lookup_best`: llama-cpp-python's prompt lookup with the num_pred_tokens of
  a small grid that gave the shortest end-to-end time on the first prompt of the prompt set
  (at each setting; the prompt is also one of the measured ones), then run on every prompt.
The machine profile is `measure.machine_profile.machine_profile` (measured at first use and
cached, as for `redwood generate`).
"""
from __future__ import annotations

from redwood.bench.runners import Setting, redwood_runner
from redwood.bench.specs import MethodSpec, Selection
from redwood.errors import RedwoodError


def ngram_spec(factory, setting: Setting) -> MethodSpec:
    from redwood.decode.engine import Engine
    from redwood.decode.ngram_drafter import NgramDrafter
    from redwood.decode.ngram_trees import ngram_budget_tree

    from redwood.measure.ngram_calibration import acceptance_model
    from redwood.prompts import assistant_turn_ids

    profile, bundle = factory.machine_profile(), factory.inputs.bundle
    pair = factory.pair
    chat_turn = assistant_turn_ids(pair.tokenizer)
    engine = factory.cached_engine(("ngram",), lambda: Engine(
        pair.target, pair.draft, ngram_budget_tree(),
        drafter=NgramDrafter(target_ms=profile.target_ms), profile=profile))
    inner = redwood_runner(engine, "sequoia", source="ngram")

    def run(input_ids, setting, seed, max_new_tokens):                # fresh per request
        engine.drafter = NgramDrafter(target_ms=profile.target_ms,
                                      model=acceptance_model(bundle, chat_turn=chat_turn))
        return inner(input_ids, setting, seed, max_new_tokens)

    tree = engine.tree
    return MethodSpec("ngram", f"n-gram, n<={len(tree)} d<={tree.num_levels}", run, None,
                      tree, "NgramDrafter(target_ms=machine profile) within ngram_budget_tree(), "
                      "each step sized by its cost model; governed by the machine profile "
                      f"({factory.machine_profile_source()})",
                      "none (n-gram drafts: acceptance learned online per request)")


def hybrid_spec(factory, setting: Setting) -> MethodSpec:
    from redwood.decode.engine import Engine
    from redwood.decode.hybrid_drafter import hybrid_drafting
    from redwood.measure.hybrid_plans import hybrid_plans
    from redwood.measure.ngram_calibration import acceptance_model
    from redwood.prompts import assistant_turn_ids

    profile, inputs, pair = factory.machine_profile(), factory.inputs, factory.pair
    plans = hybrid_plans(profile, inputs.bundle)
    chat_turn = assistant_turn_ids(pair.tokenizer)
    engine = factory.cached_engine(("hybrid",), lambda: Engine(pair.target, pair.draft,
                                                               profile=profile))
    temperature = setting.temperature
    engine.drafter, engine.tree = hybrid_drafting(engine, plans, profile, [temperature])
    inner = redwood_runner(engine, "sequoia", source="hybrid")

    def run(input_ids, setting, seed, max_new_tokens):             # fresh per request
        engine.drafter, engine.tree = hybrid_drafting(engine, plans, profile, [temperature],
                                                      acceptance=acceptance_model(
                                                          inputs.bundle, chat_turn=chat_turn))
        return inner(input_ids, setting, seed, max_new_tokens)

    model_tree, expected, _ = plans(temperature)
    budget = engine.tree
    return MethodSpec("hybrid", f"model n={len(model_tree)} + n-gram, n<={len(budget)}", run,
                      None, budget, "HybridDrafter: n-gram trie grafted onto the draft model's "
                      f"tree (n={len(model_tree)}, d={model_tree.num_levels}, prior "
                      f"{expected:.2f} tokens/step, " + ("the tuned bundle planned for this "
                      "machine" if inputs.bundle is not None else "default tree") +
                      f"), chosen per step on {factory.machine_profile_source()}; governed",
                      "bundle vectors (model side); n-gram acceptance learned online")


def sequoia_grown_spec(factory, setting: Setting) -> MethodSpec:
    from redwood.decode.engine import Engine
    from redwood.measure.growth_plans import growth_rule, growth_tree, growth_trees

    profile, inputs, pair = factory.machine_profile(), factory.inputs, factory.pair
    vector = inputs.vector_or_none(setting.temperature, setting.top_p)
    if inputs.bundle is not None:
        tree = growth_trees(profile, inputs.bundle)(setting.temperature)
    elif vector is not None:
        tree = growth_tree(vector.p, profile)
    else:
        raise RedwoodError("sequoia_grown needs a tuned bundle or acceptance vectors")

    def build():
        engine = Engine(pair.target, pair.draft, tree, profile=profile)
        engine.drafter.growth = growth_rule(profile, inputs.bundle)
        return engine
    engine = factory.cached_engine(("grown", tuple(tree.parents)), build)
    how = (f"grown best-first per step inside the DP tree n={len(tree)} d={tree.num_levels} of "
           f"the bundle's vector, on {factory.machine_profile_source()}; governed")
    config = f"grown, n<={len(tree)}"
    if len(tree) == 1:
        config = "n=1 (plain decoding: no tree of the bundle's vector pays)"
        how = f"plain decoding: no tree of the bundle's vector pays on {factory.machine_profile_source()}"
    return MethodSpec("sequoia_grown", config, redwood_runner(engine, "sequoia"),
                      None, tree, how, "bundle vectors and confidence bins (c(q) = q without)")


def sequoia_governed_spec(factory, setting: Setting) -> MethodSpec:
    from redwood.decode.engine import Engine
    from redwood.plan.planner import choose_tree

    profile, inputs = factory.machine_profile(), factory.inputs
    t, p = setting.temperature, setting.top_p
    vector = inputs.vector_or_none(t, p)
    where = factory.machine_profile_source()
    if inputs.bundle is not None:
        from redwood.measure.machine_profile import replan

        tree, confidence = replan(inputs.bundle, t, profile)
        how = (f"tuned bundle {inputs.bundle.directory} re-planned for this machine "
               f"(measure.machine_profile.replan on {where}), as `redwood generate` does; governed")
    elif vector is not None:
        budget = min(inputs.max_budget, max(profile.target_ms))
        choice = choose_tree(vector.p, profile, budget, inputs.max_depth)
        tree, confidence = choice.tree, 0.0
        how = (f"no tuned bundle: the acceptance vector planned for this machine "
               f"(choose_tree on {where}, max_budget={budget}, max_depth={inputs.max_depth}); "
               "governed")
    else:
        raise RedwoodError("sequoia_governed needs a tuned bundle or acceptance vectors")
    pair = factory.pair
    engine = factory.cached_engine(("governed", tuple(tree.parents), confidence), lambda: Engine(
        pair.target, pair.draft, tree, confidence, profile=profile))
    if len(tree) == 1:               # the planner declined to speculate on this machine
        config, confidence, predicted = "n=1 (plain decoding: speculation does not pay)", 0.0, 1.0
    else:
        config = f"n={len(tree)} d={tree.num_levels}" + (f" c={confidence:.2f}" if confidence
                                                         else "")
        predicted = None if confidence or vector is None else tree.expected_length(vector.p)
    return MethodSpec("sequoia_governed", config,
                      redwood_runner(engine, "sequoia", confidence), predicted, tree, how,
                      "none (no acceptance vector given)" if vector is None else vector.describe())


def lookup_best_spec(factory, setting: Setting, prompt_set: str | None, first) -> MethodSpec:
    """Measure every grid entry on the set's first prompt (`first`: (ids, seed)) with the
    run's token count, after one untimed warm-up; keep the shortest end-to-end time."""
    from redwood.bench.llamacpp_runners import llama_runner

    if first is None:
        raise RedwoodError("llamacpp_prompt_lookup_best needs its prompt set's first prompt")
    ids, seed = first
    model = factory.high_level_llama("lookup")
    grid = list(factory.lookup_grid)
    llama_runner(model, grid[0])(ids, setting, seed, 4)            # untimed warm-up
    how = (f"measured: shortest end-to-end time on the first prompt of the set "
           f"({factory.lookup_tokens} tokens, seed {seed}) over num_pred_tokens in "
           f"{{{', '.join(map(str, grid))}}}")
    selection = Selection("llamacpp_prompt_lookup_best", setting, how, prompt_set=prompt_set)
    times = {}
    for k in grid:
        m = llama_runner(model, k)(ids, setting, seed, factory.lookup_tokens)
        times[k] = m.end_to_end_seconds
        selection.candidates.append({"config": f"lookup k={k}", "end_to_end_seconds": times[k],
                                     "tokens_per_step": m.tokens_per_step})
    best = min(grid, key=lambda k: (times[k], k))
    selection.chosen = f"lookup k={best}"
    factory.selections.append(selection)
    return MethodSpec("llamacpp_prompt_lookup_best", f"lookup k={best}",
                      llama_runner(model, best), None, chosen_by=how,
                      vector="none (prompt lookup: no draft model, no positional prediction)")
