"""Check every ``_target_`` node's keys against its target's signature, before anything is built.

The ``_target_`` groups (``model``, ``data``, ``loss``, ``metrics.<name>``, ``optimizer``, ``lr_schedule``,
``wrapper``, ``callbacks[i]``) are open in the config schema, so a user's class can take its own arguments from a
recipe, an option file or the command line. The price of open groups is that Hydra no longer catches typos
there; this module does, as torchtune validates its components: an unknown key stops with the key, the target
and the closest valid names. Where the target is trainkit's own, the values' types are checked against its
annotations too.

Signatures are read from the target itself; a class whose ``__init__`` passes ``**kwargs`` on (a subclass
calling ``super().__init__(*args, **kwargs)``) accepts its base classes' arguments as well. A function or class
that takes ``**kwargs`` all the way down accepts any key.
"""
from __future__ import annotations

import inspect
import typing
from typing import Any, Dict, Iterator, List, Tuple

from hydra.utils import get_object
from omegaconf import DictConfig, ListConfig

from trainkit.app.finetune import NOT_ARGUMENTS
from trainkit.checks import did_you_mean
from trainkit.errors import ConfigError

TARGET_GROUPS = ("model", "data", "loss", "optimizer", "lr_schedule", "wrapper")
# Arguments trainkit passes itself when it builds the group: a config key of that name would clash.
SUPPLIED = {
    "optimizer": ("params", "learning_rate"),  # the backbone's parameters; optimizer.lr through lr_schedule
    "wrapper": ("network", "optimizer", "loss_scale"),  # loss_scale is built from wrapper.loss_scale* keys
    "lr_schedule": ("lr", "epochs", "updates_per_epoch"),
}
#: Model keys that choose how layers run, not what they compute: trainkit.app.build swaps every nn.Conv2d
#: (conv_impl) and every GELU, max pool and norm (layer_impl) of any network, passes each to a model that takes it,
#: and takes it out before one that does not.
IMPLEMENTATION_KEYS = ("conv_impl", "layer_impl")
# trainkit's keys in those groups that are not the target's arguments.
CONSUMED = {
    # model.pretrained, model.freeze, ...: trainkit.app.finetune applies them after building; model.tied_weights:
    # export --to torch reads it; the implementation keys: trainkit.app.build
    "model": NOT_ARGUMENTS + IMPLEMENTATION_KEYS,
    "optimizer": ("lr",),
    "wrapper": ("loss_scale", "loss_scale_value", "scale_factor", "scale_window"),
}
# MindSpore classes that take documented keywords through **kwargs.
EXTRA_KEYWORDS = {"mindspore.nn.optim.adam.Adam": ("use_lazy", "use_offload")}


def check_target_arguments(cfg: DictConfig) -> None:
    """Raise ConfigError for the first ``_target_`` node with an unknown or clashing key or a mistyped value."""
    for path, node in target_nodes(cfg):
        check_node(path, node)


def target_nodes(cfg: DictConfig) -> Iterator[Tuple[str, Any]]:
    """``(key path, node)`` of every ``_target_`` node of the run."""
    for group in TARGET_GROUPS:
        yield group, cfg.get(group)
    metrics = cfg.get("metrics")
    if metrics is not None:
        if not isinstance(metrics, DictConfig):
            raise ConfigError(f"metrics={metrics} is not valid: it must map names to _target_ nodes, e.g. "
                              "metrics: {mae: {_target_: mindspore.train.MAE}} (or {} for the loss alone)")
        for name, node in metrics.items():
            if name == "loss":
                raise ConfigError("metrics.loss is not valid: the loss is always reported as loss; give the metric "
                                  "another name")
            yield f"metrics.{name}", node
    callbacks = cfg.get("callbacks")
    if callbacks is not None:
        if not isinstance(callbacks, ListConfig):
            raise ConfigError(f"callbacks={callbacks} is not valid: it must be a list of _target_ nodes, e.g. "
                              "callbacks: [{_target_: my_project.hooks.MyCallback}]")
        for index, node in enumerate(callbacks):
            yield f"callbacks[{index}]", node


def check_node(path: str, node: Any) -> None:
    """Check one node's keys (and, for trainkit's own targets, value types) against its target."""
    if not isinstance(node, DictConfig) or not isinstance(node.get("_target_"), str):
        raise ConfigError(f"{path} needs a _target_: the import path of the class or function it builds "
                          f"(got {node!r})")
    name = node._target_
    target = locate(f"{path}._target_", name)
    accepted, any_key = accepted_arguments(target)
    group = path.split(".")[0].split("[")[0]
    for key in node:
        key = str(key)
        if key.startswith("_") or key in CONSUMED.get(group, ()):
            continue  # Hydra's _target_, _partial_, ...; keys trainkit reads itself
        if key in SUPPLIED.get(group, ()):
            raise ConfigError(f"{path}.{key} cannot be set: trainkit passes {key} to {name} itself "
                              f"({_supplied_hint(group)})")
        if not any_key and key not in accepted:
            raise ConfigError(f"unknown key {path}.{key}: {name} takes no argument {key!r}; "
                              f"{did_you_mean(key, [*accepted, *CONSUMED.get(group, ())], path + '.')}it takes "
                              f"{_listing(accepted, group)}")
    if name.startswith("trainkit."):
        _check_types(path, node, target)


