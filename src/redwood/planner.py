"""Placeholder; the planner issue fills this in (pure numpy)."""


def optimal_tree(p, budget, max_depth):
    raise NotImplementedError


def choose_tree(*args, **kwargs):
    raise NotImplementedError
