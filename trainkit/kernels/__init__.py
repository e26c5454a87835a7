"""Fused C++ kernels for CPU through ``ops.Custom(func_type="aot")``: what MindSpore's own CPU kernels do slowly.

``fused.cc`` holds them (the EMA update and accumulate-into in place, im2col and its gradient for the
convolutions); :mod:`~trainkit.kernels.build` builds it once per machine with the system's C++ compiler, and
:mod:`~trainkit.kernels.primitives` hands each as a primitive, or None where it cannot be built (then the
callers run MindSpore's kernels, bitwise the same arithmetic; :func:`describe` says which path a run takes).

Import rule (the layers contract in pyproject.toml, checked by tests/test_layout.py): may import the foundation
(``checks``, ``process``, ``errors``) only; every wing above may import it.
"""
from trainkit.kernels.build import cache_dir, describe, library
from trainkit.kernels.primitives import (
    accumulate_all_kernel,
    add_into_all_kernel,
    add_into_kernel,
    batch_norm_kernel,
    concat_all_kernel,
    conv_output_size,
    depthwise_kernel,
    ema_update_all_if_kernel,
    ema_update_all_kernel,
    ema_update_kernel,
    gelu_kernel,
    geometry_values,
    im2col_kernel,
    layer_norm_kernel,
    max_pool_kernel,
    norm_all_kernel,
    optimizer_update_kernel,
    pool_output_size,
    restore_all_unless_kernel,
    restore_flat_unless_kernel,
)

__all__ = ["accumulate_all_kernel", "add_into_all_kernel", "add_into_kernel", "batch_norm_kernel", "cache_dir",
           "concat_all_kernel", "conv_output_size", "depthwise_kernel", "describe", "ema_update_all_if_kernel",
           "ema_update_all_kernel", "ema_update_kernel", "gelu_kernel", "geometry_values", "im2col_kernel",
           "layer_norm_kernel", "library", "max_pool_kernel", "norm_all_kernel", "optimizer_update_kernel",
           "pool_output_size", "restore_all_unless_kernel", "restore_flat_unless_kernel"]
