"""`redwood` command line: a thin layer over the library API.

Each verb has an `_add_<verb>(subparsers)` that declares its arguments and a
`_cmd_<verb>(args)` that runs it. User errors raise RedwoodError (or ValueError
from validation) and are printed as one line with exit code 2.
"""
from __future__ import annotations

import argparse
import sys

from redwood.errors import RedwoodError


# --- plan / export (planner issue) -------------------------------------------------

def _add_plan(sub):
    p = sub.add_parser("plan", help="plan a DP-optimal draft tree")
    p.set_defaults(func=_cmd_plan)


def _cmd_plan(args):
    raise RedwoodError("plan: not implemented yet")


def _add_export(sub):
    p = sub.add_parser("export", help="export a tree for other serving engines")
    p.set_defaults(func=_cmd_export)


def _cmd_export(args):
    raise RedwoodError("export: not implemented yet")


# --- generate / demo (engine issue) --------------------------------------------------

def _add_generate(sub):
    p = sub.add_parser("generate", help="generate text with tree speculative decoding")
    p.set_defaults(func=_cmd_generate)


def _cmd_generate(args):
    raise RedwoodError("generate: not implemented yet")


def _add_demo(sub):
    p = sub.add_parser("demo", help="run the demo on the shipped model pair")
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args):
    raise RedwoodError("demo: not implemented yet")


# --- serve (server issue) ------------------------------------------------------------

def _add_serve(sub):
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    p.set_defaults(func=_cmd_serve)


def _cmd_serve(args):
    raise RedwoodError("serve: not implemented yet")


# -------------------------------------------------------------------------------------

_VERBS = [_add_plan, _add_export, _add_generate, _add_demo, _add_serve]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="redwood", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    for add in _VERBS:
        add(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (RedwoodError, ValueError, FileNotFoundError) as exc:
        print(f"redwood {args.verb}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
