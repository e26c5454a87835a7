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

import ast
import functools
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from trainkit.bridge.port import arguments as port_arguments
from trainkit.bridge.port import buffers as port_buffers
from trainkit.bridge.port import code as port_code
from trainkit.bridge.port import layers as port_layers
from trainkit.bridge.port import ties as port_ties
from trainkit.bridge.port import transformers as port_transformers
from trainkit.bridge.port.classes import CLASSES, IMPORTS, class_call
from trainkit.bridge.port.layers import CONTAINERS, Call, Unsupported, render_call, target_name
from trainkit.bridge.port.names import RESERVED, Namer
from trainkit.bridge.port.tables import (
    FUNCTION_HELPERS,
    FUNCTIONS,
    HELPER_IMPORTS,
    HELPER_NEEDS,
    HELPERS,
    METHODS,
    layer_call,
)
from trainkit.bridge.port.trace import (
    PadMask,
    Recording,
    branches_on_training,
    masked,
    pad_mask_of,
    record,
    tracer_for,
)
from trainkit.checks.generated_code import FORBIDDEN
from trainkit.errors import ConfigError

LINE = 116


@functools.lru_cache(maxsize=None)
def module_names() -> frozenset:
    """The names the generated module binds or uses itself (its imports, its helpers' classes and functions):
    never a generated class's, which would hide them (a model's own ``Embedding`` is written ``Embedding2``)."""
    defined = {node.name for text in HELPERS.values() for node in ast.parse(text).body
               if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    return frozenset(RESERVED | defined | set(HELPERS) | {"np", "Path", "LayerNorm2d", "BatchNormAct2d"})


def check_names(module: Any, path: str) -> None:
    """Refuse (:class:`~trainkit.bridge.port.code.UnsafeName`) a child, parameter or buffer name of `module` that the
    port cannot keep: one MindSpore does not take (ASCII letters, digits, ``_`` and ``-`` only; ``block1-0`` is
    written with ``setattr``), a dunder, or a name the generated code's check refuses (``exec``, ``open``)."""
    for kind, named in (("child", module.named_children()), ("parameter", module.named_parameters(recurse=False)),
                        ("buffer", module.named_buffers(recurse=False))):
        for name, _ in named:
            if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9_\-]+", name)) \
                    or name.startswith("__") and name.endswith("__") or name in FORBIDDEN:
                raise port_code.UnsafeName(
                    f"{port_code.printable(path) or 'the model'} has a {kind} named "
                    f"{port_code.literal(str.__str__(name))}, which port cannot keep: MindSpore takes ASCII letters, "
                    "digits, _ and - only, and Python's own names (exec, open, __x__) are refused; rename it "
                    "(nothing was written)")


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
    arguments: Dict[str, Any] = field(default_factory=dict)  # the top class's: PyTorch's name -> default
    driven: Dict[Tuple[Any, ...], Any] = field(default_factory=dict)  # slot path -> code from the arguments, or Run
    ties: List[str] = field(default_factory=list)  # the top's lines sharing a tied Parameter (port_ties)


@dataclass
class Port:
    """The generated source, the top Cell's name and what could not be ported (nothing written when any)."""

    source: str
    top: str
    problems: List[Problem]
    classes: List[str] = field(default_factory=list)
    arguments: Dict[str, Any] = field(default_factory=dict)  # the top class's constructor arguments
    specialised: List[str] = field(default_factory=list)  # modules whose code holds for the batch's shape only
    training_paths: List[str] = field(default_factory=list)  # classes whose forward branches on self.training
    buffers: port_buffers.Buffers = field(default_factory=port_buffers.Buffers)  # their values, for buffers.npz
    mask: Optional[PadMask] = None  # the attention mask the ported model computes from its ids (port_trace)


