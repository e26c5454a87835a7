"""From a PyTorch module tree to the source of a MindSpore module: one ``nn.Cell`` class per PyTorch class.

Each module of a class that is not a ``torch.nn`` layer is traced with ``torch.fx``, one level at a time (its
children are leaves), so ``construct`` calls the same children in the same order as ``forward``: the code reads
like the PyTorch model, not like a graph dump. Instances of a class whose traces differ (a ResNet block with a
``downsample`` and one without) become classes of their own (``BasicBlock``, ``BasicBlock2``). A constructor
argument that differs between the instances of a class (channels, strides) becomes a parameter of its Cell,
named after the child and the argument (``conv1_in_channels``); the others are written in as constants.
Every child keeps its PyTorch attribute name, so every parameter keeps its ``state_dict`` name.
"""
from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy

from trainkit.bridge.port_classes import CLASSES, IMPORTS, class_call
from trainkit.bridge.port_classes import HELPERS as CLASS_HELPERS
from trainkit.bridge.port_layers import (
    CONTAINERS,
    FUNCTIONS,
    HELPER_IMPORTS,
    HELPERS,
    METHODS,
    Call,
    Unsupported,
    layer_call,
    render_call,
    target_name,
)
from trainkit.bridge.port_trace import Recording, record, tracer_for
from trainkit.errors import ConfigError

LINE = 116


class PortFailure(ConfigError):
    """Port failed on a module it should cover (a port bug): one line naming the module, nothing written."""


@dataclass
class Problem:
    """Something ``port`` cannot write: what, and where the model uses it."""

    what: str
    where: str


@dataclass
class Variant:
    """One generated Cell class: a PyTorch class whose instances trace to the same ``construct``."""

    name: str
    torch_class: str
    construct: List[str]
    children: Dict[str, Any]  # attribute -> Call of the first instance (the template)
    instances: List[Dict[str, Any]] = field(default_factory=list)  # each instance's children
    parameters: List[Tuple[Tuple[Any, ...], str]] = field(default_factory=list)  # (slot path, argument name)


@dataclass
class Port:
    """The generated source, the top Cell's name and what could not be ported (nothing written when any)."""

    source: str
    top: str
    problems: List[Problem]
    classes: List[str] = field(default_factory=list)
    specialised: List[str] = field(default_factory=list)  # modules whose code holds for the batch's shape only


