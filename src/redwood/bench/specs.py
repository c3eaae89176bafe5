"""What the benchmark's method builders produce (a leaf: it imports nothing from
redwood.bench): a MethodSpec per method x setting and the Selection record of a grid choice."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass
class MethodSpec:
    """One method, configured for one setting."""
    method: str
    config: str                          # e.g. "n=4 d=4", "k=4", "2x3", "default"
    run: Callable
    predicted: float | None = None       # planner-predicted tokens per target forward
    tree: object = None                  # redwood.plan.tree.Tree, if the method has one
    chosen_by: str = ""                  # how the tree / schedule was chosen
    vector: str = ""                     # which acceptance vector the prediction used


@dataclass
class Selection:
    """A grid choice and the numbers behind it (prompt_set: the set it was made for, when
    the choice is per prompt set)."""
    method: str
    setting: object                      # bench.runners.Setting
    by: str
    candidates: list[dict] = field(default_factory=list)
    chosen: str = ""
    prompt_set: str | None = None

    def as_dict(self) -> dict:
        out = {"method": self.method, "temperature": self.setting.temperature,
               "top_p": self.setting.top_p, "by": self.by, "chosen": self.chosen,
               "candidates": self.candidates}
        if self.prompt_set is not None:
            out["prompt_set"] = self.prompt_set
        return out
