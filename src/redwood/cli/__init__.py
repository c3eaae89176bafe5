"""The `redwood` command line (verbs in main.py, measuring verbs in measure.py)."""


def main(argv=None) -> int:
    from redwood.cli.main import main as run

    return run(argv)
