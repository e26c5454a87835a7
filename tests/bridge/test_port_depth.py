"""A depth (``depth=2``: how many blocks) becomes an argument of the ported top class, which builds its blocks
``for _ in range(depth)``: the ported class built with another depth takes that PyTorch model's weights, under
their state_dict names, and computes what it computes."""
import importlib
import inspect
import re
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from tests.bridge.test_port import dropout_counters, expected_names  # noqa: E402
from tests.common.torch_port_models import randomised  # noqa: E402
from tests.common.torch_zoo import import_zoo  # noqa: E402
from trainkit.bridge.convert import convert_state_dict  # noqa: E402
from trainkit.bridge.port import main  # noqa: E402
from trainkit.bridge.state_dict import StateDict  # noqa: E402
from trainkit.rundir.weights import load_weights  # noqa: E402


class Attention(nn.Module):
    """timm's: q, k, v from one Linear, unbind, scaled scores by @."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TimmLikeViT(nn.Module):
    """timm's VisionTransformer in small: its blocks an nn.Sequential of ``depth`` Blocks, called as one."""

    def __init__(self, depth: int = 2, embed_dim: int = 16, num_heads: int = 2, num_classes: int = 5, seed: int = 0):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, embed_dim, 4, stride=4)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 5, embed_dim))
        self.blocks = nn.Sequential(*[Block(embed_dim, num_heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes)
        randomised(self, seed)

    def forward(self, images):
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


class LoopViT(TimmLikeViT):
    """The blocks an nn.ModuleList, called in a Python loop (which torch.fx unrolls)."""

    def __init__(self, depth: int = 2, num_classes: int = 5, seed: int = 0):
        super().__init__(depth, num_classes=num_classes, seed=seed)
        self.blocks = nn.ModuleList(list(self.blocks))

    def forward(self, images):
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


class EncoderViT(nn.Module):
    """The guide's TinyViT: PyTorch's nn.TransformerEncoder of ``depth`` layers."""

    def __init__(self, num_classes: int = 10, dim: int = 16, heads: int = 2, depth: int = 2, seed: int = 0):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, 4, stride=4)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.1, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(dim, num_classes)
        randomised(self, seed)

    def forward(self, images):
        return self.head(self.encoder(self.patch_embed(images).flatten(2).transpose(1, 2))[:, 0])


class Down(nn.Module):
    """A residual block that halves the size and doubles the channels (a strided conv, a projected shortcut)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, 2 * channels, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(2 * channels)
        self.shortcut = nn.Conv2d(channels, 2 * channels, 1, stride=2, bias=False)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)) + self.shortcut(x))


class Residual(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(x + self.bn(self.conv(x)))


class StagedNet(nn.Module):
    """A ResNet stage: a first block that downsamples, then ``depth - 1`` identical ones."""

    def __init__(self, depth: int = 2, width: int = 4, num_classes: int = 3, seed: int = 0):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.stage = nn.Sequential(Down(width), *[Residual(2 * width) for _ in range(depth - 1)])
        self.head = nn.Linear(2 * width, num_classes)
        randomised(self, seed)

    def forward(self, images):
        return self.head(self.stage(self.stem(images)).mean((2, 3)))


class WideFirst(nn.Module):
    """Identical blocks at the defaults, but `hidden` is the first one's input only: it goes ahead of the loop."""

    def __init__(self, depth: int = 2, hidden: int = 8, seed: int = 0):
        super().__init__()
        self.embed = nn.Linear(4, hidden)
        self.blocks = nn.Sequential(nn.Linear(hidden, 8), *[nn.Linear(8, 8) for _ in range(depth - 1)])
        self.head = nn.Linear(8, 3)
        randomised(self, seed)

    def forward(self, features):
        return self.head(self.blocks(self.embed(features)))


class ScorePerBlock(nn.Module):
    """The head's width follows `depth` too (a score per block): depth changes more than the run, a literal."""

    def __init__(self, depth: int = 2, seed: int = 0):
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Linear(4, 4) for _ in range(depth)])
        self.head = nn.Linear(4, depth)
        randomised(self, seed)

    def forward(self, features):
        return self.head(self.blocks(features))


class TwoStageNet(nn.Module):
    """ResNet's layout in small: a list argument, one depth per stage; the second stage starts with a Down block."""

    def __init__(self, layers=(2, 2), num_classes: int = 3, seed: int = 0):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.layer1 = nn.Sequential(*[Residual(4) for _ in range(layers[0])])
        self.layer2 = nn.Sequential(Down(4), *[Residual(8) for _ in range(layers[1] - 1)])
        self.head = nn.Linear(8, num_classes)
        randomised(self, seed)

    def forward(self, images):
        return self.head(self.layer2(self.layer1(self.stem(images))).mean((2, 3)))


def torchvision_resnet(layers=(2, 2, 2, 2), num_classes: int = 10, seed: int = 0) -> nn.Module:
    """torchvision's ResNet-18 layout, built from its `layers` list (resnet18() itself takes none)."""
    resnet = import_zoo()[0].models.resnet
    return randomised(resnet.ResNet(resnet.BasicBlock, list(layers), num_classes=num_classes), seed)


