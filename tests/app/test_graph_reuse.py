"""graph_reuse's rules on tiny cells (the end-to-end bitwise check is test_compile_cache_safety.py): a job shares
only the cells of a completed job of its own key whose Parameters match by name, shape and type, and the copy
writes the values in place."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

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
