"""The one check every Python file trainkit writes passes first (``python -m trainkit.port``, ``trainkit.new``).

The generators put names and values that come from elsewhere (a PyTorch model's class and attribute names, its
constructor's values, a project's name) into code only as string literals or checked identifiers. This gate is
what holds when one of them slips: the module is parsed and its tree is walked before anything is written, and a
tree that could run more than definitions on import, or that reaches for the interpreter's escape hatches anywhere
(``exec``, ``eval``, ``__import__``, ``compile``, ``globals``, ``open``, ``getattr(__builtins__, ...)``, dunder
attributes), is refused in one line: the caller writes nothing.
"""
from __future__ import annotations

import ast
from typing import Collection, Mapping, Optional

from trainkit.errors import ConfigError

#: Names that reach the interpreter itself: never a name, an attribute or a getattr's string in generated code.
FORBIDDEN = frozenset({
    "exec", "eval", "compile", "__import__", "globals", "locals", "vars", "open", "breakpoint", "delattr",
    "__builtins__", "builtins", "importlib", "system", "popen", "allow_pickle", "ctypeslib", "load_library",
    # a frame's globals, reached from a generator, coroutine or traceback without any name above
    "gi_frame", "cr_frame", "ag_frame", "tb_frame", "f_back", "f_globals", "f_builtins", "f_locals",
})
#: The dunder names generated code may use: ``super().__init__()``, ``Path(__file__)``, the ``__main__`` guard.
DUNDERS = frozenset({"__init__", "__file__", "__name__"})
#: The modules generated code may import (and their submodules), unless the caller gives its own list.
IMPORTS = frozenset({"math", "collections", "pathlib", "typing", "numpy", "mindspore", "trainkit"})

_MODULE_LEVEL = (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef, ast.Assign, ast.AnnAssign)
_CLASS_LEVEL = (ast.FunctionDef, ast.Assign, ast.AnnAssign, ast.Pass)


class UnsafeCode(ConfigError):
    """Generated code that is not only definitions: refused in one line, nothing written."""


def check_generated(sources: Mapping[str, str], imports: Collection[str] = IMPORTS, by: str = "trainkit") -> None:
    """Refuse (raise :class:`UnsafeCode`) unless every module of `sources` (file name -> source) parses and holds,
    at module level, only imports of `imports`, class and function definitions, assignments, docstrings and an
    ``if __name__ == "__main__":`` guard, and nowhere a name of :data:`FORBIDDEN` or a dunder beyond
    :data:`DUNDERS`. `by` names the generator in the message."""
    for name, source in sources.items():
        problem = source_problem(source, imports)
        if problem:
            raise UnsafeCode(f"{by} refused to write {name}: the generated code {problem}; nothing was written "
                             "(a name or value of the input reached the code: please report it)")


def source_problem(source: str, imports: Collection[str] = IMPORTS) -> Optional[str]:
    """Why `source` fails the gate, as the end of a sentence, or None (see :func:`check_generated`)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as error:  # ValueError: a null byte
        return f"does not parse ({' '.join(str(error).split())[:120]})"
    for statement in tree.body:
        if not (isinstance(statement, _MODULE_LEVEL) or _is_docstring(statement) or _is_main_guard(statement)):
            return f"runs a {type(statement).__name__} statement at module level (line {statement.lineno})"
    for node in ast.walk(tree):
        problem = _node_problem(node, tree, imports)
        if problem:
            return f"{problem} (line {getattr(node, 'lineno', '?')})"
    return None


def _node_problem(node: ast.AST, tree: ast.Module, imports: Collection[str]) -> Optional[str]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        if node not in tree.body:
            return "imports inside a definition"
        modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        if isinstance(node, ast.ImportFrom) and (node.level or any(alias.name == "*" for alias in node.names)):
            return "has a relative or star import"
        for module in modules:
            if module.split(".")[0] not in imports:
                return f"imports {module!r}, which is not one of {', '.join(sorted(imports))}"
        for alias in node.names:
            if _forbidden(alias.name) or _forbidden(alias.asname or ""):
                return f"imports the name {alias.name!r}"
    elif isinstance(node, ast.ClassDef):
        for statement in node.body:
            if not (isinstance(statement, _CLASS_LEVEL) or _is_docstring(statement)):
                return f"runs a {type(statement).__name__} statement in the body of class {node.name}"
    elif isinstance(node, ast.Name) and _forbidden(node.id):
        return f"uses the name {node.id!r}"
    elif isinstance(node, ast.Attribute) and _forbidden(node.attr):
        return f"uses the attribute {node.attr!r}"
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _forbidden(node.name):
        return f"defines {node.name!r}"
    elif isinstance(node, ast.arg) and _forbidden(node.arg):
        return f"has an argument {node.arg!r}"
    elif isinstance(node, ast.keyword) and node.arg and _forbidden(node.arg):
        return f"passes the keyword {node.arg!r}"
    elif isinstance(node, (ast.Global, ast.Nonlocal)):
        return f"declares {type(node).__name__.lower()} names"
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in ("getattr", "setattr", "hasattr"):
        name = node.args[1] if len(node.args) > 1 else None
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            return f"calls {node.func.id} with a computed attribute name"
        if _forbidden(name.value):
            return f"calls {node.func.id} for {name.value!r}"
    return None


def _forbidden(name: str) -> bool:
    dunder = name.startswith("__") and name.endswith("__") and len(name) > 4
    return name in FORBIDDEN or (dunder and name not in DUNDERS)


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) \
        and isinstance(statement.value.value, str)


def _is_main_guard(statement: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` with no else (its body is walked like the rest)."""
    test = statement.test if isinstance(statement, ast.If) and not statement.orelse else None
    return isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__" \
        and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq) and len(test.comparators) == 1 \
        and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == "__main__"