class MixedList(nn.Module):
    """sizes[0] is a depth, but sizes[1] a factor forward multiplies by (a literal of construct): the list is
    not an argument, since the ported class could not follow its second item."""

    def __init__(self, sizes=(2, 3), seed: int = 0):
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Linear(4, 4) for _ in range(sizes[0])])
        self.factor = sizes[1]
        randomised(self, seed)

    def forward(self, features):
        return self.blocks(features) * self.factor


def timm_vision_transformer(depth: int = 2, num_classes: int = 10, seed: int = 0) -> nn.Module:
    """timm's own VisionTransformer class, small (its blocks an nn.Sequential, as in TimmLikeViT)."""
    import_zoo()
    from timm.models.vision_transformer import VisionTransformer

    return randomised(VisionTransformer(img_size=16, patch_size=8, embed_dim=16, depth=depth, num_heads=2,
                                        num_classes=num_classes), seed)


# name: (the class, the code its blocks are built and run with in the ported class)
CASES = {
    "timm_like_vit": (TimmLikeViT, ["nn.SequentialCell([Block() for _ in range(depth)])"]),
    "loop_vit": (LoopViT, ["nn.CellList([Block() for _ in range(depth)])",
                           "        for block in self.blocks:\n            x = block(x)\n"]),
    "encoder_vit": (EncoderViT, ["for _ in range(depth)],"]),
    "staged_net": (StagedNet, ["[Residual() for _ in range(depth - 1)]"]),
}


def ported_with(module, top: str, model: nn.Module, **arguments) -> ms.nn.Cell:
    """The ported class built with `arguments`, `model`'s weights loaded the way port loads PyTorch's."""
    return with_weights(getattr(module, top)(**arguments), model)


def with_weights(network: ms.nn.Cell, model: nn.Module) -> ms.nn.Cell:
    """`network` with `model`'s weights loaded the way port loads PyTorch's."""
    state = {name: value.detach().numpy() for name, value in model.state_dict().items()}
    dtypes = {name: str(value.dtype) for name, value in state.items()}
    conversion = convert_state_dict(StateDict(Path("the d+1 model"), state, dtypes), network,
                                    allow_missing=sorted(dropout_counters(network)))
    assert conversion.complete and not conversion.only_in_source, "\n".join(conversion.report())
    load_weights(network, conversion.values, "the d+1 model")
    network.set_train(False)
    return network


