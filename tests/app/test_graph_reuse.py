"""graph_reuse's rules on tiny cells (the end-to-end bitwise check is test_compile_cache_safety.py): a job shares
only the cells of a completed job of its own key whose Parameters match by name, shape and type, and the copy
writes the values in place."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from trainkit.app import graph_reuse


def cells(width: int = 3, seed: int = 0) -> graph_reuse.CompiledCells:
    ms.set_seed(seed)
    backbone = nn.Dense(4, width)
    loss_network = nn.WithLossCell(backbone, nn.MSELoss())
    optimizer = nn.Momentum(backbone.trainable_params(), learning_rate=[0.1, 0.2], momentum=0.9)
    return graph_reuse.CompiledCells(backbone, loss_network, optimizer, nn.TrainOneStepCell(loss_network, optimizer),
                                     None)


@pytest.fixture(autouse=True)
def nothing_kept():
    graph_reuse.forget()
    yield
    graph_reuse.forget()


def run_job(key, built):
    with graph_reuse.sharing(key):
        return graph_reuse.reuse(built)


def test_a_job_of_the_same_key_gets_the_kept_cells_with_its_own_values_written_into_them(graph_mode):
    """Mutation tried: the copy loop removed from reuse (the kept weights keep the first job's values)."""
    first = run_job("k", cells(seed=0))
    x, y = Tensor(np.ones((2, 4), np.float32)), Tensor(np.zeros((2, 3), np.float32))
    first.wrapper(x, y)  # compiled, and its state moved on: weights, momentum, global_step
    memory = first.backbone.weight.asnumpy()  # a view of the Parameter's memory on CPU
    second_built = cells(seed=1)
    expected = {name: p.asnumpy().copy() for name, p in second_built.wrapper.parameters_and_names()}
    weight = second_built.backbone.weight.asnumpy().copy()
    second = run_job("k", second_built)
    assert second is first
    got = {name: p.asnumpy() for name, p in second.wrapper.parameters_and_names()}
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    np.testing.assert_array_equal(memory, weight)  # in place: the memory the compiled graph reads
    alone = cells(seed=1)  # the second job's cells, compiled for themselves
    second.wrapper(x, y)
    alone.wrapper(x, y)  # its step reads the rate table at global_step 0, as the shared step must
    for (name, shared), (_, own) in zip(second.wrapper.parameters_and_names(), alone.wrapper.parameters_and_names()):
        np.testing.assert_array_equal(shared.asnumpy(), own.asnumpy(), err_msg=name)


@pytest.mark.parametrize("second_key, width", [("other", 3), ("k", 5)])
def test_another_key_or_other_shapes_get_their_own_cells(second_key, width, graph_mode):
    """Mutation tried: the shape comparison removed from _parameter_pairs (the width-5 job got the kept cells)."""
    first = run_job("k", cells())
    second_built = cells(width=width)
    assert run_job(second_key, second_built) is second_built
    assert run_job("k", cells()) is not first  # only the latest completed job's cells are kept


def test_a_failed_job_leaves_nothing_to_share(graph_mode):
    with pytest.raises(RuntimeError), graph_reuse.sharing("k"):
        graph_reuse.reuse(cells())
        raise RuntimeError("the run crashed")
    fresh = cells()
    assert run_job("k", fresh) is fresh


def test_no_key_no_sharing(graph_mode):
    first = run_job(None, cells())
    fresh = cells()
    assert run_job(None, fresh) is fresh and fresh is not first


def test_no_sharing_for_a_resuming_run_or_with_the_cache_off(tmp_path, monkeypatch):
    """A resume loads its checkpoint with set_data, which a compiled graph's control flow does not see; the cache
    switch turns sharing off too. Mutation tried: the resume condition removed from key_of (a key is given)."""
    from trainkit.app.config import compose_config

    base = ["recipe=digits_quickstart", f"run_dir={tmp_path / 'run'}"]
    assert graph_reuse.key_of(compose_config(base)) is not None
    assert graph_reuse.key_of(compose_config([*base, "trainer.resume=auto"])) is None
    monkeypatch.setenv("TRAINKIT_COMPILE_CACHE", "0")
    assert graph_reuse.key_of(compose_config(base)) is None


class RandomInConstruct(nn.Cell):
    """A functional dropout: MindSpore takes its seed from the global seed, as a constant, at compile time."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 3)

    def construct(self, x):
        return ops.dropout(self.dense(x), p=0.5, training=True)


class DrawnInInit(nn.Cell):
    """A mask drawn from the seed in __init__ and kept as a Tensor, not a Parameter: a constant of the graph."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 3)
        self.mask = Tensor((np.random.default_rng(ms.get_seed()).random(3) > 0.5).astype(np.float32))

    def construct(self, x):
        return self.dense(x) * self.mask


def cells_of(make, seed):
    ms.set_seed(seed)
    backbone = make()
    loss_network = nn.WithLossCell(backbone, nn.MSELoss())
    optimizer = nn.Momentum(backbone.trainable_params(), learning_rate=0.1, momentum=0.9)
    return graph_reuse.CompiledCells(backbone, loss_network, optimizer, nn.TrainOneStepCell(loss_network, optimizer),
                                     None)


def step(built):
    built.wrapper(Tensor(np.ones((2, 4), np.float32)), Tensor(np.zeros((2, 3), np.float32)))


def test_a_job_of_another_seed_shares_where_the_seed_only_reaches_the_starting_weights(graph_mode):
    """The seed is out of the sharing key (sweep.repeats). Mutation tried: seed_free returning False always (the
    second seed compiled its own cells)."""
    first = run_job("k", cells_of(lambda: nn.Dense(4, 3), seed=0))
    step(first)
    second = run_job("k", cells_of(lambda: nn.Dense(4, 3), seed=1))
    assert second is first


class DrawnWhileCompiling(nn.Cell):
    """NumPy's random in construct: MindSpore draws it once, as it compiles, into a constant of the graph."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 3)

    def construct(self, x):
        return self.dense(x) * Tensor(np.random.rand(3).astype(np.float32))


@pytest.fixture
def known_code(monkeypatch):
    """This module's cells taken as known code: the checks after the first one are the ones tried."""
    monkeypatch.setattr(graph_reuse, "KNOWN_CODE", graph_reuse.KNOWN_CODE + (__name__,))


@pytest.mark.parametrize("make", [RandomInConstruct, DrawnInInit], ids=["random operator", "constant drawn"])
def test_a_job_of_another_seed_gets_its_own_cells_where_the_graphs_hold_something_drawn_from_the_seed(
        make, graph_mode, known_code):
    """Mutations tried: the random-operator check removed from seed_free (the functional dropout shared: its mask
    would be the first seed's); the constants' comparison removed (the drawn mask shared)."""
    first = run_job("k", cells_of(make, seed=0))
    step(first)
    assert run_job("k", cells_of(make, seed=0)) is first  # the same seed: the same constants, shared
    second_built = cells_of(make, seed=1)
    assert run_job("k", second_built) is second_built


def test_a_cell_of_code_other_than_mindspores_or_trainkits_compiles_per_seed(graph_mode):
    """A draw made while compiling is a constant nothing shows (not a random operator, not an attribute).
    Mutation tried: the KNOWN_CODE rule removed from seed_free (the second seed got the first seed's draw)."""
    first = run_job("k", cells_of(DrawnWhileCompiling, seed=0))
    step(first)
    second_built = cells_of(DrawnWhileCompiling, seed=1)
    assert run_job("k", second_built) is second_built


def test_graphs_with_control_flow_are_not_vouched_for(graph_mode, known_code):
    """A branch is a graph of its own the check does not read: another seed compiles (Mutation tried: Switch and
    nameless call nodes taken as plain operators: shared)."""

    class Branching(nn.Cell):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(4, 3)
            self.flag = ms.Parameter(Tensor(1, ms.int32), requires_grad=False)

        def construct(self, x):
            y = self.dense(x)
            if self.flag > 0:
                y = y * 2
            return y

    first = run_job("k", cells_of(Branching, seed=0))
    step(first)
    second_built = cells_of(Branching, seed=1)
    assert run_job("k", second_built) is second_built
