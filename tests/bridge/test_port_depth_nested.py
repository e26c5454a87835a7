"""A depth that lives in a class below the top (torchvision's ``VisionTransformer(num_layers=...)`` hands it to
its ``Encoder``, which builds that many ``EncoderBlock``s): the ported top class takes the argument and hands it
down, and the class below builds its blocks ``for _ in range(...)``, so the ported class built with another depth
takes PyTorch's state_dict of that depth, under its names, and computes what PyTorch's model computes."""
import importlib
import inspect
from collections import OrderedDict

import mindspore as ms
import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from tests.bridge.test_port import dropout_counters, expected_names  # noqa: E402
from tests.bridge.test_port_depth import Residual, agree, with_weights  # noqa: E402
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


class LoopEncoder(nn.Module):
    """The blocks an nn.ModuleList called in a Python loop (which torch.fx unrolls), after a first wider one."""

    def __init__(self, width: int, depth: int):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, width), *[nn.Linear(width, width) for _ in range(depth - 1)]])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return torch.tanh(x)


class Backbone(nn.Module):
    """A class between the top and the blocks: it hands `depth` on to its LoopEncoder."""

    def __init__(self, depth: int):
        super().__init__()
        self.encoder = LoopEncoder(8, depth)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(self.encoder(x))


class ChainNet(nn.Module):
    """depth goes two classes down: ChainNet -> Backbone -> LoopEncoder's ModuleList."""

    def __init__(self, depth: int = 2, seed: int = 0):
        super().__init__()
        self.backbone = Backbone(depth)
        self.head = nn.Linear(8, 3)
        randomised(self, seed)

    def forward(self, features):
        return self.head(self.backbone(features))


class Named(nn.Module):
    """An OrderedDict-built nn.Sequential whose first item has a name of its own (torchvision's DenseNet style)."""

    def __init__(self, depth: int):
        super().__init__()
        self.body = nn.Sequential(OrderedDict([("stem", nn.Linear(4, 8)),
                                               *[(f"block{index}", nn.Linear(8, 8)) for index in range(1, depth)]]))

    def forward(self, x):
        return self.body(x)


class NamedNet(nn.Module):
    def __init__(self, depth: int = 3, seed: int = 0):
        super().__init__()
        self.named = Named(depth)
        self.head = nn.Linear(8, 2)
        randomised(self, seed)

    def forward(self, features):
        return self.head(self.named(features))


class NamedTop(nn.Module):
    """The same at the top: the top class's own OrderedDict of ``depth`` named blocks."""

    def __init__(self, depth: int = 2, seed: int = 0):
        super().__init__()
        self.blocks = nn.Sequential(OrderedDict([(f"block_{index}", nn.Linear(4, 4)) for index in range(depth)]))
        randomised(self, seed)

    def forward(self, features):
        return self.blocks(features)


class WidthBelow(nn.Module):
    """depth sets the head's width in the class below too: it moves more than the blocks, so it stays a literal."""

    def __init__(self, depth: int):
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Linear(4, 4) for _ in range(depth)])
        self.score = nn.Linear(4, depth)

    def forward(self, x):
        return self.score(self.blocks(x))


class WidthBelowNet(nn.Module):
    def __init__(self, depth: int = 2, seed: int = 0):
        super().__init__()
        self.body = WidthBelow(depth)
        randomised(self, seed)

    def forward(self, features):
        return self.body(features)


def torchvision_vit(num_layers: int = 2, num_classes: int = 10, seed: int = 0) -> nn.Module:
    """torchvision's VisionTransformer, small: num_layers goes to its Encoder, whose layers are an
    OrderedDict-built nn.Sequential of EncoderBlocks named encoder_layer_0, encoder_layer_1, ..."""
    vision_transformer = import_zoo()[0].models.vision_transformer
    return randomised(vision_transformer.VisionTransformer(image_size=16, patch_size=8, num_layers=num_layers,
                                                           num_heads=2, hidden_dim=16, mlp_dim=32,
                                                           num_classes=num_classes), seed)


