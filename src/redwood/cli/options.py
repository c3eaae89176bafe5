"""Command-line options shared by several verbs (model selection)."""
from __future__ import annotations

import argparse


def _add_model_args(p):
    p.add_argument("--model", default=None, help="shipped model pair (default: qwen2.5-coder)")
    p.add_argument("--target", default=None, help="target model: HF directory or .gguf file")
    p.add_argument("--draft", default=None, help="draft model: HF directory or .gguf file")
    p.add_argument("--backend", default="auto", choices=["auto", "llamacpp", "hf"],
                   help="model runtime: llama.cpp (GGUF files; the default for the shipped pair "
                   "and .gguf models on CPU) or transformers (HF directories, CUDA)")
    p.add_argument("--tree", default=None,
                   help="tree JSON from `redwood plan`, a bundle directory from `redwood tune`, or "
                   "auto (default for the shipped pair: its tuned bundle for the backend, planned "
                   "for this machine; else the tree shipped with redwood)")
    p.add_argument("--draft-confidence", type=float, default=None, metavar="C",
                   help="adaptive trees: a node gets draft children only while the draft gave "
                   "every token on its path probability >= C (0 = draft the whole tree; default: "
                   "the tuned bundle's value with --tree auto, else 0). Output stays exact")
    p.add_argument("--drafter", default=None, choices=["model", "ngram", "hybrid", "auto"],
                   help="where drafts come from: the draft model, prompt lookup (ngram: matches "
                   "in the prompt and the text so far, free drafts, best for edits of pasted "
                   "code and documents), or hybrid (both in one tree; each step spends its time "
                   "where this machine's costs and the live acceptance say), or auto (per "
                   "temperature from the tuned bundle planned for this machine: ngram where no "
                   "draft-model tree pays, else hybrid; the batched server decides once, ngram "
                   "or model). Default: ngram on llama.cpp, model on transformers")
    p.add_argument("--grow", action=argparse.BooleanOptionalAction, default=None,
                   help="grow each step's tree best-first by calibrated path acceptance, level by "
                   "level, while the next level is worth its cost on this machine (the bundle's "
                   "largest tree bounds it; output stays exact). Default: on for the transformers "
                   "backend with the draft model and a tuned bundle, off elsewhere; --no-grow: "
                   "the bundle's re-planned tree, governed")
    p.add_argument("--bundle-latencies", action="store_true",
                   help="with a tuned bundle: use the trees it planned from its own latency "
                   "profile (default: measure this machine once, cached, and plan its acceptance "
                   "vectors for this machine)")
    p.add_argument("--dtype", default=None, help="float32 (CPU default), bfloat16, float16")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--draft-quantize", default=None, choices=["int8"],
                   help="dynamic int8 draft on CPU: faster drafts, output stays exact")
    p.add_argument("--fast-linear", action="store_true",
                   help="CPU float32: oneDNN matmuls for 4-64 rows, whatever this machine measures "
                   "(the fixed rule of older bundles; --kernels auto measures instead)")
    p.add_argument("--kernels", default="auto", choices=["auto", "stock"],
                   help="transformers backend on a CPU, float32: auto (default) times F.linear "
                   "(MKL) against oneDNN for every row count 1-32 and several prompt lengths at "
                   "first use (seconds, cached per machine) and routes each to the faster; "
                   "stock: F.linear everywhere")


def _add_quick(p):
    p.add_argument("--quick", action="store_true",
                   help="tiny random models built in-process instead of real ones: runs in "
                   "seconds (for CI and trying the pipeline)")


def _model_config(args):
    from redwood.cli.textgen import ModelConfig

    return ModelConfig(model=args.model, target=args.target, draft=args.draft, tree=args.tree,
                       dtype=args.dtype, device=args.device, draft_quantize=args.draft_quantize,
                       fast_linear=getattr(args, "fast_linear", False),
                       kernels=getattr(args, "kernels", "auto"),
                       grow=getattr(args, "grow", None),
                       draft_confidence=args.draft_confidence, backend=args.backend,
                       bundle_latencies=getattr(args, "bundle_latencies", False),
                       drafter=getattr(args, "drafter", None))