class _Generator:
    def __init__(self):
        self.variants: Dict[Tuple, Variant] = {}
        self.order: List[Variant] = []
        self.names: Dict[str, int] = {}  # the generated classes' names
        self.helpers: List[str] = []
        self.problems: List[Problem] = []
        self.imports: set = set()
        self.stack: List[str] = []  # the modules being ported, outermost first
        self.recording: Optional[Recording] = None  # the modules' inputs and outputs on the comparison's batch
        self.mask: Optional[PadMask] = None  # the top's attention mask, computed from its token ids
        self.specialised: List[str] = []  # the modules whose construct holds for the batch's shape only
        self.training_paths: List[str] = []  # classes whose forward branches on self.training (eval's path written)
        self.functional_layers: Dict[str, Call] = {}  # the layers written for the traced module's functional calls
        self.buffers = port_buffers.Buffers()  # the non-persistent buffers' values (port_buffers)

    # ---------------------------------------------------------------- the tree
    def spec(self, module: Any, path: str) -> Any:
        """The Call building `module` (a layer, a container, or an instance of a generated class)."""
        self.stack.append(f"{path or 'the model'} ({type(module).__qualname__})")
        call = self._spec(module, path)
        self.stack.pop()  # left on the stack when an error stops the port: the module it stopped at
        return call

    def _spec(self, module: Any, path: str) -> Any:
        check_names(module, path)
        kind = type(module)
        container = port_code.container(module)
        if container:
            items = [self.spec(child, f"{path}.{name}" if path else name) for name, child in module.named_children()]
            names = [name for name, _ in module.named_children()]
            if names == [str(index) for index in range(len(names))]:
                return Call(CONTAINERS[container], args=[items])
            self.imports.add("OrderedDict")  # torchvision's nn.Sequential(OrderedDict(encoder_layer_0=...))
            return Call(CONTAINERS[container], args=[Call("OrderedDict", args=[
                [Call("", args=[name, item]) for name, item in zip(names, items)]])])
        if not kind.__module__.startswith("torch") and port_transformers.same_as_layer_norm(module):
            kind = None  # timm's LayerNorm: nn.LayerNorm's computation, written as it
        library = kind is None or kind.__module__.startswith("torch.nn") or kind.__module__.startswith("torch.")
        if library or f"{kind.__module__}.{kind.__qualname__}" in CLASSES:
            try:
                if kind is None:
                    call = port_layers._layer_norm(module)
                elif library:
                    call = layer_call(module)
                else:  # a torchvision or timm layer (port_classes)
                    call = class_call(module, lambda name: self.spec(getattr(module, name),
                                                                    f"{path}.{name}" if path else name))
            except Unsupported as error:
                self.problems.append(Problem(str(error), path or "(the model)"))
                return Call("None")
            for helper in self._helpers_of(call):
                self.need(helper)
            return call
        return self.traced(module, path)

    def need(self, helper: str) -> None:
        """Write `helper` into the module, after the helpers it uses."""
        for first in HELPER_NEEDS.get(helper, ()):
            self.need(first)
        if helper not in self.helpers:
            self.helpers.append(helper)

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
        self.functional_layers = {}
        construct = self.construct(module, path)
        children.update(self.functional_layers)  # F.dropout's: a layer of the class, so its stream is saved
        children.update(self.own_tensors(module, path))
        key = (type(module), tuple(construct),
               tuple((name, port_code.signature(value)) for name, value in children.items()))
        variant = self.variants.get(key)
        if variant is None:
            base = type(module).__name__
            if not port_code.safe_identifier(base):
                raise port_code.UnsafeName(
                    f"{port_code.printable(path) or 'the model'} is a {port_code.literal(base)}: that class name is "
                    "not an ASCII Python identifier, so it cannot name the generated class; rename the class "
                    "(nothing was written)")
            base = str.__str__(base)
            name, count = base, 1
            while name in self.names or name in module_names() or name.endswith("__"):  # its imports, helpers
                count += 1
                name = f"{base}{count}"
            self.names[name] = count
            variant = Variant(name, f"{type(module).__module__}.{type(module).__qualname__}", construct, children)
            self.variants[key] = variant
            self.order.append(variant)
        variant.instances.append(children)
        return Call(variant.name, {"__instance__": (variant, len(variant.instances) - 1)})

    def own_tensors(self, module: Any, path: str) -> Dict[str, Call]:
        """A module's own parameters (class tokens, position embeddings) and saved buffers (relative position
        indices) as MindSpore Parameters of the same names and shapes, their values come with the weights; its
        non-persistent buffers as constants read from buffers.npz (:mod:`trainkit.bridge.port.buffers`)."""
        tensors: Dict[str, Call] = {}
        unsaved = dict(port_buffers.non_persistent(module))
        for name, value in module.named_parameters(recurse=False):
            tensors[name] = Call("Parameter", {"name": name}, [Call("initializer", args=[
                "zeros", tuple(value.shape), port_code.Code(port_code.dtype(value.dtype))])])
        for name, value in module.named_buffers(recurse=False):
            if name in unsaved:
                tensors[name] = self.buffers.call(f"{path}.{name}" if path else name, value)
                self.need(port_buffers.HELPER)
                continue
            tensors[name] = Call("Parameter", {"name": name, "requires_grad": False}, [Call("initializer", args=[
                "zeros", tuple(value.shape), port_code.Code(port_code.dtype(value.dtype))])])
        if tensors:
            self.imports.update({"initializer", "ms", "Parameter"})
        return tensors

    def functional_layer(self, module: Any, node: Any) -> Optional[str]:
        """The attribute of a layer written for a functional call that draws random numbers (``F.dropout`` with a
        literal ``p``): trainkit's Dropout, whose call counter a checkpoint holds, so a ported model resumes bitwise
        (``ops.dropout`` keeps its stream in a kernel). None for any other node."""
        if node.op != "call_function" or target_name(node.target) != "torch.nn.functional.dropout":
            return None
        p = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
        if isinstance(p, bool) or not isinstance(p, (int, float)):
            return None  # a computed p: ops.dropout as before
        taken = {name for name, _ in module.named_children()} | set(self.functional_layers) \
            | {name for name, _ in module.named_parameters(recurse=False)} | set(vars(module))
        attribute, count = "dropout", 1
        while attribute in taken:
            count += 1
            attribute = f"dropout{count}"
        self.functional_layers[attribute] = Call("Dropout", {"p": float(p)}, helper="Dropout")
        self.need("Dropout")
        return attribute

    # ---------------------------------------------------------------- construct
    def construct(self, module: Any, path: str) -> List[str]:
        where = f"{type(module).__qualname__}.forward" + (f" (at {path})" if path else "")
        tracer = tracer_for(module, self.recording, top=not path, mask=None if path else self.mask)
        tracer.record_stack_traces = True  # each node's source line: the variables' names (port_names)
        try:
            graph = tracer.trace(module)
        except Exception as error:  # fx raises many kinds (TraceError, TypeError on data-dependent control flow)
            self.problems.append(Problem(f"{type(module).__qualname__}.forward cannot be traced by torch.fx: "
                                         f"{' '.join(str(error).split())[:200]}", path or "(the model)"))
            return []
        names: Dict[Any, str] = {}
        inputs: List[str] = []
        lines: List[str] = []
        namer = Namer(list(graph.nodes), tuple(HELPERS))

        def code(value: Any) -> str:
            return port_code.code(value, names)

        dead = port_code.dead(graph)
        for node in graph.nodes:
            if node in dead:
                continue
            if node.op == "get_attr":  # a parameter or buffer of the module's own, used where it is read
                names[node] = port_code.attribute(node.target)
                continue
            if node.op == "call_function" and target_name(node.target) == "builtins.getattr" \
                    and node.args[1] == "device":
                names[node] = "None"  # MindSpore places tensors itself: device= arguments are dropped
                continue
            name = namer.name(node)
            if node.op == "placeholder" and str(node.target).startswith("*"):  # *args, **kwargs: as forward's
                stars = str(node.target)[:len(str(node.target)) - len(str(node.target).lstrip("*"))]
                name = str(node.target).lstrip("*")
                names[node] = name
                inputs.append(f"{stars}{name}")
                continue
            names[node] = name
            if node.op == "placeholder":
                try:
                    default = f"={port_code.literal(node.args[0])}" if node.args else ""
                except Unsupported as error:
                    self.problems.append(Problem(f"a default of {name}: {error}", where))
                    continue
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
            layer = self.functional_layer(module, node)
            if layer is not None:
                source = node.args[0] if node.args else node.kwargs.get("input")
                lines.append(f"{name} = self.{layer}({code(source)})")
                continue
            try:
                if node.op == "call_module":
                    arguments = ", ".join([*args, *port_code.keywords(kwargs)])
                    expression = f"{port_code.attribute(node.target)}({arguments})"
                elif node.op == "call_function":
                    what = target_name(node.target)
                    if what not in FUNCTIONS:
                        raise Unsupported(what)
                    expression = render_call(FUNCTIONS[what], args, kwargs, what)
                    if what in FUNCTION_HELPERS:
                        self.need(FUNCTION_HELPERS[what])
                elif node.op == "call_method":
                    if node.target not in METHODS:
                        raise Unsupported(f"Tensor.{node.target}")
                    expression = render_call(METHODS[node.target], args, kwargs, f"Tensor.{node.target}")
                else:
                    raise Unsupported(f"fx operation {node.op}")
            except Unsupported as error:
                self.problems.append(Problem(str(error), where))
                continue
            lines.append(f"{name} = {expression}")
        if tracer.keywords:  # forward's **kwargs, taken as passed: what a parent hands on is accepted, unused
            inputs.append(f"**{tracer.keywords}")
        note = [f"forward with {', '.join(dict.fromkeys(tracer.arguments))}, as it is called here (its other "
                "branches are not written)"] if tracer.arguments else []
        if tracer.decisions:  # forward branched on sizes or arguments: the branches taken for these inputs
            args, kwargs = self.recording.inputs[id(module)]
            shapes = ", ".join("x".join(map(str, value.shape)) for value in (*args, *kwargs.values())
                               if hasattr(value, "shape"))
            note += [f"Traced for inputs of shape {shapes}: forward's branches ({'; '.join(tracer.decisions)}) "
                     "were taken for them", "and are not in this code, which holds for inputs of that shape."]
            self.specialised.append(f"{type(module).__qualname__} (at {path or 'the model'})")
        if branches_on_training(type(module)):
            note += ["forward branches on self.training: this is its eval-mode path (the trace runs in eval mode);",
                     "what PyTorch's forward does only in training mode is not in this code."]
            if type(module).__qualname__ not in self.training_paths:
                self.training_paths.append(type(module).__qualname__)
        return [*map(port_code.comment, note), f"def construct(self, {', '.join(inputs)}):",
                *(f"    {line}" for line in lines)]

    # ---------------------------------------------------------------- classes
    def finish(self) -> None:
        """Each variant's parameters: the constructor slots whose values differ between its instances."""
        for variant in self.order:
            slots: Dict[Tuple, List[Any]] = {}
            for children in variant.instances:
                for path, value in port_code.slots(children, ()):
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
                    groups[key] = port_code.parameter_name(path, taken)
                    taken.add(groups[key])
                variant.parameters.append((path, groups[key]))

    def instance_call(self, call: Call) -> Call:
        variant, index = call.kwargs["__instance__"]
        values = dict(port_code.slots(variant.instances[index], ()))
        # with the arguments it takes from its parent (a depth handed down, port_nested), their defaults here
        return Call(variant.name, {**{name: values[path] for path, name in variant.parameters}, **variant.arguments})

    def arguments(self, variant: Variant) -> List[str]:
        return list(dict.fromkeys(name for _, name in variant.parameters))

    def render_value(self, value: Any, path: Tuple, parameters: Dict[Tuple, Any], indent: int) -> str:
        if path in parameters:  # an argument's code, or a run of blocks built `depth` times (port_depth.Run)
            found = parameters[path]
            return found if isinstance(found, str) else found.render(
                value, path, lambda item, at, pad: self.render_value(item, at, parameters, pad), indent)
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
        if isinstance(value, port_code.Code):
            return str(value)
        try:
            return port_code.literal(value)
        except Unsupported as error:  # a value of a type no literal writes: refused, as a name would be
            raise port_code.UnsafeName(f"the constructor value at {'.'.join(map(str, path))} is {error}, which port "
                                       "cannot write as a literal (nothing was written)") from None

    def class_source(self, variant: Variant) -> str:
        parameters = {**{path: name for path, name in variant.parameters}, **variant.driven}
        names = [*self.arguments(variant),
                 *(f"{name}={port_code.literal(value)}" for name, value in variant.arguments.items())]
        signature = ", ".join(["self", *names])
        if len(signature) > LINE - 20:
            signature = ",\n                 ".join(port_code.wrap(["self", *names], LINE - 20))
        first = next((other for other in self.order if other.torch_class == variant.torch_class), variant)
        differs = "" if first is variant else " (instances whose forward traces differently from the other variants)"
        lines = [f"class {variant.name}(nn.Cell):",  # PyTorch's names, in a docstring only as a string literal
                 port_code.docstring(f"PyTorch's {variant.torch_class}{differs}.", indent=4), "",
                 f"    def __init__({signature}):", "        super().__init__()"]
        for attribute, call in variant.children.items():
            value = self.render_value(call, (attribute,), parameters, 8)
            lines.append(f"        self.{str.__str__(attribute)} = {value}" if port_code.safe_identifier(attribute)
                         else f"        setattr(self, {port_code.literal(attribute)}, {value})")  # PyTorch's name
        lines += [f"        {line}" for line in variant.ties]
        lines.append("")
        lines += [f"    {line}" for line in variant.construct] or ["    def construct(self, x):", "        return x"]
        return "\n".join(lines)