class _Generator:
    def __init__(self):
        self.variants: Dict[Tuple, Variant] = {}
        self.order: List[Variant] = []
        self.names: Dict[str, int] = {}
        self.helpers: List[str] = []
        self.problems: List[Problem] = []
        self.ordered_dict = False
        self.stack: List[str] = []  # the modules being ported, outermost first
        self.recording: Optional[Recording] = None  # the modules' inputs and outputs on the comparison's batch
        self.specialised: List[str] = []  # the modules whose construct holds for the batch's shape only

    # ---------------------------------------------------------------- the tree
    def spec(self, module: Any, path: str) -> Any:
        """The Call building `module` (a layer, a container, or an instance of a generated class)."""
        self.stack.append(f"{path or 'the model'} ({type(module).__qualname__})")
        call = self._spec(module, path)
        self.stack.pop()  # left on the stack when an error stops the port: the module it stopped at
        return call

    def _spec(self, module: Any, path: str) -> Any:
        kind = type(module)
        container = _container(module)
        if container is not None:
            named = list(module.named_children())
            items = [self.spec(child, f"{path}.{name}" if path else name) for name, child in named]
            if [name for name, _ in named] == [str(index) for index in range(len(named))]:
                return Call(CONTAINERS[container], args=[items])
            self.ordered_dict = True  # children named otherwise (DenseNet's conv0, norm0): their names kept
            return Call(CONTAINERS[container], args=[Call("OrderedDict", args=[
                [Call("", args=[name, item]) for (name, _), item in zip(named, items)]])])
        library = kind.__module__.startswith("torch.nn") or kind.__module__.startswith("torch.")
        if library or f"{kind.__module__}.{kind.__qualname__}" in CLASSES:
            try:
                call = layer_call(module) if library else class_call(
                    module, lambda name: self.spec(getattr(module, name), f"{path}.{name}" if path else name))
            except Unsupported as error:
                self.problems.append(Problem(str(error), path or "(the model)"))
                return Call("None")
            for helper in self._helpers_of(call):
                if helper not in self.helpers:
                    self.helpers.append(helper)
            return call
        return self.traced(module, path)

    def _helpers_of(self, call: Any) -> List[str]:
        found = []
        if isinstance(call, Call):
            if call.helper:
                found.append(call.helper)
            for value in [*call.kwargs.values(), *call.args]:
                found += self._helpers_of(value)
        elif isinstance(call, list):
            for value in call:
                found += self._helpers_of(value)
        return found

    def traced(self, module: Any, path: str) -> Call:
        children = {name: self.spec(child, f"{path}.{name}" if path else name)
                    for name, child in module.named_children()}
        construct = self.construct(module, path)
        for name, value in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            if not value.is_floating_point() or name in module._non_persistent_buffers_set:
                self.problems.append(Problem(f"{type(module).__qualname__}'s own {value.dtype} tensor {name}"
                                             " (only floating-point parameters and buffers of the state_dict)",
                                             path or "(the model)"))
            children[name] = _own_parameter(name, value, trainable=value.requires_grad)  # ConvNeXt's layer_scale
        key = (type(module), tuple(construct), tuple((name, _signature(value)) for name, value in children.items()))
        variant = self.variants.get(key)
        if variant is None:
            base = type(module).__name__
            count = self.names.get(base, 0) + 1
            self.names[base] = count
            variant = Variant(base if count == 1 else f"{base}{count}",
                              f"{type(module).__module__}.{type(module).__qualname__}", construct, children)
            self.variants[key] = variant
            self.order.append(variant)
        variant.instances.append(children)
        return Call(variant.name, {"__instance__": (variant, len(variant.instances) - 1)})

    # ---------------------------------------------------------------- construct
    def construct(self, module: Any, path: str) -> List[str]:
        where = f"{type(module).__qualname__}.forward" + (f" (at {path})" if path else "")
        tracer = tracer_for(module, self.recording)
        try:
            graph = tracer.trace(module)
        except Exception as error:  # fx raises many kinds (TraceError, TypeError on data-dependent control flow)
            self.problems.append(Problem(f"{type(module).__qualname__}.forward cannot be traced by torch.fx: "
                                         f"{' '.join(str(error).split())[:200]}", path or "(the model)"))
            return []
        for node in [node for node in graph.nodes if node.op == "call_function"
                     and target_name(node.target) in ("torch._assert", "torch.fx._symbolic_trace._assert_is_none")]:
            graph.erase_node(node)  # PyTorch's checks of the input (timm's rank asserts): not carried over
        for node in reversed(list(graph.nodes)):  # what only the checks used (x.ndim == 4)
            if node.op in ("call_function", "call_method", "get_attr") and not node.users:
                graph.erase_node(node)
        names: Dict[Any, str] = {}
        inputs: List[str] = []
        lines: List[str] = []
        for node in graph.nodes:
            name = _variable(node.name)
            names[node] = name

            def code(value: Any) -> str:
                return _code(value, names)

            if node.op == "placeholder":
                default = f"={node.args[0]!r}" if node.args else ""
                inputs.append(f"{name}{default}")
                continue
            if node.op == "output":
                lines.append(f"return {code(node.args[0])}")
                continue
            args = tuple(code(arg) for arg in node.args)
            if node.op == "call_function" and target_name(node.target) == "operator.getitem" \
                    and isinstance(node.args[1], tuple) and node.args[1]:
                args = (args[0], ", ".join(code(item) for item in node.args[1]))  # x[:, -1], not x[(:, -1)]
            kwargs = {key: code(value) for key, value in node.kwargs.items()}
            try:
                if node.op == "call_module":
                    expression = f"{_attribute(node.target)}({', '.join([*args, *_keywords(kwargs)])})"
                elif node.op == "call_function":
                    what = target_name(node.target)
                    if what not in FUNCTIONS:
                        raise Unsupported(what)
                    expression = render_call(FUNCTIONS[what], args, kwargs, what)
                elif node.op == "call_method":
                    if node.target not in METHODS:
                        raise Unsupported(f"Tensor.{node.target}")
                    expression = render_call(METHODS[node.target], args, kwargs, f"Tensor.{node.target}")
                else:  # get_attr: a parameter or buffer used directly, reported with the module's own
                    expression = f"self.{node.target}"
            except Unsupported as error:
                self.problems.append(Problem(str(error), where))
                continue
            lines.append(f"{name} = {expression}")
        note = [f"# forward with {', '.join(dict.fromkeys(tracer.arguments))}, as it is called here (its other "
                "branches are not written)"] if tracer.arguments else []
        if tracer.decisions:  # forward branched on sizes or arguments: the branches taken for these inputs
            args, kwargs = self.recording.inputs[id(module)]
            shapes = ", ".join("x".join(map(str, value.shape)) for value in (*args, *kwargs.values())
                               if hasattr(value, "shape"))
            note += [f"# Traced for inputs of shape {shapes}: forward's branches ({'; '.join(tracer.decisions)}) "
                    "were taken for them", "# and are not in this code, which holds for inputs of that shape."]
            self.specialised.append(f"{type(module).__qualname__} (at {path or 'the model'})")
        return [*note, f"def construct(self, {', '.join(inputs)}):", *(f"    {line}" for line in lines)]

    # ---------------------------------------------------------------- classes
    def finish(self) -> None:
        """Each variant's parameters: the constructor slots whose values differ between its instances."""
        for variant in self.order:
            slots: Dict[Tuple, List[Any]] = {}
            for children in variant.instances:
                for path, value in _slots(children, ()):
                    slots.setdefault(path, []).append(value)
            taken: set = set()
            # slots that always hold the same values (a conv's out_channels and the next norm's num_features)
            # share one parameter, named after the first
            groups: Dict[str, str] = {}
            for path, values in slots.items():
                if all(repr(value) == repr(values[0]) for value in values):
                    continue
                key = repr(values)
                if key not in groups:
                    own = variant.children.get(path[0])
                    groups[key] = _parameter_name(
                        (path[0], ("fill", "shape")[path[-1]]) if _is_own(own) and len(path) == 3 else path, taken)
                    taken.add(groups[key])
                variant.parameters.append((path, groups[key]))

    def instance_call(self, call: Call) -> Call:
        variant, index = call.kwargs["__instance__"]
        values = dict(_slots(variant.instances[index], ()))
        return Call(variant.name, {name: values[path] for path, name in variant.parameters})

    def arguments(self, variant: Variant) -> List[str]:
        return list(dict.fromkeys(name for _, name in variant.parameters))

    def render_value(self, value: Any, path: Tuple, parameters: Dict[Tuple, str], indent: int) -> str:
        if path in parameters:
            return parameters[path]
        if isinstance(value, Call):
            if "__instance__" in value.kwargs:
                value = self.instance_call(value)
            parts = [self.render_value(arg, path + (index,), parameters, indent + 4)
                     for index, arg in enumerate(value.args)]
            parts += [f"{key}={self.render_value(arg, path + (key,), parameters, indent + 4)}"
                      for key, arg in value.kwargs.items()]
            if value.callee == "None":
                return "None"
            line = f"{value.callee}({', '.join(parts)})"
            if len(line) + indent + 16 <= LINE and "\n" not in line:
                return line
            pad = " " * (indent + 4)
            return f"{value.callee}(\n" + ",\n".join(pad + part for part in parts) + ")"
        if isinstance(value, list):
            parts = [self.render_value(item, path + (index,), parameters, indent + 4)
                     for index, item in enumerate(value)]
            line = f"[{', '.join(parts)}]"
            if len(line) + indent + 16 <= LINE and "\n" not in line:
                return line
            pad = " " * (indent + 4)
            return "[\n" + ",\n".join(pad + part for part in parts) + "]"
        return repr(value)

    def class_source(self, variant: Variant) -> str:
        parameters = {path: name for path, name in variant.parameters}
        signature = ", ".join(["self", *self.arguments(variant)])
        if len(signature) > LINE - 20:
            signature = ",\n                 ".join(_wrap(["self", *self.arguments(variant)], LINE - 20))
        lines = [f"class {variant.name}(nn.Cell):",
                 f'    """PyTorch\'s {variant.torch_class}'
                 + ('' if variant.name == variant.torch_class.rsplit('.', 1)[-1] else
                    ' (instances whose forward traces differently from the other variants)') + '."""', "",
                 f"    def __init__({signature}):", "        super().__init__()"]
        for attribute, call in variant.children.items():
            value = self.render_value(call, (attribute,), parameters, 8)
            lines.append(f"        self.{attribute} = {value}" if attribute.isidentifier() else
                         f"        setattr(self, {attribute!r}, {value})")  # PyTorch's name, kept
        lines.append("")
        lines += [f"    {line}" for line in variant.construct] or ["    def construct(self, x):", "        return x"]
        return "\n".join(lines)


