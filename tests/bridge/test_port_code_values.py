"""Port's code for a traced call's arguments: a dict of keyword values (fx's immutable_dict, as SqueezeBERT's
attention passes one) is written as a dict literal whose keys are inert constants and whose values are the traced
variables or literals; evaluated, it is the dict the trace held."""
import ast
import random

import pytest

torch = pytest.importorskip("torch")
from torch.fx.immutable_collections import immutable_dict  # noqa: E402

from trainkit.bridge.port.code import code  # noqa: E402


class Node:
    """Stands for a traced value (a hashable object the names map to a variable)."""


@pytest.mark.parametrize("seed", range(40))
def test_a_dict_of_traced_values_is_a_dict_literal_that_evaluates_to_the_traced_dict(seed):
    rng = random.Random(seed)
    node = Node()
    names = ["groups", "dim", "x", "'); import os #", "a\nb", "ü"]
    keys = [rng.choice(names) + str(i) for i in range(rng.randint(0, 4))]
    values = {key: rng.choice([node, 3, -1.5, None, "text", (1, 2), [node, 4]]) for key in keys}
    written = code(immutable_dict(values), {node: "hidden"})
    tree = ast.parse(written, mode="eval")
    assert isinstance(tree.body, ast.Dict)
    assert all(isinstance(key, ast.Constant) for key in tree.body.keys)  # keys are inert constants
    marker = object()
    evaluated = eval(compile(tree, "<code>", "eval"), {"__builtins__": {}}, {"hidden": marker})  # noqa: S307
    swap = {id(node): marker}

    def expected(value):
        if isinstance(value, list):
            return [expected(item) for item in value]
        return swap.get(id(value), value)

    assert evaluated == {key: expected(value) for key, value in values.items()}