def _generated(model: Any, batch: Any = None) -> Tuple[_Generator, Any]:
    generator = _Generator()
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", False) is True:  # a transformers model's key/value cache: for generation only,
        config.use_cache = False  # and it changes no output the port compares (past_key_values is no tensor)
    if batch is not None:
        try:
            if not batch.is_floating_point():  # token ids: the mask a transformers model takes from them
                generator.mask = pad_mask_of(model)
            with masked(model, generator.mask):
                generator.recording = record(model, batch)
        except Exception:  # noqa: BLE001 - a model rebuilt with other arguments (in_channels=1) refuses the batch:
            generator.recording = None  # traced without values, as long as its forward takes no branch on a size
    try:
        top = generator.spec(model, "")
    except port_code.UnsafeName:
        raise
    except Exception as error:  # a bug of port's on a module it should cover: one line naming that module
        where = generator.stack[-1] if generator.stack else "the model"
        raise PortFailure(f"port failed at {where}: {type(error).__name__}: {_first_line(error)} (a port bug, "
                          "please report it); nothing was written") from error
    if not generator.problems and isinstance(top, Call) and "__instance__" in top.kwargs:
        generator.finish()
    return generator, top


def _take_arguments(generator: _Generator, top: Variant, values: Dict[str, Any],
                    rebuild: Callable[[Dict[str, Any]], Any], batch: Any = None) -> None:
    """The top class's constructor arguments (:func:`trainkit.bridge.port.arguments.take`)."""

    def again(changes: Dict[str, Any]) -> Optional[Tuple[Variant, List[str], List[Variant]]]:
        generated, again_top = _generated(rebuild(changes).eval(), batch)
        if generated.problems or "__instance__" not in getattr(again_top, "kwargs", {}) \
                or not generator.buffers.same(generated.buffers):
            return None  # (a buffer's values moved with it: buffers.npz holds one set, so a literal)
        variant = again_top.kwargs["__instance__"][0]
        others = [other for other in generated.order if other is not variant]
        return variant, [generated.class_source(other) for other in others], others

    below = [variant for variant in generator.order if variant is not top]
    port_arguments.take(top, [generator.class_source(variant) for variant in below], values, again, below)


