"""A digits run trained through the app, and its network's logits computed apart from the tools that read it."""
import mindspore as ms
import numpy as np

from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.app.tool_config import build_data, build_network, saved_config
from trainkit.data.digits import DigitsData, load_digits_arrays


def train_digits_run(run_dir):
    """One epoch of the quick-start recipe (small CNN, EMA on, the default conv_impl) through the app."""
    train(compose_config([f"run_dir={run_dir}", "logger.progress=off", "logger.tensorboard=false",
                          "trainer.epochs=1", "model.width=4", "data.batch_size=64", "trainer.test=false"]))
    return run_dir


def network_logits(run_dir, images, weights="live", one_at_a_time=False):
    """The trained network on `images` (in one batch, or one image a call), its weights read by MindSpore's own
    loader in this test."""
    cfg = saved_config(run_dir, [])
    data = build_data(cfg)
    data.prepare()  # the sizes a table's data fills in
    network = build_network(cfg, data)
    saved = ms.load_checkpoint(str(run_dir / "checkpoints" / "best.ckpt"))
    own = [p.name for p in network.get_parameters()]
    values = {name: saved[("ema." if weights == "ema" else "") + name] for name in own}
    assert not ms.load_param_into_net(network, values, strict_load=True)[0]
    network.set_train(False)
    if one_at_a_time:
        return np.concatenate([network(ms.Tensor(image[None])).asnumpy() for image in images]).astype(np.float64)
    return network(ms.Tensor(images)).asnumpy().astype(np.float64)


def val_digits(count):
    """The first `count` validation digits: raw (as load_digits gives them) and as the eval set feeds them."""
    raw, labels = load_digits_arrays()
    data = DigitsData()
    data.prepare()
    val_index = data.split(labels)[1][:count]
    fed = next(data.eval_dataset().create_tuple_iterator(num_epochs=1, output_numpy=True))[0][:count]
    return raw[val_index].reshape(count, 64), fed
