"""Load time and forward latency of one shipped model (or any model dir) on this machine.

    python benchmarks/model_latency.py --role target --n 1 2 4 8 16 --reps 5
    python benchmarks/model_latency.py --role draft --quantize int8
    python benchmarks/model_latency.py --role target --fast-linear

Measures: cached load seconds, forward latency (min and median ms) for n new tokens over a
`--context`-token DynamicCache (cropped back after every forward), peak RSS. One model per
process: the target is ~7 GB in float32. Prints one JSON object; --out writes it too.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch


def forward_ms(model, cache, n: int, context: int, reps: int, generator) -> float:
    """(min, median) ms of one forward of n new tokens over `context` cached tokens."""
    vocab = model.config.vocab_size
    times = []
    for _ in range(reps + 1):                   # first run warms up the shapes
        ids = torch.randint(0, vocab, (1, n), generator=generator)
        positions = torch.arange(context, context + n).unsqueeze(0)
        start = time.perf_counter()
        model(input_ids=ids, cache=cache, position_ids=positions, use_cache=True)
        times.append((time.perf_counter() - start) * 1e3)
        cache.crop(-n)
    return min(times[1:]), statistics.median(times[1:])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["target", "draft"], default="target")
    parser.add_argument("--path", help="model dir instead of the shipped --role")
    parser.add_argument("--n", type=int, nargs="+", default=[1])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--fast-linear", action="store_true")
    parser.add_argument("--quantize", choices=["int8"], default=None)
    parser.add_argument("--out")
    args = parser.parse_args(argv)

    from transformers import DynamicCache

    from redwood.models.hf_loading import load_model
    from redwood.models.shipped import shipped_model_dir

    path = args.path or shipped_model_dir(args.role)
    start = time.perf_counter()
    model = load_model(path, fast_linear=args.fast_linear, quantize=args.quantize)
    load_s = time.perf_counter() - start
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (1, args.context), generator=generator)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        start = time.perf_counter()
        # transformers 5.24: the cache argument is `cache=` (`past_key_values=` still works but
        # warns on every call and goes away in 5.40)
        model(input_ids=prompt, cache=cache, position_ids=torch.arange(args.context).unsqueeze(0),
              use_cache=True)
        prefill_s = time.perf_counter() - start
        latency = {str(n): [round(t, 1) for t in forward_ms(model, cache, n, args.context, args.reps, generator)]
                   for n in args.n}
    result = {"path": str(path), "fast_linear": args.fast_linear, "quantize": args.quantize,
              "threads": torch.get_num_threads(), "load_s": round(load_s, 2),
              "prefill_s": round(prefill_s, 2), "context": args.context, "forward_ms": latency,
              "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
              # other processes on the machine skew wall-clock times; keep the context
              "load_average_1min_at_end": round(os.getloadavg()[0], 2)}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    sys.exit(main() and 0)