def agree(network: ms.nn.Cell, model: nn.Module, inputs: np.ndarray) -> None:
    """`network` computes on `inputs` what PyTorch's `model` does (in eval mode), to NumPy's tolerance."""
    with torch.no_grad():
        expected = model(torch.from_numpy(inputs)).numpy()
    np.testing.assert_allclose(network(ms.Tensor(inputs)).asnumpy(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_the_ported_class_built_with_another_depth_computes_what_pytorch_s_model_of_that_depth_computes(
        name, on_path, capsys):
    """Port the depth-2 model; build the ported class with depth 3, load PyTorch's depth-3 model's weights through
    the port's conversion: every parameter name is the state_dict's and the outputs are PyTorch's. Mutations
    caught: the range hard-coded to the ported model's length (Run.render: range(2); the depth-3 model's weights
    are not all taken), the tail's head dropped (StagedNet: Down lost, names differ), the unrolled CellList calls
    not rolled back into a loop (port_depth.roll a no-op: LoopViT's depth not taken)."""
    factory, code = CASES[name]
    status = main([f"{__name__}:{factory.__name__}", "--out", str(on_path / name), "--input-shape", "3,8,8"])
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert re.search(rf"^{factory.__name__} takes PyTorch's constructor arguments .*depth=2", printed, re.MULTILINE)
    source = (on_path / name / "model.py").read_text()
    compile(source, "model.py", "exec")
    assert all(line in source for line in code)
    assert "depth: 2" in (on_path / name / "conf" / "model" / f"{name}.yaml").read_text()
    module = importlib.import_module(f"{name}.model")
    top = getattr(module, factory.__name__)
    assert inspect.signature(top).parameters["depth"].default == 2
    ms.set_context(mode=ms.PYNATIVE_MODE)
    images = np.random.default_rng(7).normal(0, 1, (3, 3, 8, 8)).astype(np.float32)
    model = factory(depth=3, seed=3)  # d + 1
    network = ported_with(module, factory.__name__, model, depth=3)
    assert {p.name for p in network.get_parameters()} - dropout_counters(network) == expected_names(model)
    agree(network, model, images)


def test_blocks_another_argument_drives_apart_go_ahead_of_the_loop_and_a_depth_that_moves_more_is_a_literal(
        on_path, capsys):
    """WideFirst: `hidden` drives the first block's input only, so the loop repeats the others (range(depth - 1))
    and the class built with depth 3, hidden 16 computes what PyTorch's does. ScorePerBlock: depth also sets the
    head's width, so it stays a literal and the blocks are listed. Mutations caught: port_depth.settle a no-op (every
    block takes `hidden`: the shapes disagree), _walk taking a changed literal as unchanged (depth taken)."""
    assert main([f"{__name__}:WideFirst", "--out", str(on_path / "wide"), "--input-shape", "4"]) == 0, \
        capsys.readouterr().out
    source = (on_path / "wide" / "model.py").read_text()
    first, loop = "nn.Dense(in_channels=hidden, out_channels=8, has_bias=True)", "for _ in range(depth - 1)"
    assert f"[{first}]\n            + [nn.Dense(in_channels=8, out_channels=8, has_bias=True) {loop}])" in source
    module = importlib.import_module("wide.model")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    features = np.random.default_rng(3).normal(0, 1, (5, 4)).astype(np.float32)
    model = WideFirst(depth=3, hidden=16, seed=3)
    network = ported_with(module, "WideFirst", model, depth=3, hidden=16)
    agree(network, model, features)

    assert main([f"{__name__}:ScorePerBlock", "--out", str(on_path / "scores"), "--input-shape", "4"]) == 0
    scores = importlib.import_module("scores.model")
    assert "depth" not in inspect.signature(scores.ScorePerBlock).parameters
    assert "range(" not in (on_path / "scores" / "model.py").read_text()


def test_a_list_argument_drives_one_stage_per_item_and_the_model_config_builds_other_depths(on_path, capsys):
    """layers=(2, 2): each item one stage's depth (the second after its Down block); the model config, built by
    Hydra with layers=[3, 1], takes PyTorch's TwoStageNet(layers=(3, 1)) weights and agrees with it. Mutations
    caught: the items written without their index (port_arguments._followed's `code` = name: range(layers), the
    ported class cannot be built), a list taken though an item moves construct (MixedList: `part is None` ignored,
    sizes taken)."""
    status = main([f"{__name__}:TwoStageNet", "--out", str(on_path / "two_stage"), "--input-shape", "3,8,8"])
    assert status == 0, capsys.readouterr().out
    source = (on_path / "two_stage" / "model.py").read_text()
    assert "for _ in range(layers[0])]" in source and "for _ in range(layers[1] - 1)]" in source
    config = OmegaConf.load(on_path / "two_stage" / "conf" / "model" / "two_stage.yaml")
    assert list(config.layers) == [2, 2]
    ms.set_context(mode=ms.PYNATIVE_MODE)
    images = np.random.default_rng(5).normal(0, 1, (2, 3, 8, 8)).astype(np.float32)
    for layers in ((3, 1), (1, 4)):
        model = TwoStageNet(layers=layers, seed=sum(layers))
        network = with_weights(instantiate(config, layers=list(layers)), model)
        agree(network, model, images)

    assert main([f"{__name__}:MixedList", "--out", str(on_path / "mixed"), "--input-shape", "4"]) == 0
    assert "sizes" not in inspect.signature(importlib.import_module("mixed.model").MixedList).parameters


@pytest.mark.slow
def test_timm_s_vision_transformer_depth_builds_its_blocks(on_path, capsys):
    """timm's VisionTransformer (TimmLikeViT covers its layout fast): depth 3 takes PyTorch's depth-3 weights."""
    status = main([f"{__name__}:timm_vision_transformer", "--out", str(on_path / "timm_vit"), "--input-shape",
                   "3,16,16"])
    assert status == 0, capsys.readouterr().out
    assert "nn.SequentialCell([Block() for _ in range(depth)])" in (on_path / "timm_vit" / "model.py").read_text()
    module = importlib.import_module("timm_vit.model")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = timm_vision_transformer(depth=3, seed=3)
    agree(ported_with(module, "VisionTransformer", model, depth=3), model,
          np.random.default_rng(8).normal(0, 1, (2, 3, 16, 16)).astype(np.float32))


@pytest.mark.slow
def test_torchvision_resnet_layers_drive_its_four_stages(on_path, capsys):
    """torchvision's ResNet(BasicBlock, layers): the ported class built with layers=[3, 1, 2, 1] takes PyTorch's
    weights of that layout and agrees (each later stage: its downsampling block, then range(layers[i] - 1))."""
    status = main([f"{__name__}:torchvision_resnet", "--out", str(on_path / "resnet"), "--input-shape", "3,16,16"])
    assert status == 0, capsys.readouterr().out
    source = (on_path / "resnet" / "model.py").read_text()
    assert "for _ in range(layers[0])]" in source and "for _ in range(layers[3] - 1)]" in source
    module = importlib.import_module("resnet.model")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = torchvision_resnet(layers=(3, 1, 2, 1), seed=4)
    agree(ported_with(module, "ResNet", model, layers=[3, 1, 2, 1]), model,
          np.random.default_rng(6).normal(0, 1, (2, 3, 16, 16)).astype(np.float32))
