"""Hydra composes a run's config once, not twice (0.1-0.2 s of every ``python -m trainkit`` run).

Hydra 1.3's main composes the whole config to read ``hydra.mode`` (``Hydra.get_mode``, in MULTIRUN mode without
checking sweep overrides) and then again to run (``Hydra.run``, in RUN mode). Inside :func:`once`, the first
composition is made in RUN mode, as the second would be, and handed to the second when the second asks for the
same config with the same overrides (plus the ``hydra.mode=RUN`` Hydra adds when no config set a mode, applied
here as Hydra applies it: last). The two modes compose the same config wherever RUN mode composes at all: they
differ only in refusing sweep overrides and in skipping missing defaults, and where RUN mode refuses, the first
composition falls back to Hydra's own. Only for a run: a ``-m`` sweep composes as Hydra does.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, List, Optional, Tuple

from omegaconf import DictConfig

_MODE_RUN = "hydra.mode=RUN"  # what hydra._internal.utils._run_app adds when no config sets hydra.mode


@contextlib.contextmanager
def once() -> Iterator[None]:
    """Inside, a run's config is composed once (see the module); Hydra's loader is as it was afterwards."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.types import RunMode

    original = ConfigLoaderImpl.load_configuration
    held: List[Optional[Tuple[Optional[str], List[str], DictConfig]]] = [None]

    def load_configuration(self, config_name, overrides, run_mode, from_shell=True, validate_sweep_overrides=True):
        kept, held[0] = held[0], None  # handed over once, to the very next composition
        if run_mode == RunMode.MULTIRUN and not validate_sweep_overrides:  # Hydra.get_mode's composition
            try:
                cfg = original(self, config_name, overrides, RunMode.RUN, from_shell, True)
            except Exception:  # noqa: BLE001 -- a sweep override, a missing default: Hydra's own, as before
                return original(self, config_name, overrides, run_mode, from_shell, validate_sweep_overrides)
            held[0] = (config_name, list(overrides), cfg)
            return cfg
        if kept is not None and run_mode == RunMode.RUN and validate_sweep_overrides:
            name, given, cfg = kept
            extra = list(overrides[len(given):])
            if name == config_name and list(overrides[:len(given)]) == given and extra in ([], [_MODE_RUN]):
                if extra:
                    _apply_hydra_override(cfg, extra)
                return cfg
        return original(self, config_name, overrides, run_mode, from_shell, validate_sweep_overrides)

    ConfigLoaderImpl.load_configuration = load_configuration
    try:
        yield
    finally:
        ConfigLoaderImpl.load_configuration = original


def _apply_hydra_override(cfg: DictConfig, lines: List[str]) -> None:
    """`lines` (overrides of Hydra's own keys, after every other) applied as Hydra's loader applies its last ones."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides=lines)
    ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
    for override in parsed:
        cfg.hydra.overrides.hydra.append(override.input_line)
