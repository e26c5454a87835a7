"""A depth that lives in a class below the top (torchvision's ``VisionTransformer(num_layers=...)`` hands it to
its ``Encoder``, which builds that many ``EncoderBlock``s): the ported top class takes the argument and hands it
down, and the class below builds its blocks ``for _ in range(...)``, so the ported class built with another depth
takes PyTorch's state_dict of that depth, under its names, and computes what PyTorch's model computes."""
import importlib
import inspect

import mindspore as ms
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from tests.bridge.test_port import dropout_counters, expected_names  # noqa: E402
from tests.bridge.test_port_depth import Residual, agree, ported_with  # noqa: E402
from tests.common.torch_port_models import randomised  # noqa: E402
from tests.common.torch_zoo import import_zoo  # noqa: E402
from trainkit.bridge.port import main  # noqa: E402


class Stage(nn.Module):
    """timm's stage classes in small: the depth is this class's argument, its blocks an nn.Sequential."""

    def __init__(self, width: int, depth: int):
        super().__init__()
        self.norm = nn.BatchNorm2d(width)
        self.blocks = nn.Sequential(*[Residual(width) for _ in range(depth)])

    def forward(self, x):
        return self.blocks(self.norm(x))


class StageNet(nn.Module):
    """The top class hands `depth` to its Stage."""

    def __init__(self, depth: int = 2, num_classes: int = 3, seed: int = 0):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.stage = Stage(4, depth)
        self.head = nn.Linear(4, num_classes)
        randomised(self, seed)

    def forward(self, images):
        return self.head(self.stage(self.stem(images)).mean((2, 3)))


def torchvision_vit(num_layers: int = 2, num_classes: int = 10, seed: int = 0) -> nn.Module:
    """torchvision's VisionTransformer, small: num_layers goes to its Encoder, whose layers are an
    OrderedDict-built nn.Sequential of EncoderBlocks named encoder_layer_0, encoder_layer_1, ..."""
    vision_transformer = import_zoo()[0].models.vision_transformer
    return randomised(vision_transformer.VisionTransformer(image_size=16, patch_size=8, num_layers=num_layers,
                                                           num_heads=2, hidden_dim=16, mlp_dim=32,
                                                           num_classes=num_classes), seed)


# name: (factory, the top class, the depth's argument, input shape)
CASES = {
    "stage_net": (StageNet, "StageNet", "depth", (3, 8, 8)),
    "torchvision_vit": (torchvision_vit, "VisionTransformer", "num_layers", (3, 16, 16)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_depth_handed_to_a_class_below_builds_that_many_blocks(name, on_path, capsys):
    """Port the depth-2 model; build the ported top class with depth 3 and load PyTorch's depth-3 state_dict:
    every name is PyTorch's and the outputs are PyTorch's (PyTorch the reference)."""
    factory, top, argument, shape = CASES[name]
    status = main([f"{__name__}:{factory.__name__}", "--out", str(on_path / name), "--input-shape",
                   ",".join(map(str, shape))])
    printed = capsys.readouterr().out
    assert status == 0, printed
    module = importlib.import_module(f"{name}.model")
    assert inspect.signature(getattr(module, top)).parameters[argument].default == 2, \
        (on_path / name / "model.py").read_text()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = factory(**{argument: 3, "seed": 3})
    network = ported_with(module, top, model, **{argument: 3})
    assert {p.name for p in network.get_parameters()} - dropout_counters(network) == expected_names(model)
    agree(network, model, np.random.default_rng(9).normal(0, 1, (2, *shape)).astype(np.float32))