def _wrap(items: List[str], width: int) -> List[str]:
    """`items` joined into lines of at most `width` characters (for a long signature)."""
    lines: List[str] = []
    for item in items:
        if lines and len(lines[-1]) + len(item) + 2 <= width:
            lines[-1] += f", {item}"
        else:
            lines.append(item)
    return lines


def _signature(value: Any) -> Any:
    if isinstance(value, Call):
        if "__instance__" in value.kwargs:
            return value.kwargs["__instance__"][0].name
        # a layer given as an argument (timm's BatchNormAct2d(act=nn.ReLU())) is part of the signature, as a child
        return (value.callee, tuple((key, _signature(arg)) for key, arg in value.kwargs.items()),
                tuple(_signature(arg) for arg in value.args))
    if isinstance(value, list):
        return tuple(_signature(item) for item in value)
    return None


def _slots(value: Any, path: Tuple) -> List[Tuple[Tuple, Any]]:
    """(path, literal) of every constructor argument in `value` (children of one instance)."""
    if isinstance(value, dict):
        return [slot for key, item in value.items() for slot in _slots(item, path + (key,))]
    if isinstance(value, Call):
        if "__instance__" in value.kwargs:
            variant, index = value.kwargs["__instance__"]
            values = dict(_slots(variant.instances[index], ()))
            return [(path + (name,), values[slot]) for slot, name in variant.parameters]
        return [slot for index, arg in enumerate(value.args) for slot in _slots(arg, path + (index,))] + \
            [slot for key, arg in value.kwargs.items() for slot in _slots(arg, path + (key,))]
    if isinstance(value, list):
        return [slot for index, item in enumerate(value) for slot in _slots(item, path + (index,))]
    return [(path, value)]


