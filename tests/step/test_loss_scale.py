"""The dynamic loss-scale rule at its edges: the floor of 1 and a growth that would overflow."""
import mindspore as ms
import numpy as np
import pytest

from trainkit.step.loss_scale import next_dynamic_scale


@pytest.mark.parametrize("scale,counter,finite,expected", [
    (1024.0, 0, True, (1024.0, 1)),          # one more good step
    (1024.0, 2, True, (2048.0, 0)),          # window of 3 complete: grow
    (1024.0, 2, False, (512.0, 0)),          # overflow: back off, restart the count
    (1.5, 1, False, (1.0, 0)),               # never below 1
    (2.0 ** 127, 2, True, (2.0 ** 127, 0)),  # growth to inf is refused
])
def test_next_dynamic_scale(scale, counter, finite, expected):
    new_scale, new_counter = next_dynamic_scale(ms.Tensor(scale, ms.float32), ms.Tensor(counter, ms.int32),
                                                ms.Tensor(finite), scale_factor=2, scale_window=3)
    assert (float(new_scale.asnumpy()), int(new_counter.asnumpy())) == expected
    assert np.isfinite(new_scale.asnumpy())