def floats_where_expected(node: Dict[str, Any]) -> Dict[str, Any]:
    """`node` with integer values made floats where the target's default for that argument is a float.

    ``optimizer.eps=1`` parses as an int on the command line, and MindSpore's optimizers check types strictly.
    """
    defaults = _defaults(get_object(node["_target_"]))
    return {key: float(value) if isinstance(defaults.get(key), float) and type(value) is int else value
            for key, value in node.items()}


def required_arguments(target: Any) -> List[str]:
    """The arguments of `target` without a default value."""
    accepted, _ = accepted_arguments(target)
    defaults = _defaults(target)
    return [name for name in accepted if name not in defaults]


def _defaults(target: Any) -> Dict[str, Any]:
    functions = [cls.__dict__["__init__"] for cls in reversed(target.__mro__) if "__init__" in cls.__dict__] \
        if inspect.isclass(target) else [target]
    defaults: Dict[str, Any] = {}
    for function in functions:
        try:
            parameters = _signature(function).parameters.values()
        except (TypeError, ValueError):  # a C++ base class's __init__ (MindSpore's Cell_) has none to read
            continue
        defaults.update({p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty})
    return defaults


def locate(key: str, name: str) -> Any:
    """The object `name` imports to, or ConfigError naming `key`."""
    try:
        return get_object(name)
    except Exception as error:  # ImportError, AttributeError, ValueError, whatever a module raises on import
        message = " ".join(str(error).split())
        raise ConfigError(f"{key}={name} cannot be imported: {message}") from error


def accepted_arguments(target: Any) -> Tuple[List[str], bool]:
    """The keyword arguments `target` accepts, and whether it accepts any keyword (``**kwargs`` to the end)."""
    if not inspect.isclass(target):
        return _keywords(_signature(target))
    names: List[str] = []
    passes_kwargs_on = False
    for cls in target.__mro__:
        if cls is object:
            break
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        try:
            keywords, var_keyword = _keywords(_signature(init), skip_first=True)
        except (TypeError, ValueError):  # an __init__ without a readable signature (C++): nothing to check against
            return names, True
        names += [k for k in keywords if k not in names]
        if cls.__module__.startswith("mindspore"):  # MindSpore's **kwargs take only documented extras
            names += list(EXTRA_KEYWORDS.get(f"{cls.__module__}.{cls.__qualname__}", ()))
            return names, False
        if not var_keyword:
            return names, False
        passes_kwargs_on = True
    return names, passes_kwargs_on  # **kwargs all the way down: nothing to check the keys against


def _signature(function: Any) -> inspect.Signature:
    """The signature of `function`, seeing through decorators (``functools.wraps`` and closures such as
    MindSpore's ``opt_init_args_register`` that show ``(*args, **kwargs)``)."""
    function = inspect.unwrap(function)
    signature = inspect.signature(function)
    kinds = [p.kind for p in signature.parameters.values() if p.name != "self"]
    if kinds == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]:
        for cell in getattr(function, "__closure__", None) or ():
            inner = cell.cell_contents
            if inspect.isfunction(inner) and inner.__name__ == "__init__":
                return inspect.signature(inner)
    return signature


def _keywords(signature: inspect.Signature, skip_first: bool = False) -> Tuple[List[str], bool]:
    parameters = list(signature.parameters.values())[1 if skip_first else 0:]
    keywords = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return keywords, any(p.kind == p.VAR_KEYWORD for p in parameters)


def _listing(accepted: List[str], group: str) -> str:
    shown = [k for k in accepted if k not in SUPPLIED.get(group, ()) and k != "self"]
    return ", ".join(shown) if shown else "no arguments"


def _supplied_hint(group: str) -> str:
    return {"optimizer": "set the base rate with optimizer.lr and its shape with lr_schedule",
            "wrapper": "set wrapper.loss_scale (none, static, dynamic) and wrapper.loss_scale_value",
            "lr_schedule": "set optimizer.lr and trainer.epochs"}.get(group, "")


# ------------------------------------------------------------------- types of trainkit's own targets
def _check_types(path: str, node: DictConfig, target: Any) -> None:
    function = target.__init__ if inspect.isclass(target) else target
    try:
        hints = typing.get_type_hints(inspect.unwrap(function))
    except Exception:  # an annotation that does not resolve on this Python: nothing to check against
        return
    for key in node:
        key = str(key)
        value = node[key]
        if key.startswith("_") or value is None or key not in hints:
            continue
        expected = _simple_type(hints[key])
        if expected is not None and not _is_instance(value, expected):
            raise ConfigError(f"{path}.{key}={value!r} is not valid: {node._target_} takes "
                              f"{_type_name(expected)} for {key}")


def _simple_type(hint: Any) -> Any:
    """int, float, bool or str for a hint that is one of them (or Optional of one); else None (not checked)."""
    if typing.get_origin(hint) is typing.Union:
        arguments = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = arguments[0] if len(arguments) == 1 else None
    return hint if hint in (int, float, bool, str) else None


def _is_instance(value: Any, expected: type) -> bool:
    if expected is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if expected is float:
        return isinstance(value, (int, float))
    return isinstance(value, expected)


def _type_name(expected: type) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[expected]
