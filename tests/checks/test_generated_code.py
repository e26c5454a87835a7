"""The gate every generated module passes before trainkit writes it: hand-made trees, each with one escape at some
depth (exec in a method, eval in a default argument, __import__ in a decorator...), are refused in one line; the
plain definitions port and trainkit.new write pass."""
import ast
import itertools

import pytest

from trainkit.checks.generated_code import UnsafeCode, check_generated, source_problem
from trainkit.errors import ConfigError

# Code that reaches the interpreter: each is put at every place of SITES below.
ESCAPES = [
    "exec('x = 1')",
    "eval('1')",
    "__import__('os').system('true')",
    "compile('1', 'f', 'eval')",
    "globals()['x']",
    "open('/tmp/marker', 'w')",
    "getattr(__builtins__, 'exec')",
    "getattr(ops, '__class__')",
    "nn.__class__.__subclasses__()",
    "(i for i in ()).gi_frame.f_globals",
    "np.load('f.npz', allow_pickle=True)",
    "getattr(self, name)",
    "vars(self)",
]
# Where an escape can hide in a module of definitions ({} is the escape).
SITES = [
    "x = {}\n",
    "class A(nn.Cell):\n    y = {}\n",
    "class A(nn.Cell):\n    def construct(self, x):\n        return {}\n",
    "class A(nn.Cell):\n    def f(self):\n        def g():\n            return [lambda: {} for _ in range(2)]\n"
    "        return g\n",
    "def f(x, scale={}):\n    return x\n",
    "@{}\ndef f(x):\n    return x\n",
    "class A(nn.Cell, metaclass={}):\n    pass\n",
    "class A(nn.Cell):\n    def __init__(self, depth=3):\n        super().__init__()\n"
    "        self.blocks = [nn.ReLU() for _ in range(depth)] if depth else {}\n",
]
HEADER = '"""A generated module."""\nimport numpy as np\nfrom mindspore import nn, ops\n\n'
PLAIN = HEADER + '''

class Block(nn.Cell):
    """PyTorch's m.Block."""

    def __init__(self, width=4, name='a"b'):
        super().__init__()
        self.dense = nn.Dense(width, width)
        setattr(self, 'block1-0', nn.ReLU())
        self.path = Path(__file__).with_name("buffers.npz")

    def construct(self, x):
        return getattr(self, 'block1-0')(self.dense(x)) * 2


def helper(x):
    return ops.relu(x)


if __name__ == "__main__":
    helper(1)
'''


@pytest.mark.parametrize("escape, site", list(itertools.product(ESCAPES, SITES)))
def test_an_escape_anywhere_in_a_module_is_refused_in_one_line(escape, site):
    source = HEADER + site.format(escape)
    ast.parse(source)  # the trees are valid Python: only the gate stops them
    problem = source_problem(source)
    assert problem is not None, source
    with pytest.raises(UnsafeCode) as raised:
        check_generated({"model.py": source}, by="port")
    message = str(raised.value)
    assert isinstance(raised.value, ConfigError) and "\n" not in message
    assert message.startswith("port refused to write model.py: the generated code ")
    assert "nothing was written" in message


@pytest.mark.parametrize("source, shown", [
    (HEADER + "helper(1)\n", "runs a Expr statement at module level (line 5)"),
    (HEADER + "for _ in range(2):\n    pass\n", "runs a For statement at module level"),
    (HEADER + "if True:\n    x = 1\n", "runs a If statement at module level"),
    (HEADER + "class A:\n    print('at import')\n", "runs a Expr statement in the body of class A"),
    ("import os\n", "imports 'os', which is not one of collections, math, mindspore, numpy, pathlib, trainkit, typing"),
    ("from subprocess import run\n", "imports 'subprocess'"),
    ("from . import model\n", "has a relative or star import"),
    ("from numpy import *\n", "has a relative or star import"),
    ("import numpy\ndef f():\n    import math\n", "imports inside a definition"),
    ("x = 1\ndel x\n", "runs a Delete statement at module level"),
    ("def f():\n    global x\n", "declares global names"),
    ("x = '''\n", "does not parse"),
    ("x = 1\x00\n", "does not parse"),
])
def test_module_level_statements_and_imports_beyond_definitions_are_refused(source, shown):
    problem = source_problem(source)
    assert problem is not None and shown in problem


def test_plain_definitions_pass_and_a_caller_can_widen_the_imports():
    assert source_problem(PLAIN) is None
    check_generated({"model.py": PLAIN})
    assert source_problem("import subprocess\n") is not None
    assert source_problem("import subprocess\n", imports={"subprocess"}) is None
