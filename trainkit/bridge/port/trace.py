"""Tracing one module's ``forward`` with ``torch.fx``, its children as leaves, beside the values it computes.

``torch.fx`` alone stops where ``forward`` branches on a value (``if pre_logits:``, ``if x.shape[-1] % 2:``).
Each module is therefore run once on the comparison's batch first (:func:`record`), and the tracer computes
every traced operation on its inputs as it records it (a child's call stands for its recorded output). Where
``forward`` branches on a value that is not a tensor's data (a size, a rank, a flag argument), the branch taken
for those inputs is followed, and the trace remembers it (``decisions``; ``arguments`` for a flag argument): the
generated ``construct`` then holds for inputs of that shape (for that argument), which the generated file and
``port`` say. A branch on a tensor's data still stops the trace, as it must.

The same values carry Hugging Face ``transformers`` models through fx (transformers 5 has no fx tracer of its own):
``len()`` of a shape and a ``ModelOutput``'s fields are answered from them (:func:`_proxy_classes`), a forward under
decorators is traced as written, a ``**kwargs`` of flags and number arguments are taken as passed, a module built
inside ``forward`` is inlined, and the top's ``attention_mask`` can be computed from its ids (:class:`PadMask`).
"""
from __future__ import annotations

import ast
import contextlib
import inspect
import textwrap
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

_UNKNOWN = object()


@dataclass
class Recording:
    """What each module of a model received and returned, running once on the comparison's batch."""

    inputs: Dict[int, Tuple[tuple, dict]] = field(default_factory=dict)  # id(module) -> its first call's
    outputs: Dict[int, List[Any]] = field(default_factory=dict)  # id(module) -> every call's output, in order


@dataclass(frozen=True)
class PadMask:
    """A model's ``attention_mask`` argument computed from its token ids: 1 where the id is not the pad id.

    A transformers model fine-tuned on padded text is called with such a mask; trainkit hands a model its ids
    alone, so the ported model computes the mask itself, and PyTorch's is called with the same mask to compare."""

    argument: str  # the mask's argument (attention_mask)
    source: str  # the ids' argument (input_ids)
    pad_id: int

    def describe(self) -> str:
        return f"{self.argument}=({self.source} != {self.pad_id})"


def pad_mask_of(model: Any) -> Optional[PadMask]:
    """The mask `model` takes from its ids: its forward has an ``attention_mask`` argument after the ids and its
    config names a pad id (``pad_token_id``), else None (the model is called with its ids alone)."""
    try:
        names = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return None
    pad = getattr(getattr(model, "config", None), "pad_token_id", None)
    if len(names) < 2 or "attention_mask" not in names[1:] or isinstance(pad, bool) or not isinstance(pad, int):
        return None
    return PadMask("attention_mask", names[0], pad)