def _parameter_name(path: Tuple, taken: set) -> str:
    name = re.sub(r"\W", "_", "_".join(str(part) for part in path))
    if not name.isidentifier() or keyword.iskeyword(name):
        name = f"layer{name}"  # a child named 0 (a Sequential's): layer0_in_channels
    candidate, count = name, 1
    while candidate in taken:
        count += 1
        candidate = f"{name}{count}"
    return candidate


def _variable(name: str) -> str:
    return f"{name}_" if keyword.iskeyword(name) or name == "self" else name


def _attribute(target: str) -> str:
    """``self.layers[0]`` for fx's ``layers.0``."""
    code = "self"
    for index, part in enumerate(target.split(".")):
        if part.isidentifier():
            code += f".{part}"
        elif part.isdigit() and index:  # an item of a container
            code += f"[{part}]"
        else:  # a child whose name is no identifier (torchvision's block1-0), as PyTorch names it
            code = f"getattr({code}, {part!r})"
    return code


def _keywords(kwargs: Dict[str, str]) -> List[str]:
    return [f"{key}={value}" for key, value in kwargs.items()]


def _code(value: Any, names: Dict[Any, str]) -> str:
    """A traced argument as code: a node's variable, a literal, a slice, or a container of them."""
    if value in names if _hashable(value) else False:
        return names[value]
    if isinstance(value, tuple):
        items = [_code(item, names) for item in value]
        return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
    if isinstance(value, list):
        return f"[{', '.join(_code(item, names) for item in value)}]"
    if isinstance(value, slice):
        parts = ["" if part is None else _code(part, names) for part in (value.start, value.stop, value.step)]
        return ":".join(parts[:2]) + (f":{parts[2]}" if parts[2] else "")
    if value is Ellipsis:
        return "..."
    if type(value).__module__.startswith("torch"):
        raise Unsupported(f"a {type(value).__name__} constant")
    return repr(value)


def _own_parameter(name: str, value: Any, trainable: bool) -> Call:
    """``Parameter(initializer(fill, shape))`` for a module's own (floating-point) tensor: its value where
    constant (a layer scale's 1e-6), else zeros (the port's weights.ckpt holds the values)."""
    flat = value.detach().flatten()
    fill = float(flat[0]) if flat.numel() and bool((flat == flat[0]).all()) else 0.0
    fill = float(str(numpy.float32(fill)))  # 1e-06, as it was written, not float32's 9.99999997e-07
    kwargs: Dict[str, Any] = {"name": name}
    if not trainable:
        kwargs["requires_grad"] = False
    return Call("Parameter", kwargs, args=[Call("initializer", args=[fill, tuple(value.shape)])])


def _is_own(call: Any) -> bool:
    return isinstance(call, Call) and call.callee == "Parameter"


