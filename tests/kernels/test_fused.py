"""The fused C++ EMA kernel (trainkit/kernels/): bitwise NumPy's float32 arithmetic, in place in the
Parameter, in graph and pynative mode; built once into the cache folder; MindSpore's kernels without a compiler."""
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from tests.common.kernels import needs_compiler
from tests.common.models import TinyMLP, batches, loss_network, run, weights_of
from trainkit import TrainingWrapper, kernels


def numpy_update(shadow: np.ndarray, value: np.ndarray, weight: np.float32) -> np.ndarray:
    """MindSpore's fallback, op by op in float32: shadow - (shadow - value) * weight."""
    return shadow - (shadow - value) * weight


class Updater(nn.Cell):
    def __init__(self, shadow: np.ndarray, value: np.ndarray):
        super().__init__()
        self.kernel = kernels.ema_update_kernel()
        self.shadow = Parameter(Tensor(shadow.copy()), name="shadow")
        self.value = Parameter(Tensor(value), name="value")

    def construct(self, weight):
        return self.kernel(self.shadow, self.value, weight)


@needs_compiler
@pytest.mark.parametrize("size", [1, 7, 1000, 300_001])  # 300,001: the multithreaded path, an odd tail
def test_the_kernel_updates_the_parameter_in_place_bitwise_as_numpy(mode, shared_cache, size):
    rng = np.random.default_rng(size)
    shadow, value = rng.standard_normal(size).astype(np.float32), rng.standard_normal(size).astype(np.float32)
    cell = Updater(shadow.reshape(-1, 1) if size % 2 else shadow, value.reshape(-1, 1) if size % 2 else value)
    expected = shadow
    for weight in (np.float32(0.1), np.float32(0.0137), np.float32(1.0)):
        cell(Tensor(weight))
        expected = numpy_update(expected, value, weight)
        np.testing.assert_array_equal(cell.shadow.asnumpy().reshape(-1), expected)
    np.testing.assert_array_equal(cell.value.asnumpy().reshape(-1), value)  # the source is only read


@needs_compiler
def test_it_is_built_once_into_the_cache_folder_and_reused(own_cache):
    path, reason = kernels.library()
    assert path is not None, reason
    assert Path(path).parent == own_cache / "kernels"  # never into the package
    built = os.stat(path).st_mtime_ns
    kernels.build._build.cache_clear()  # a new process: finds the library, builds nothing
    assert kernels.library() == (path, "") and os.stat(path).st_mtime_ns == built
    assert "fused C++ kernels" in kernels.describe()


@needs_compiler
@pytest.mark.parametrize("damage", [b"not a library", b"\x7fELF" + bytes(60)])
def test_a_damaged_cached_library_is_built_again_not_loaded(own_cache, caplog, damage):
    path, reason = kernels.library()
    assert path is not None, reason
    Path(path).write_bytes(damage)  # a truncated download, a file from another machine
    kernels.build._build.cache_clear()  # a new process
    assert kernels.library() == (path, "")
    assert "are not the ones this build wrote (a damaged or foreign file): building them again" in caplog.text
    assert Path(path).read_bytes()[:4] == b"\x7fELF" and len(Path(path).read_bytes()) > 1000  # rebuilt
    cell = Updater(np.ones(3, np.float32), np.zeros(3, np.float32))  # and the kernel runs
    cell(Tensor(np.float32(0.5)))
    np.testing.assert_array_equal(cell.shadow.asnumpy(), np.full(3, 0.5, np.float32))


FOREIGN = {  # libraries that load, found under the name of this build
    "an older build, an entry point missing": 'extern "C" int TrainkitEmaUpdate() { return 0; }',
    "every entry point, another build's digest": None,  # trainkit's own source, built with another digest
}


@needs_compiler
@pytest.mark.parametrize("foreign", FOREIGN, ids=["older", "other-digest"])
def test_a_foreign_library_under_this_builds_name_is_built_again_and_never_run(own_cache, caplog, tmp_path,
                                                                               foreign):
    """Found, rebuilt, and the rebuilt one is what MindSpore then runs in the same process (the check's own
    dlopen is closed: left open, MindSpore's dlopen of the same path got the foreign library back)."""
    path, reason = kernels.library()
    assert path is not None, reason
    source = tmp_path / "foreign.cc"
    source.write_text(FOREIGN[foreign] or kernels.build.SOURCE)
    compiler = shutil.which(os.environ.get("CXX") or "g++")
    subprocess.run([compiler, *kernels.build.FLAGS, '-DTRAINKIT_DIGEST="someone-else"', "-o", path, str(source)],
                   check=True)
    kernels.build._build.cache_clear()  # a new process
    assert kernels.library() == (path, "")
    assert "are not the ones this build wrote (a damaged or foreign file): building them again" in caplog.text
    cell = AllAtOnce(kernels.ema_update_all_kernel(), [np.ones(3, np.float32)], with_weight=True)
    cell((Tensor(np.zeros(3, np.float32)),), Tensor(np.float32(0.5)))
    np.testing.assert_array_equal(cell.firsts[0].asnumpy(), np.full(3, 0.5, np.float32))


