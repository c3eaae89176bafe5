"""Tree structure, validation, JSON, path-list exports, rendering, builders."""
import json

import numpy as np
import pytest

from redwood.errors import RedwoodError
from redwood.plan.tree import Tree, chain, specinfer, star

# root 0 with children 1, 2; node 1 has children 3, 4; node 2 has child 5; node 3 has child 6
PARENTS = [-1, 0, 0, 1, 1, 2, 3]


def test_derived_structure():
    t = Tree(PARENTS)
    assert len(t) == 7
    assert t.children == [[1, 2], [3, 4], [5], [6], [], [], []]
    assert t.depths.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert t.position_offsets.tolist() == t.depths.tolist()
    assert t.ranks.tolist() == [0, 1, 2, 1, 2, 1, 1]
    assert t.num_levels == 4
    assert t.level_sizes == [1, 2, 3, 1]
    assert [lv.tolist() for lv in t.levels] == [[0], [1, 2], [3, 4, 5], [6]]
    assert t.max_width == 2


def test_ancestor_mask_matches_parent_walk():
    t = Tree(PARENTS)
    mask = t.ancestor_mask()
    for i in range(len(t)):
        ancestors, j = set(), i
        while j != -1:
            ancestors.add(j)
            j = t.parents[j]
        assert set(np.nonzero(mask[i])[0].tolist()) == ancestors


def test_expected_length_is_sum_of_path_products():
    p = [0.6, 0.25]
    t = Tree(PARENTS)
    # node values: 1, .6, .25, .36, .15, .15, .216
    assert t.expected_length(p) == pytest.approx(1 + .6 + .25 + .36 + .15 + .25 * .6 + .36 * .6)
    # a rank beyond len(p) is worth nothing
    assert t.expected_length([0.6]) == pytest.approx(1 + .6 + .36 + .216)


BAD_PARENTS = [
    ([], "empty tree"),
    ([0, 0], "must be the root"),
    ([-1, 0, -1], "second root"),
    ([-1, 0, 7], "out of range"),
    ([-1, 0, -3], "out of range"),
    ([-1, 2, 0], "not before its child"),
    ([-1, 1], "not before its child"),
    ([-1, 0, 0, 2, 1], "not in BFS order"),
    ([-1, 0, 1.5], "must be integers"),
    ([-1, True], "must be integers"),
    ("-1,0", "list of integers"),
]


@pytest.mark.parametrize("parents,message", BAD_PARENTS)
def test_bad_parents_rejected(parents, message):
    with pytest.raises(RedwoodError, match=message):
        Tree(parents)


def test_depth_limit():
    Tree(PARENTS, max_depth=4)
    with pytest.raises(RedwoodError, match="4 levels .* above the limit max_depth=3"):
        Tree(PARENTS, max_depth=3)


def test_json_round_trip(tmp_path):
    p = [0.7, 0.2]
    t = Tree(PARENTS, source={"made_by": "hand"})
    path = t.save(tmp_path / "t.json", p=p)
    data = json.loads(path.read_text())
    assert data["format"] == 1 and data["kind"] == "tree"
    assert data["parents"] == PARENTS
    assert data["budget"] == 7 and data["depth"] == 4
    assert data["expected_length"] == pytest.approx(t.expected_length(p))
    back = Tree.load(path)
    assert back == t
    assert back.source["made_by"] == "hand"
    assert Tree.load(path, max_depth=4) == t


def _write(tmp_path, payload, name="t.json"):
    path = tmp_path / name
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return path


@pytest.mark.parametrize("payload,message", [
    ({"format": 1, "kind": "tree", "parents": [-1, 0, 0, 2, 1]}, "not in BFS order"),
    ({"format": 1, "kind": "tree", "parents": [-1, -1]}, "second root"),
    ({"format": 1, "kind": "tree", "parents": [-1, 5]}, "out of range"),
    ({"format": 1, "kind": "tree", "parents": [-1, 0, 3, 1]}, "not before its child"),
    ({"format": 1, "kind": "tree", "parents": []}, "empty tree"),
    ({"format": 1, "kind": "tree"}, "missing 'parents'"),
    ({"format": 2, "kind": "tree", "parents": [-1]}, "format 2 is not supported"),
    ({"format": 1, "kind": "profile", "parents": [-1]}, "expected 'tree'"),
    ([-1, 0], "expected a JSON object"),
    ("{not json", "not valid JSON"),
])
def test_bad_tree_files_rejected(tmp_path, payload, message):
    path = _write(tmp_path, payload)
    with pytest.raises(RedwoodError, match=message) as info:
        Tree.load(path)
    assert str(path) in str(info.value)       # the message names the file


def test_load_depth_limit_and_missing_file(tmp_path):
    path = Tree(PARENTS).save(tmp_path / "t.json")
    with pytest.raises(RedwoodError, match="above the limit max_depth=2"):
        Tree.load(path, max_depth=2)
    with pytest.raises(RedwoodError, match="not found"):
        Tree.load(tmp_path / "missing.json")


def test_exports():
    t = Tree(PARENTS)
    assert t.to_vllm() == [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    assert t.to_medusa() == [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


@pytest.mark.parametrize("tree", [Tree(PARENTS), chain(5), star(4), specinfer(3, 3),
                                  Tree([-1]), Tree([-1, 0, 0, 0, 1, 1, 2, 4, 4, 4])])
def test_export_round_trips(tree):
    assert Tree.from_paths(tree.to_vllm()) == tree
    assert Tree.from_paths(tree.to_medusa()) == tree
    shuffled = list(reversed(tree.to_medusa()))
    assert Tree.from_paths(shuffled) == tree      # BFS order is rebuilt from any order


@pytest.mark.parametrize("paths,message", [
    ([(0,), (0, 0), (1, 1)], "no parent path"),
    ([(0,), (2,)], "skips rank 1"),
    ([(0,), (0,)], "duplicate"),
    ([(0,), ()], "non-empty"),
    ([(0,), (-1,)], "ranks >= 0"),
    ([(0,), "01"], "list of 0-based ranks"),
])
def test_bad_paths_rejected(paths, message):
    with pytest.raises(RedwoodError, match=message):
        Tree.from_paths(paths)


def test_render_shows_every_node_once_in_depth_first_order():
    t = Tree(PARENTS)
    lines = t.render().splitlines()
    assert len(lines) == len(t)
    labels = [line.lstrip("|`- ").split()[0] for line in lines]
    assert labels == ["0", "1", "3", "6", "4", "2", "5"]      # depth-first, rank order
    valued = t.render(p=[0.5, 0.5]).splitlines()
    assert valued[-1].endswith("0.2500")                          # node 5 = .5 * .5
    cut = star(30).render(max_nodes=10).splitlines()
    assert len(cut) == 11 and "21 more nodes" in cut[-1]


def test_builders():
    assert chain(1).parents == [-1]
    assert chain(4).parents == [-1, 0, 1, 2]
    assert star(3).parents == [-1, 0, 0, 0]
    assert star(0).parents == [-1]
    s = specinfer(2, 3)
    assert s.parents == [-1, 0, 0, 1, 2, 3, 4]
    assert len(s) == 1 + 2 * 3 and s.num_levels == 4 and s.level_sizes == [1, 2, 2, 2]
    assert s.ranks[3:].tolist() == [1, 1, 1, 1]        # each chain continues with rank 1
    for bad in (lambda: chain(0), lambda: specinfer(0, 2), lambda: specinfer(2, 0),
                lambda: star(-1), lambda: chain(2.0)):
        with pytest.raises(RedwoodError, match="must be an integer"):
            bad()