# name: (factory, the top class, the depth's argument, input shape, code the ported classes are written with)
CASES = {
    "stage_net": (StageNet, "StageNet", "depth", (3, 8, 8),
                  ["self.stage = Stage(depth=depth)", "nn.SequentialCell([Residual() for _ in range(depth)])"]),
    "torchvision_vit": (torchvision_vit, "VisionTransformer", "num_layers", (3, 16, 16),
                        ["self.encoder = Encoder(num_layers=num_layers)",
                         'OrderedDict([(f"encoder_layer_{i}", EncoderBlock()) for i in range(num_layers)])']),
    "chain_net": (ChainNet, "ChainNet", "depth", (4,),
                  ["self.backbone = Backbone(depth=depth)", "self.encoder = LoopEncoder(depth=depth)",
                   "[nn.Dense(in_channels=8, out_channels=8, has_bias=True) for _ in range(depth - 1)]",
                   "        for layer in self.layers:\n            x = layer(x)\n"]),
    "named_net": (NamedNet, "NamedNet", "depth", (4,),
                  ["[('stem', nn.Dense(in_channels=4, out_channels=8, has_bias=True))]",
                   '[(f"block{i}", nn.Dense(in_channels=8, out_channels=8, has_bias=True)) for i in range(1, depth)]']),
    "named_top": (NamedTop, "NamedTop", "depth", (4,),
                  ['(f"block_{i}", nn.Dense(in_channels=4, out_channels=4, has_bias=True))\n',
                   "for i in range(depth)]"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_depth_handed_to_a_class_below_builds_that_many_blocks(name, on_path, capsys):
    """Port the model at its default depth d; build the ported model with depth d + 1 from the model config (as
    ``model.depth=3`` would) and load PyTorch's depth-(d + 1) state_dict: every name is PyTorch's and the outputs
    are PyTorch's (PyTorch the reference). Mutations caught: the argument not passed down (instance_call without
    the class's arguments: the class below keeps its default depth), not passed on through a class in between
    (chain_net), the named items' range hard-coded (torchvision_vit, named_net, named_top), OrderedDict items not
    taken as a run (their names differ: the depth stays a literal), the ModuleList below not rolled back into
    its loop (chain_net: the third layer never called)."""
    factory, top, argument, shape, code = CASES[name]
    status = main([f"{__name__}:{factory.__name__}", "--out", str(on_path / name), "--input-shape",
                   ",".join(map(str, shape))])
    printed = capsys.readouterr().out
    assert status == 0, printed
    source = (on_path / name / "model.py").read_text()
    assert all(line in source for line in code), source
    module = importlib.import_module(f"{name}.model")  # the package the model config names
    default = inspect.signature(factory).parameters[argument].default
    assert inspect.signature(getattr(module, top)).parameters[argument].default == default
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = factory(**{argument: default + 1, "seed": 3})
    config = OmegaConf.load(on_path / name / "conf" / "model" / f"{name}.yaml")
    assert config[argument] == default
    network = with_weights(instantiate(config, **{argument: default + 1}), model)
    assert {p.name for p in network.get_parameters()} - dropout_counters(network) == expected_names(model)
    agree(network, model, np.random.default_rng(9).normal(0, 1, (2, *shape)).astype(np.float32))


def test_a_depth_that_moves_more_than_the_blocks_below_stays_a_literal(on_path, capsys):
    """WidthBelow's score layer is depth wide: the class below changes beyond its list, so depth is no argument
    and the blocks are listed."""
    assert main([f"{__name__}:WidthBelowNet", "--out", str(on_path / "width"), "--input-shape", "4"]) == 0, \
        capsys.readouterr().out
    module = importlib.import_module("width.model")
    assert "depth" not in inspect.signature(module.WidthBelowNet).parameters
    assert "range(" not in (on_path / "width" / "model.py").read_text()