def test_without_a_compiler_or_when_turned_off_mindspores_kernels_run(own_cache, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert kernels.library() == (None, "no C++ compiler (no-such-compiler-here) on PATH")
    assert kernels.ema_update_kernel() is None
    assert kernels.describe().startswith("MindSpore's kernels (no C++ compiler")
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("TRAINKIT_FUSED_KERNELS", "0")
    assert kernels.library() == (None, "TRAINKIT_FUSED_KERNELS=0")


@pytest.mark.parametrize("path", ["fused", "mindspore"])
def test_the_wrappers_ema_is_bitwise_the_same_on_both_paths(mode, shared_cache, monkeypatch, path):
    if path == "fused" and shutil.which(os.environ.get("CXX") or "g++") is None:
        pytest.skip("no C++ compiler")
    if path == "mindspore":
        monkeypatch.setenv("TRAINKIT_FUSED_KERNELS", "0")
    ms.set_seed(0)
    net = TinyMLP(batch_norm=True)
    wrapper = TrainingWrapper(loss_network(net), nn.Momentum(net.trainable_params(), 0.1, 0.9), ema_decay=0.7,
                              ema_warmup=True)
    assert (wrapper.ema.fused_kernel is not None) == (path == "fused")
    assert (wrapper.ema.fused_all is not None) == (path == "fused")  # every shadow float32: one call for all
    expected = {name: value.astype(np.float32) for name, value in weights_of(net).items()}
    for updates, batch in enumerate(batches(4, 4, seed=3)):
        run(wrapper, [batch])
        weight = np.float32(1.0) - np.minimum(np.float32(0.7), np.float32(1 + updates) / np.float32(10 + updates))
        expected = {k: numpy_update(expected[k], v, weight) for k, v in weights_of(net).items()}
    shadows = {p.name[len("ema."):]: p.asnumpy() for p in wrapper.get_parameters() if p.name.startswith("ema.")}
    assert shadows.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(shadows[name], value, err_msg=name)


class Adder(nn.Cell):
    def __init__(self, buffer: np.ndarray):
        super().__init__()
        self.kernel = kernels.add_into_kernel()
        self.buffer = Parameter(Tensor(buffer.copy()), name="buffer")

    def construct(self, value):
        return self.kernel(self.buffer, value)


@needs_compiler
@pytest.mark.parametrize("size", [1, 1000, 300_001])
def test_the_accumulate_kernel_adds_into_the_parameter_bitwise_as_numpy(mode, shared_cache, size):
    rng = np.random.default_rng(size)
    buffer = rng.standard_normal(size).astype(np.float32)
    cell = Adder(buffer)
    expected = buffer
    for _ in range(3):
        value = rng.standard_normal(size).astype(np.float32)
        cell(Tensor(value))
        expected = expected + value  # float32 + float32, rounded once, as the kernel
        np.testing.assert_array_equal(cell.buffer.asnumpy(), expected)


@needs_compiler
def test_accumulation_is_bitwise_the_same_on_both_paths(mode, shared_cache, monkeypatch):
    """The fallback (AssignAdd) is checked against the PyTorch reference in test_wrapper.py; the fused path must
    give the same bits: weights after 3 windows of 3 micro-batches, and the buffer of the window in progress."""

    def train(fused_on: bool):
        if not fused_on:
            monkeypatch.setenv("TRAINKIT_FUSED_KERNELS", "0")
        ms.set_seed(0)
        net = TinyMLP(batch_norm=True)
        # nn.Momentum: its fused update is bitwise MindSpore's too (Adam's is NumPy's float32 arithmetic, which
        # MindSpore's SIMD Adam misses by a last bit here and there: tests/kernels/test_fused_optimizer.py).
        wrapper = TrainingWrapper(loss_network(net), nn.Momentum(net.trainable_params(), 0.01, 0.9),
                                  accumulation_steps=3, max_grad_norm=0.5)
        assert wrapper.fused_accumulate == fused_on
        assert (wrapper.add_into_all is not None) == fused_on
        run(wrapper, batches(11, 4, seed=5))  # 3 windows and 2 micro-batches of a fourth
        monkeypatch.delenv("TRAINKIT_FUSED_KERNELS", raising=False)
        return {p.name: p.asnumpy() for p in wrapper.get_parameters()}

    reference = train(False)
    fused_run = train(True)
    assert fused_run.keys() == reference.keys() and any(k.startswith("_grad_sum") for k in reference)
    for name, value in reference.items():
        np.testing.assert_array_equal(fused_run[name], value, err_msg=name)


class AllAtOnce(nn.Cell):
    """k Parameters written in place by one call of a kernel over k pairs (the EMA: with a weight)."""

    def __init__(self, kernel, firsts, with_weight: bool):
        super().__init__()
        self.kernel = kernel
        self.firsts = ParameterTuple([Parameter(Tensor(first.copy()), name=f"first{i}")
                                      for i, first in enumerate(firsts)])
        self.with_weight = with_weight

    def construct(self, seconds, weight):
        if self.with_weight:
            return self.kernel(*self.firsts, *seconds, weight)
        return self.kernel(*self.firsts, *seconds)


# Sizes around the threads' split (from 256 Ki values, halves of the total): the split falls inside a tensor.
SIZES = [(3, 1), (300_001,), (7,), (2, 100_000), (1,)]


@needs_compiler
@pytest.mark.parametrize("which", ["ema", "add", "accumulate"])
def test_the_kernels_over_all_tensors_at_once_are_bitwise_numpys(mode, shared_cache, which):
    """``accumulate`` (the window with no branch): its flag says a window's first micro-step, which assigns."""
    rng = np.random.default_rng(11)
    firsts = [rng.standard_normal(shape).astype(np.float32) for shape in SIZES]
    kernel = {"ema": kernels.ema_update_all_kernel, "add": kernels.add_into_all_kernel,
              "accumulate": kernels.accumulate_all_kernel}[which]()
    cell = AllAtOnce(kernel, firsts, with_weight=which != "add")
    expected = firsts
    for call, opens in enumerate([False, True, False, False, True]):
        seconds = [rng.standard_normal(shape).astype(np.float32) for shape in SIZES]
        weight = np.float32(0.25 + 0.1 * call)
        cell(tuple(Tensor(second) for second in seconds), Tensor(opens if which == "accumulate" else weight))
        if which == "ema":
            expected = [numpy_update(first, second, weight) for first, second in zip(expected, seconds)]
        elif which == "accumulate" and opens:
            expected = seconds
        else:
            expected = [first + second for first, second in zip(expected, seconds)]
        for index, (got, want) in enumerate(zip(cell.firsts, expected)):
            np.testing.assert_array_equal(got.asnumpy(), want, err_msg=f"tensor {index}, call {call}")


@needs_compiler
def test_the_kernels_over_all_tensors_refuse_what_is_not_float32(shared_cache, graph_mode):
    """A float16 value read as float32 would be garbage: the kernel fails the step instead."""
    cell = AllAtOnce(kernels.add_into_all_kernel(), [np.zeros(4, np.float32)], with_weight=False)
    with pytest.raises(RuntimeError):
        cell((Tensor(np.ones(4, np.float16)),), Tensor(np.float32(0)))
        cell.firsts[0].asnumpy()
    np.testing.assert_array_equal(cell.firsts[0].asnumpy(), np.zeros(4, np.float32))


class SaveAndRestore(nn.Cell):
    """The guard's round trip of the moving statistics: k Parameters copied into one flat tensor, written over,
    copied again, then put back from a flat tensor unless `keep`."""

    def __init__(self, firsts):
        super().__init__()
        self.concat = kernels.concat_all_kernel()
        self.restore = kernels.restore_flat_unless_kernel()
        self.firsts = ParameterTuple([Parameter(Tensor(first.copy()), name=f"first{i}")
                                      for i, first in enumerate(firsts)])
        self.hyper_map = ops.HyperMap()

    def construct(self, news, saved, keep):
        before = self.concat(*self.firsts)
        self.hyper_map(ops.assign, self.firsts, news)
        after = self.concat(*self.firsts)
        return before, after, self.restore(*self.firsts, saved, keep)


@needs_compiler
@pytest.mark.parametrize("keep", [True, False])
def test_the_flat_copy_and_restore_are_numpys_concatenate_and_read_in_program_order(mode, shared_cache, keep):
    """The copy taken before the assigns holds the old values, the one after the new (the wrapper copies the moving
    statistics before the forward pass writes them); the restore writes the flat values back only when not `keep`.
    Mutations caught: a copy that skips a tensor's tail (`high - low - 1`); the restore's flag ignored."""
    rng = np.random.default_rng(5)
    firsts = [rng.standard_normal(shape).astype(np.float32) for shape in SIZES]
    news = [rng.standard_normal(shape).astype(np.float32) for shape in SIZES]
    saved = rng.standard_normal(sum(a.size for a in firsts)).astype(np.float32)
    cell = SaveAndRestore(firsts)
    before, after, _ = cell(tuple(Tensor(n) for n in news), Tensor(saved), Tensor(keep))
    np.testing.assert_array_equal(before.asnumpy(), np.concatenate([a.ravel() for a in firsts]))
    np.testing.assert_array_equal(after.asnumpy(), np.concatenate([a.ravel() for a in news]))
    offsets = np.cumsum([0] + [a.size for a in firsts])
    for index, (got, new) in enumerate(zip(cell.firsts, news)):
        want = new if keep else saved[offsets[index]:offsets[index + 1]].reshape(new.shape)
        np.testing.assert_array_equal(got.asnumpy(), want, err_msg=f"tensor {index}")


HOSTILE = """
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(MARKER, "w"); if (f) { fputs("ran", f); fclose(f); }
}
extern "C" const char *TrainkitDigest() { return DIGEST; }
"""


def plant_hostile_library(path: Path, marker: Path, digest: str) -> None:
    """A library whose constructor writes `marker` when anything dlopens it, answering to this build's digest."""
    source = path.parent / "hostile.cc"
    source.write_text(HOSTILE)
    compiler = shutil.which(os.environ.get("CXX") or "g++")
    subprocess.run([compiler, *kernels.build.FLAGS, f'-DMARKER="{marker}"', f'-DDIGEST="{digest}"', "-o", str(path),
                    str(source)], check=True)
    source.unlink()


@needs_compiler
def test_a_planted_library_under_this_builds_name_is_never_opened(own_cache, tmp_path, caplog):
    """Issue 30: the check that should refuse a foreign library dlopened it, running its constructor. Now the file's
    SHA-256 is compared with the one recorded at build time before anything opens it. Mutation tried: the recorded
    hash test removed from ``_cached`` (the marker is written)."""
    path, reason = kernels.library()
    assert path is not None, reason
    digest = Path(path).name[len("fused-"):-len(".so")]
    marker = tmp_path / "constructor-ran"
    plant_hostile_library(Path(path), marker, digest)
    kernels.build._build.cache_clear()  # a new process
    assert kernels.library() == (path, "")
    assert "not the ones this build wrote" in caplog.text and not marker.exists()


@needs_compiler
@pytest.mark.parametrize("shared", ["kernels", "root"])
def test_a_cache_folder_others_can_write_is_not_loaded_from(own_cache, tmp_path, shared):
    """A shared TRAINKIT_CACHE_DIR: whoever can write it could plant a library (and its recorded hash), so nothing
    there is loaded and MindSpore's kernels run, saying why. Mutation tried: unsafe_folder returning None."""
    path, reason = kernels.library()
    assert path is not None, reason
    digest = Path(path).name[len("fused-"):-len(".so")]
    marker = tmp_path / "constructor-ran"
    plant_hostile_library(Path(path), marker, digest)
    Path(path + ".sha256").write_text(kernels.build._sha256(Path(path)) + "\n")  # the planter records it too
    os.chmod(own_cache / "kernels" if shared == "kernels" else own_cache, 0o777)
    kernels.build._build.cache_clear()
    found, why = kernels.library()
    assert found is None and "is writable by other users (mode 777)" in why and "chmod go-w" in why
    assert "MindSpore's kernels" in kernels.describe() and not marker.exists()


@needs_compiler
def test_a_planted_library_with_its_hash_forged_is_not_said_to_be_unopened(own_cache, tmp_path, caplog):
    """Whoever can write the cache folder can write a library and its recorded hash both (the folder check is the
    guard for that); such a file is opened to read its digest, so the warning must not say it was never loaded.
    Mutation tried: the forged-hash branch removed from _build (the "without loading that file" line came back)."""
    path, reason = kernels.library()
    assert path is not None, reason
    plant_hostile_library(Path(path), tmp_path / "constructor-ran", "another-build")
    Path(path + ".sha256").write_text(hashlib.sha256(Path(path).read_bytes()).hexdigest() + "\n")
    kernels.build._build.cache_clear()  # a new process
    assert kernels.library() == (path, "")
    assert "carry their recorded SHA-256 but are not this build's" in caplog.text
    assert "without loading that file" not in caplog.text