def generate(model: Any, origin: str, rebuild: Optional[Callable[[Dict[str, Any]], Any]] = None,
             values: Optional[Dict[str, Any]] = None, batch: Any = None) -> Port:
    """The MindSpore source mirroring `model` (a torch module in eval mode); `origin` is ``MODULE:CLASS``;
    `rebuild` builds the model again with some of its constructor's `values` changed (the top class's
    arguments); `batch` (a torch tensor), the comparison's: the branches of a forward on sizes are taken as for it.

    Raises:
        PortFailure: a bug of port's, in one line naming the module it stopped at.
    """
    generator, top = _generated(model, batch)
    if generator.problems or not isinstance(top, Call) or "__instance__" not in top.kwargs:
        if not generator.problems:
            generator.problems.append(Problem(f"the model is a single torch.nn layer ({type(model).__name__}): "
                                              "port a module of your own that holds it", "(the model)"))
        return Port("", "", generator.problems)
    top_variant = top.kwargs["__instance__"][0]
    try:
        top_variant.ties = port_ties.tie_lines(model)
    except Unsupported as error:
        return Port("", "", [Problem(str(error), "(the model)")])
    if rebuild is not None and values:
        _take_arguments(generator, top_variant, values, rebuild, batch)
    imports = {name for helper in generator.helpers for name in HELPER_IMPORTS.get(helper, ())} | generator.imports
    if any("ms." in line for variant in generator.order for line in variant.construct):
        imports.add("ms")
    header = [port_code.docstring(
        f"A MindSpore port of PyTorch's {origin}, written by python -m trainkit.port from its torch.fx trace.\n\n"
        "Parameter names are the PyTorch state_dict's (batch norm's and layer norm's weight/bias/running_mean/"
        "running_var are\ngamma/beta/moving_mean/moving_variance here). This file is yours to edit.\n")]
    if "math" in imports:
        header.append("import math")
    if "OrderedDict" in imports:
        header.append("from collections import OrderedDict")
    if "Path" in imports:
        header.append("from pathlib import Path")
    if imports & {"math", "OrderedDict", "Path"}:
        header.append("")
    if "ms" in imports:
        header.append("import mindspore as ms")
    if "numpy" in imports:
        header.append("import numpy as np")
    header.append("from mindspore import Parameter, nn, ops" if imports - {"ms", "dropout", "numpy", "Path"}
                  else "from mindspore import nn, ops")
    if "initializer" in imports:
        header.append("from mindspore.common.initializer import Normal, Uniform, initializer")
    own = [*(["from trainkit.models.dropout import Dropout"] if "dropout" in imports else []),
           *(line for helper in generator.helpers for line in IMPORTS.get(helper, ()))]
    if own:
        header += ["", *dict.fromkeys(own)]
    blocks = ["\n".join(header)]
    blocks += [HELPERS[helper].strip("\n") for helper in generator.helpers if helper in HELPERS]
    blocks += [generator.class_source(variant) for variant in generator.order]
    source = "\n\n\n".join(blocks) + "\n"
    _check_compiles(source, generator.order)
    return Port(source, top_variant.name, [],
                [*(helper for helper in generator.helpers if helper in HELPERS),
                 *(variant.name for variant in generator.order)], dict(top_variant.arguments), generator.specialised,
                generator.training_paths, generator.buffers, generator.mask)


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
    return [port_code.printable(f"unsupported: {what}: used at {', '.join(where[:6])}")  # one line, whatever names
            + (f" and {len(where) - 6} more places" if len(where) > 6 else "") for what, where in places.items()]
