"""Planning trees, pure numpy (importing this package never imports torch).

tree: the Tree type; planner: the DP and the hardware-aware choice; adaptive: plans for
confidence-pruned trees; formats: the acceptance / profile file formats; render: drawings.
"""
