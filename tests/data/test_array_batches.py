"""In-memory arrays one batch a pipeline row (trainkit.data.array_batches): the ordered sets are MindSpore's own
order, shard by shard; a shuffled set gives every sample once an epoch, a new order each epoch, the same run after
run, and a resume that replays the pipeline continues with the batches the uninterrupted run had."""
import mindspore.dataset as ds
import numpy as np
import pytest

from trainkit.data.array_batches import ArrayBatches, array_batches


@pytest.fixture(autouse=True)
def exact_recovery():
    """As the app sets it for ``trainer.resume_data=exact`` (MindSpore's default is fast recovery)."""
    ds.config.set_fast_recovery(False)
    yield
    ds.config.set_fast_recovery(True)


def columns(n: int) -> dict:
    rng = np.random.default_rng(n)
    return {"x": rng.standard_normal((n, 3)).astype(np.float32), "y": np.arange(n, dtype=np.int32)}


def batches(dataset, epochs: int = 1) -> list:
    iterator = dataset.create_tuple_iterator(num_epochs=epochs, output_numpy=True)
    out = []
    for _ in range(epochs):
        out.append([tuple(column.copy() for column in row) for row in iterator])
    return out


@pytest.mark.parametrize("n, shards, batch", [(10, 1, 4), (10, 3, 2), (7, 4, 3), (12, 2, 5)])
def test_an_ordered_set_is_mindsporess_own_batches_shard_by_shard(n, shards, batch):
    data = columns(n)
    for shard in range(shards):
        kwargs = {"num_shards": shards, "shard_id": shard} if shards > 1 else {}
        expected = batches(ds.NumpySlicesDataset(data, shuffle=False, **kwargs).batch(batch))[0]
        got = batches(array_batches(data, batch, shuffle=False, drop_remainder=False, num_shards=shards,
                                    shard_id=shard))[0]
        assert len(got) == len(expected)
        for (x, y), (x_ref, y_ref) in zip(got, expected):
            np.testing.assert_array_equal(x, x_ref)
            np.testing.assert_array_equal(y, y_ref)


def test_a_shuffled_set_gives_each_sample_once_an_epoch_in_a_new_order_the_same_every_run():
    data = columns(50)
    ds.config.set_seed(7)
    epochs = batches(array_batches(data, 8, shuffle=True, drop_remainder=True), epochs=3)
    orders = []
    for epoch in epochs:
        assert [len(y) for _, y in epoch] == [8] * 6  # 50 samples: 6 whole batches, the rest dropped
        seen = np.concatenate([y for _, y in epoch])
        assert len(set(seen.tolist())) == 48  # no sample twice
        for x, y in epoch:
            np.testing.assert_array_equal(x, data["x"][y])  # the columns stay paired
        orders.append(seen)
    assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[1], orders[2])
    again = batches(array_batches(data, 8, shuffle=True, drop_remainder=True), epochs=3)
    assert all(np.array_equal(a[1], b[1]) for first, second in zip(epochs, again) for a, b in zip(first, second))
    ds.config.set_seed(8)
    other = batches(array_batches(data, 8, shuffle=True, drop_remainder=True))[0]
    assert not np.array_equal(np.concatenate([y for _, y in other]), orders[0])


def test_the_shards_of_a_shuffled_epoch_split_it_and_a_peek_does_not_move_the_order_on():
    data = columns(40)
    ds.config.set_seed(3)
    seen = []
    for shard in range(4):
        dataset = array_batches(data, 5, shuffle=True, drop_remainder=True, num_shards=4, shard_id=shard)
        dataset.output_shapes()  # reads a first batch and stops: not an epoch
        (epoch,) = batches(dataset)
        seen.append(np.concatenate([y for _, y in epoch]))
    assert sorted(np.concatenate(seen).tolist()) == list(range(40))
    unpeeked = batches(array_batches(data, 5, shuffle=True, drop_remainder=True, num_shards=4, shard_id=0))[0]
    np.testing.assert_array_equal(np.concatenate([y for _, y in unpeeked]), seen[0])


def test_a_resume_that_replays_the_pipeline_continues_with_the_same_batches():
    """``set_init_step`` as the app calls it on resume (``trainer.resume_data=exact``): mid-way through epoch 2."""
    data = columns(30)
    ds.config.set_seed(11)
    whole = [y for epoch in batches(array_batches(data, 4, shuffle=True, drop_remainder=True), epochs=3)
             for _, y in epoch]
    resumed = array_batches(data, 4, shuffle=True, drop_remainder=True)
    resumed.set_init_step(9)  # 7 batches an epoch: epoch 2, its third batch
    iterator = resumed.create_tuple_iterator(num_epochs=3, output_numpy=True)  # the run's, as Model.train asks
    rest = [y.copy() for _ in range(2) for _, y in iterator]
    assert len(rest) == len(whole) - 9
    for got, expected in zip(rest, whole[9:]):
        np.testing.assert_array_equal(got, expected)


def test_fast_recovery_takes_mindsporess_row_by_row_shuffle():
    """MindSpore's fast recovery skips into an epoch without running the source's earlier passes."""
    ds.config.set_fast_recovery(True)
    try:
        dataset = array_batches(columns(20), 4, shuffle=True, drop_remainder=True)
    finally:
        ds.config.set_fast_recovery(False)
    assert isinstance(array_batches(columns(20), 4, shuffle=False, drop_remainder=True), ds.GeneratorDataset)
    assert not isinstance(dataset, ds.GeneratorDataset)
    assert isinstance(array_batches(columns(20), 4, shuffle=True, drop_remainder=True), ds.GeneratorDataset)


def test_columns_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="differ in length"):
        ArrayBatches({"x": np.zeros(3), "y": np.zeros(4)}, 2, shuffle=False, drop_remainder=False)
