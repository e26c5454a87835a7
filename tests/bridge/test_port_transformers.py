"""python -m trainkit.port on transformers as people write them (class tokens and position embeddings as
nn.Parameter, torch.arange, expand, masks from token ids, scaled_dot_product_attention, chunk/split, einsum) and on
torchvision's and timm's: each ported with its own random weights computes what PyTorch computes in eval mode, on a
batch port never saw."""
import importlib

import mindspore as ms
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.common import torch_transformer_models  # noqa: E402
from tests.bridge.test_port import dropout_counters, expected_names  # noqa: E402
from trainkit.bridge.port import main  # noqa: E402

MODELS = "tests.common.torch_transformer_models"
# name: (factory, one sample's shape, token vocabulary or None)
CASES = {
    "vit": ("ViT", (3, 16, 16), None),
    "bert": ("BertEncoder", (12,), 50),
    "timm_vit": ("timm_vit", (3, 32, 32), None),
    "torchvision_vit": ("torchvision_vit", (3, 32, 32), None),
    "timm_swin": ("timm_swin", (3, 32, 32), None),
}


def port(name, folder, *extra):
    factory, shape, vocab = CASES[name]
    argv = [f"{MODELS}:{factory}", "--out", str(folder / name), "--input-shape", ",".join(map(str, shape)), *extra]
    return main(argv + (["--input-ints", str(vocab)] if vocab else []))


def a_batch(name, seed=123):
    """Another batch than port's: another seed and size, normal rather than uniform; ids with padding at the end."""
    _, shape, vocab = CASES[name]
    rng = np.random.default_rng(seed)
    if not vocab:
        return rng.normal(0, 1, (3, *shape)).astype(np.float32)
    ids = rng.integers(1, vocab, (3, *shape))
    ids[0, 7:] = 0  # padding the mask must hide
    ids[1, 4:] = 0
    return ids


def ported_network(folder, name, model):
    module = importlib.import_module(f"{name}.model")
    network = getattr(module, type(model).__name__)()
    ms.load_param_into_net(network, ms.load_checkpoint(str(folder / name / "weights.ckpt")), strict_load=True)
    network.set_train(False)
    return network


@pytest.mark.parametrize("name", list(CASES))
def test_a_ported_transformer_computes_what_pytorch_computes(name, on_path, capsys):
    """Mutations caught: the position embedding left out of the ported ViT's sum; the padding mask dropped from
    scaled_dot_product_attention (bert: the padded rows differ); einsum's operands swapped."""
    assert port(name, on_path) == 0, capsys.readouterr().out
    assert "agree:" in capsys.readouterr().out
    model = getattr(torch_transformer_models, CASES[name][0])()
    network = ported_network(on_path, name, model)
    assert {p.name for p in network.get_parameters()} - dropout_counters(network) == expected_names(model)

    batch = a_batch(name)
    with torch.no_grad():
        expected = model(torch.from_numpy(batch)).numpy()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    actual = network(ms.Tensor(batch)).asnumpy()
    assert actual.shape == expected.shape
    assert np.max(np.abs(actual - expected)) <= 1e-4 * np.max(np.abs(expected))