def _container(module: Any) -> Any:
    """The :data:`CONTAINERS` key `module` is, or None: a torch.nn container, or a subclass that keeps its forward
    (torchvision's Conv2dNormActivation and RegNet's AnyStage are Sequentials)."""
    import torch

    for base in type(module).__mro__:
        if base.__name__ in CONTAINERS and base.__module__.startswith("torch.nn"):
            if type(module).forward is base.forward and not any(True for _ in module.named_parameters(
                    recurse=False)) and not any(True for _ in module.named_buffers(recurse=False)):
                return base.__name__
            return None
        if base is torch.nn.Module:
            return None
    return None


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return type(value).__name__ == "Node"


def generate(model: Any, origin: str, batch: Any = None) -> Port:
    """The MindSpore source mirroring `model` (a torch module in eval mode); `origin` is ``MODULE:CLASS``; `batch`
    (a torch tensor), the comparison's: the branches of a forward on sizes are taken as for it."""
    generator = _Generator()
    try:
        if batch is not None:
            generator.recording = record(model, batch)
        top = generator.spec(model, "")
    except Exception as error:  # a bug of port's on a module it should cover: one line naming that module
        where = generator.stack[-1] if generator.stack else "the model"
        raise PortFailure(f"port failed at {where}: {type(error).__name__}: {_first_line(error)} (a port bug, "
                          "please report it); nothing was written") from error
    if generator.problems or not isinstance(top, Call) or "__instance__" not in top.kwargs:
        if not generator.problems:
            generator.problems.append(Problem(f"the model is a single torch.nn layer ({type(model).__name__}): "
                                              "port a module of your own that holds it", "(the model)"))
        return Port("", "", generator.problems)
    generator.finish()
    imports = {name for helper in generator.helpers for name in HELPER_IMPORTS.get(helper, ())}
    header = [f'"""A MindSpore port of PyTorch\'s {origin}, written by python -m trainkit.port from its torch.fx '
              "trace.", "",
              "Parameter names are the PyTorch state_dict's (batch norm's and layer norm's weight/bias/running_mean/"
              "running_var are", "gamma/beta/moving_mean/moving_variance here). This file is yours to edit.",
              '"""']
    if "math" in imports:
        header.append("import math")
        header.append("")
    if generator.ordered_dict:
        header += ["from collections import OrderedDict", ""]
    if any(_is_own(call) for variant in generator.order for call in variant.children.values()):
        imports.add("initializer")
    header.append("from mindspore import Parameter, nn, ops" if imports else "from mindspore import nn, ops")
    if "initializer" in imports:
        header.append("from mindspore.common.initializer import Normal, Uniform, initializer")
    header += list(dict.fromkeys(line for helper in generator.helpers for line in IMPORTS.get(helper, ())))
    blocks = ["\n".join(header)]
    sources = {**HELPERS, **CLASS_HELPERS}
    blocks += [sources[helper].strip("\n") for helper in generator.helpers if helper in sources]
    blocks += [generator.class_source(variant) for variant in generator.order]
    source = "\n\n\n".join(blocks) + "\n"
    _check_compiles(source, generator.order)
    return Port(source, top.kwargs["__instance__"][0].name, [],
                [*(helper for helper in generator.helpers if helper in sources),
                 *(variant.name for variant in generator.order)], generator.specialised)


def _first_line(error: BaseException) -> str:
    text = " ".join(str(error).strip().splitlines()[:1])
    return " ".join(text.split())[:300] or type(error).__name__


def _check_compiles(source: str, variants: Sequence[Variant]) -> None:
    """Raise PortFailure naming the PyTorch class whose generated class is not valid Python (a port bug)."""
    try:
        compile(source, "model.py", "exec")
    except SyntaxError as error:
        lines = source.splitlines()[:error.lineno or 0]
        owner = next((line.split()[1].split("(")[0] for line in reversed(lines) if line.startswith("class ")), "")
        where = next((variant.torch_class for variant in variants if variant.name == owner), owner or "the header")
        raise PortFailure(f"the code written for {where} is not valid Python ({error.msg}, line {error.lineno}): "
                          "a port bug, please report it") from error


def problem_lines(problems: Sequence[Problem]) -> List[str]:
    """One line per unsupported thing, with every place it is used."""
    places: Dict[str, List[str]] = {}
    for problem in problems:
        places.setdefault(problem.what, [])
        if problem.where not in places[problem.what]:
            places[problem.what].append(problem.where)
    return [f"unsupported: {what}: used at {', '.join(where[:6])}" + (f" and {len(where) - 6} more places"
                                                                       if len(where) > 6 else "")
            for what, where in places.items()]
