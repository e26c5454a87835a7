"""One rank of the data-parallel wrapper test; launched by msrun from tests/test_data_parallel.py.

Each rank trains on its half of every micro-batch with all features on; rank 1 plants a NaN in
one micro-batch. Writes its final state to OUT_DIR/rank_<r>.npz.
"""
import sys

import mindspore as ms
import numpy as np
from mindspore import amp, nn
from mindspore.communication import get_group_size, get_rank, init

from tests.common.models import TinyMLP, loss_network, run, weights_of
from tests.distributed.test_data_parallel import NAN_MICRO_BATCH, SETTINGS, global_batches
from trainkit import TrainingWrapper


def main(out_dir: str) -> None:
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank, size = get_rank(), get_group_size()
    net = TinyMLP()
    opt = nn.Adam(net.trainable_params(), learning_rate=SETTINGS["lr"])
    wrapper = TrainingWrapper(loss_network(net), opt, accumulation_steps=SETTINGS["accumulation_steps"],
                              max_grad_norm=SETTINGS["max_grad_norm"], ema_decay=SETTINGS["ema_decay"],
                              loss_scale=amp.DynamicLossScaler(SETTINGS["loss_scale"], 2, SETTINGS["scale_window"]))
    assert wrapper.grad_reducer is not None
    local = []
    for i, (x, y) in enumerate(global_batches()):
        x, y = np.array_split(x, size)[rank].copy(), np.array_split(y, size)[rank]
        if i == NAN_MICRO_BATCH and rank == 1:
            x[0, 0] = np.nan
        local.append((x, y))
    outputs = run(wrapper, local)
    state = {p.name: p.asnumpy() for p in wrapper.get_parameters()}
    state.update({"overflow": np.array([o[1] for o in outputs]), "scale_used": np.array([o[2] for o in outputs]),
                  "grad_norm": np.array([o[3] for o in outputs]), "weights": np.array(sorted(weights_of(net)))})
    np.savez(f"{out_dir}/rank_{rank}.npz", **state)


if __name__ == "__main__":
    main(sys.argv[1])