def with_padding(batch: Any, mask: Optional[PadMask]) -> Any:
    """`batch` (token ids, an integer array ``[batch, length]``) with its last sample's second half the pad id.

    transformers skips an attention mask of ones (its SDPA path passes none to the layers), so a model traced on
    ids without padding is traced without its mask: the ported model would attend to the padding a tokenizer
    adds. Padded here, the trace takes the masked path, and the comparison checks it."""
    if mask is None or batch.ndim < 2 or batch.shape[-1] < 2:
        return batch
    batch = batch.copy()
    batch[-1, batch.shape[-1] // 2:] = mask.pad_id
    return batch


@contextlib.contextmanager
def masked(model: Any, mask: Optional[PadMask]) -> Iterator[None]:
    """`model` called with ids alone gets `mask`'s argument from them, while in the block (a forward pre-hook)."""
    if mask is None:
        yield
        return

    def add_mask(_module, args, kwargs):
        if args and mask.argument not in kwargs:
            kwargs = {**kwargs, mask.argument: (args[0] != mask.pad_id).long()}
        return args, kwargs

    handle = model.register_forward_pre_hook(add_mask, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def record(model: Any, batch: Any) -> Recording:
    """Run `model` on `batch` (no gradients) and record every module's inputs and outputs."""
    import torch

    recording = Recording()

    def before(module, args, kwargs):
        recording.inputs.setdefault(id(module), (args, kwargs))

    def after(module, args, kwargs, output):
        recording.outputs.setdefault(id(module), []).append(output)

    handles = [handle for module in model.modules() for handle in (
        module.register_forward_pre_hook(before, with_kwargs=True),
        module.register_forward_hook(after, with_kwargs=True))]
    try:
        with torch.no_grad():
            model(batch)
    finally:
        for handle in handles:
            handle.remove()
    return recording


def _attribute(root: Any, target: str) -> Any:
    """`root`'s attribute at the dotted `target`, read without ``nn.Module.__getattr__``: while tracing, fx
    patches it to return a proxy for a parameter, whose creation would compute its value again, for ever (a
    module's own ``nn.Parameter`` used in ``forward``: a ViT's class token)."""
    value = root
    for part in target.split("."):
        stores = [vars(value).get(store, {}) for store in ("_parameters", "_buffers", "_modules")] + [vars(value)]
        value = next((store[part] for store in stores if part in store), _UNKNOWN)
        if value is _UNKNOWN:
            raise LookupError(target)
    return value


def tracer_for(module: Any, recording: Optional[Recording], top: bool = False, mask: Optional[PadMask] = None) -> Any:
    """A tracer for `module`'s forward, computing alongside on its recorded inputs (its children's recorded
    outputs standing for their calls) when it ran on the batch. `top`: the model itself, whose transformers
    ModelOutput of one field set (``logits``, no ``loss`` without labels) is returned as that tensor, what a
    training loop takes."""
    import operator

    import torch
    import torch.fx

    example = recording.inputs.get(id(module)) if recording is not None else None
    calls: Dict[str, int] = {}  # child -> its calls traced so far

    class ValueTracer(torch.fx.Tracer):
        """Traces one module's own forward (every submodule call stays one call), following branches on sizes."""

        def __init__(self):
            super().__init__()
            # a buffer read in forward (`self.index.view(-1)`) stays the buffer, not a tensor constant fx folds
            # (`_tensor_constant0`, which port cannot carry: MaxViT's relative position index)
            self.proxy_buffer_attributes = True
            self.values: Dict[Any, Any] = {}
            self.decisions: List[str] = []  # branches taken on values computed from the inputs (their shapes)
            self.arguments: List[str] = []  # branches taken on an argument's value, as the parent passes it
            self.bound: Dict[str, Any] = {}
            self.keywords: Optional[str] = None  # the name of a **kwargs argument taken as passed (a dict of flags)

        def is_leaf_module(self, module, qualified_name):  # noqa: D102 - fx's hook
            return True

        def proxy(self, node):  # noqa: D102 - fx's hook: every proxy it makes
            return _proxy_classes()[0](node, self)

        def trace(self, root, concrete_args=None):  # noqa: D102 - fx's
            # a forward under decorators (transformers' can_return_tuple, merge_with_config_defaults): its own code,
            # which fx's placeholders follow (fx calls the outer one with the inner one's arguments: `co_varnames
            # is too small`); the decorators read a config and pick outputs, which the parent's trace sees anyway
            kind = type(root)
            forward = kind.forward
            inner = inspect.unwrap(forward)
            if inner is not forward:
                own = kind.__dict__.get("forward", _UNKNOWN)
                kind.forward = inner
                try:
                    return self.trace(root, concrete_args)
                finally:
                    if own is _UNKNOWN:
                        del kind.forward
                    else:
                        kind.forward = own
            if example is not None:
                signature = inspect.signature(root.forward)
                arguments = signature.bind(*example[0], **example[1])
                arguments.apply_defaults()
                self.bound = dict(arguments.arguments)
                # an argument it is called without (DLA's shortcut=None): `is None` cannot be traced, so fixed;
                # a number or a string too (transformers' `logits_to_keep=0`, read by `isinstance(.., int)`)
                nones = {name: value for name, value in self.bound.items()
                         if (value is None or type(value) in (bool, int, float, str))
                         and signature.parameters[name].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD}
                self.arguments += [f"{name}={value!r}" for name, value in nones.items()]
                concrete_args = {**nones, **(concrete_args or {})} or None
            with self._finfo_of_values():
                graph = super().trace(root, concrete_args)
            for node in graph.nodes:  # fx names a fixed argument's placeholder `name_1`; callers pass `name=`
                if node.op == "placeholder" and str(node.target)[:-2] in (concrete_args or {}) \
                        and str(node.target).endswith("_1"):
                    node.target = str(node.target)[:-2]
            _spell_out(graph, self.values)
            if mask is not None:
                self._mask_from_ids(graph)
            return graph

        @contextlib.contextmanager
        def _finfo_of_values(self):
            """``torch.finfo(x.dtype)`` of a traced tensor's dtype (transformers' eager attention masks: its
            ``.min``) answered from the value computed, as ``len()`` is, and remembered like a branch: the code
            holds the number for that dtype."""
            real = torch.finfo

            def finfo(type=None):  # noqa: A002 - torch.finfo's own argument name
                if isinstance(type, torch.fx.Proxy):
                    value = self.values.get(type.node, _UNKNOWN)
                    if not isinstance(value, torch.dtype):
                        raise TypeError(f"torch.finfo of {type.node.name}, whose dtype is not known when tracing")
                    self.decisions.append(f"torch.finfo({type.node.name}) is {value}'s")
                    return real(value)
                return real() if type is None else real(type)

            torch.finfo = finfo
            try:
                yield
            finally:
                torch.finfo = real

        def _mask_from_ids(self, graph):
            placeholders = {str(node.target): node for node in graph.nodes if node.op == "placeholder"}
            ids, given = placeholders.get(mask.source), placeholders.get(mask.argument)
            if ids is None or given is None:
                return
            with graph.inserting_after(list(placeholders.values())[-1]):
                kept = graph.call_function(operator.ne, (ids, mask.pad_id))
            with graph.inserting_after(kept):
                computed = graph.call_method("long", (kept,))
            line = f'File "<port>", line 1, in forward\n    {mask.argument} = ({mask.source} != {mask.pad_id}).long()'
            kept.meta["stack_trace"] = computed.meta["stack_trace"] = line  # named as that line (port_names)
            given.replace_all_uses_with(computed)
            graph.erase_node(given)
            self.arguments.append(f"{mask.describe()} (from the pad id)")

        def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None,  # noqa: D102 - fx's
                         proxy_factory_fn=None):
            proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
            if example is not None:
                self.values[proxy.node] = self._value(kind, target, args, kwargs, proxy.node)
            return proxy

        def call_module(self, m, forward, args, kwargs):  # noqa: D102 - fx's: a module called in forward
            if not any(m is child for child in self.root.modules()) and next(m.parameters(), None) is None \
                    and next(m.buffers(), None) is None:
                # one built in forward (DistilBERT's `nn.ReLU()(x)`): no child to call, its computation inline
                return forward(*args, **kwargs)
            return super().call_module(m, forward, args, kwargs)

        def _proxy_placeholder(self, name, concrete_args, sig, fn):  # noqa: D102 - fx's: one argument
            value = self.bound.get(name[2:], _UNKNOWN) if name.startswith("**") else _UNKNOWN
            if isinstance(value, dict) and not any(isinstance(item, torch.Tensor) for item in value.values()):
                # **kwargs of flags and Nones (transformers' `**kwargs: Unpack[TransformersKwargs]`): as passed
                self.keywords = name[2:]
                self.arguments += [f"{key}={item!r}" for key, item in value.items()]
                return _Flags(value)
            return super()._proxy_placeholder(name, concrete_args, sig, fn)

        def create_arg(self, a):  # noqa: D102 - fx's: a value in the graph; transformers' ModelOutput as its tuple
            if isinstance(a, dict) and callable(getattr(a, "to_tuple", None)):
                fields = tuple(a.to_tuple())
                return super().create_arg(fields[0] if top and len(fields) == 1 else fields)
            return super().create_arg(a)

        def keys(self, obj):  # noqa: D102 - fx's hook: `**proxy`
            value = self.values.get(obj.node, _UNKNOWN)
            if isinstance(value, dict):
                return list(value.keys())
            return super().keys(obj)

        def _value(self, kind, target, args, kwargs, node):
            if kind == "placeholder":
                return self.bound.get(str(target).lstrip("*"), _UNKNOWN)
            try:
                args, kwargs = torch.fx.node.map_aggregate((args, kwargs), self._concrete)
                with torch.no_grad():
                    if kind == "get_attr":
                        return _attribute(self.root, target)
                    if kind == "call_module":  # not run again inside the trace: its recorded output
                        outputs = recording.outputs.get(id(self.root.get_submodule(target)), [])
                        calls[target] = calls.get(target, 0) + 1
                        return outputs[calls[target] - 1] if len(outputs) >= calls[target] else _UNKNOWN
                    if kind == "call_function":
                        return target(*args, **kwargs)
                    if kind == "call_method":
                        return getattr(args[0], target)(*args[1:], **kwargs)
            except Exception:  # noqa: BLE001 - a value not computed: a branch on it stops the trace as before
                return _UNKNOWN
            return _UNKNOWN

        def _concrete(self, value):
            if isinstance(value, torch.fx.Proxy):
                value = value.node
            if isinstance(value, torch.fx.Node):
                found = self.values.get(value, _UNKNOWN)
                if found is _UNKNOWN:
                    raise LookupError(value.name)
                return found
            return value

        def to_bool(self, obj):  # noqa: D102 - fx's hook: `if` on a traced value
            value = self.values.get(obj.node, _UNKNOWN)
            if value is _UNKNOWN or isinstance(value, torch.Tensor):
                return super().to_bool(obj)
            if obj.node.op == "placeholder":  # a flag argument (timm's pre_logits=False)
                self.arguments.append(f"{obj.node.target}={value!r}")
            else:
                self.decisions.append(f"{obj.node.name} is {bool(value)}")
            return bool(value)

        def iter(self, obj):  # noqa: D102 - fx's hook: a loop over a traced value (a shape)
            value = self.values.get(obj.node, _UNKNOWN)
            if isinstance(value, dict) and callable(getattr(value, "to_tuple", None)):
                value = value.to_tuple()  # a transformers ModelOutput: its tuple
            if not isinstance(value, (tuple, list)):
                return super().iter(obj)
            self.decisions.append(f"{obj.node.name} has {len(value)} items")
            return iter([obj[index] for index in range(len(value))])

    return ValueTracer()


_SHAPED = ("view", "reshape", "expand", "repeat", "permute")  # methods taking a shape as one tuple or as its items


def _spell_out(graph: Any, values: Dict[Any, Any]) -> None:
    """What the written code cannot tell from names alone, made explicit in `graph` from the values computed:
    ``x.view(shape)`` with a computed tuple (GPT-2's ``output_shape``) as ``x.view(shape[0], shape[1], ...)``;
    ``cumsum`` of a bool or int tensor with PyTorch's result type, int64, said (MindSpore keeps bool, and
    refuses it)."""
    import operator

    import torch

    for node in list(graph.nodes):
        if node.op == "call_method" and node.target in _SHAPED and len(node.args) == 2 \
                and isinstance(node.args[1], torch.fx.Node) \
                and isinstance(values.get(node.args[1]), (tuple, list)):
            with graph.inserting_before(node):
                items = [graph.call_function(operator.getitem, (node.args[1], index))
                         for index in range(len(values[node.args[1]]))]
            node.args = (node.args[0], *items)
        if ((node.op == "call_method" and node.target == "cumsum")
                or (node.op == "call_function" and getattr(node.target, "__name__", "") == "cumsum")) \
                and "dtype" not in node.kwargs and node.args:
            source = values.get(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else None
            if isinstance(source, torch.Tensor) and not source.is_floating_point() and not source.is_complex():
                node.kwargs = {**node.kwargs, "dtype": torch.int64}


class _Flags(dict):
    """A ``**kwargs`` argument's value taken as passed: a dict that fx's pytree sees as one value (a plain dict
    would make fx flatten the trace's inputs and outputs into lists)."""


_PROXIES: List[Any] = []


def _proxy_classes() -> List[Any]:
    """fx's Proxy and Attribute, answering ``len()`` and a ModelOutput's fields from the values computed alongside
    (:func:`tracer_for`): ``len(x.shape)`` is a size, taken as for the batch and remembered like a branch."""
    if _PROXIES:
        return _PROXIES
    import torch.fx
    from torch.fx.proxy import Attribute

    class ValueProxy(torch.fx.Proxy):
        """A proxy whose value the tracer computed: its length and a ModelOutput's attributes are known."""

        def __len__(self):
            value = self.tracer.values.get(self.node, _UNKNOWN)
            if value is _UNKNOWN or not hasattr(value, "__len__"):
                return super().__len__()
            self.tracer.decisions.append(f"len({self.node.name}) is {len(value)}")
            return len(value)

        def __getattr__(self, name):
            if not name.startswith("__"):
                value = self.tracer.values.get(self.node, _UNKNOWN)
                if isinstance(value, dict) and callable(getattr(value, "to_tuple", None)):
                    # transformers' ModelOutput: a field is its place among the fields set (a tuple in MindSpore)
                    if name in value:
                        return self[list(value.keys()).index(name)]
                    if name in getattr(value, "__dataclass_fields__", {}):
                        return None
            return ValueAttribute(self, name)

    class ValueAttribute(Attribute, ValueProxy):
        """``proxy.name``, made into a node when used (fx's Attribute), whose length is known too."""

    _PROXIES.extend([ValueProxy, ValueAttribute])
    return _PROXIES


def branches_on_training(kind: type) -> bool:
    """Whether `kind`'s own ``forward`` tests ``self.training`` in an ``if`` (or a conditional expression):
    torch.fx follows eval mode's side, so the other side is not ported. ``training=self.training`` handed to a
    function (F.dropout) is not a branch."""
    forward = kind.__dict__.get("forward")
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(forward)))
    except (OSError, TypeError, SyntaxError):  # no source (a builtin, a lambda, a class from a notebook)
        return False
    tests = [node.test for node in ast.walk(tree) if isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert))]
    return any(isinstance(inner, ast.Attribute) and inner.attr == "training" and isinstance(inner.value, ast.Name)
               and inner.value.id == "self" for test in tests for inner in ast.walk(test))
