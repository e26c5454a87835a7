"""Transformers written the way people write them in PyTorch, for the port tests: a ViT with a class token and a
learned position embedding held as ``nn.Parameter``, attention by ``chunk`` and ``einsum``; a BERT-style encoder
over token ids with positions from ``torch.arange``, a padding mask built from the ids, ``split`` and
``F.scaled_dot_product_attention`` with that mask. Beside them, small members of torchvision's and timm's ViT
families. Every weight random (:func:`randomised`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's spelling
from torch import nn

from tests.common.torch_port_models import randomised


class ViTBlock(nn.Module):
    """Pre-norm attention and MLP; q, k, v by chunk, scores by einsum."""

    def __init__(self, dim: int, heads: int, mlp_dim: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_dim)
        self.fc2 = nn.Linear(mlp_dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q = q.reshape(b, n, self.heads, c // self.heads).transpose(1, 2)
        k = k.reshape(b, n, self.heads, c // self.heads).transpose(1, 2)
        v = v.reshape(b, n, self.heads, c // self.heads).transpose(1, 2)
        attn = (torch.einsum("bhid,bhjd->bhij", q, k) * self.scale).softmax(dim=-1)
        out = torch.einsum("bhij,bhjd->bhid", attn, v).transpose(1, 2).reshape(b, n, c)
        x = x + self.drop(self.proj(out))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.norm2(x)))))


class ViT(nn.Module):
    """Patches by a strided convolution, a class token and a learned position embedding (nn.Parameter)."""

    def __init__(self, image_size: int = 16, patch_size: int = 4, in_channels: int = 3, dim: int = 32,
                 depth: int = 2, heads: int = 2, mlp_dim: int = 64, num_classes: int = 10, dropout: float = 0.1,
                 seed: int = 0):
        super().__init__()
        num_patches = (image_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, dim))
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList([ViTBlock(dim, heads, mlp_dim, dropout) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        randomised(self, seed)

    def forward(self, images):
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = self.dropout(torch.cat([cls, x], dim=1) + self.pos_embed)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


class BertLayer(nn.Module):
    """Post-norm; q, k, v by split, attention by F.scaled_dot_product_attention with the padding mask."""

    def __init__(self, dim: int, heads: int, ffn_dim: int, dropout: float):
        super().__init__()
        self.dim, self.heads, self.dropout_p = dim, heads, dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm1 = nn.LayerNorm(dim, eps=1e-12)
        self.ffn1 = nn.Linear(dim, ffn_dim)
        self.ffn2 = nn.Linear(ffn_dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, mask):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).split(self.dim, dim=-1)
        q = q.view(b, n, self.heads, -1).transpose(1, 2)
        k = k.view(b, n, self.heads, -1).transpose(1, 2)
        v = v.view(b, n, self.heads, -1).transpose(1, 2)
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        context = context.transpose(1, 2).reshape(b, n, self.dim)
        x = self.norm1(x + self.dropout(self.out(context)))
        return self.norm2(x + self.dropout(self.ffn2(F.gelu(self.ffn1(x)))))


class BertEncoder(nn.Module):
    """Token ids (0 is padding) -> token + position embeddings (positions by torch.arange) -> layers with the
    padding mask built from the ids -> the first token's pooled state -> a classifier."""

    def __init__(self, vocab_size: int = 50, max_length: int = 16, dim: int = 32, depth: int = 2, heads: int = 2,
                 ffn_dim: int = 64, num_classes: int = 3, pad_id: int = 0, dropout: float = 0.1, seed: int = 0):
        super().__init__()
        self.pad_id = pad_id
        self.tokens = nn.Embedding(vocab_size, dim)
        self.positions = nn.Embedding(max_length, dim)
        self.norm = nn.LayerNorm(dim, eps=1e-12)
        self.layers = nn.ModuleList([BertLayer(dim, heads, ffn_dim, dropout) for _ in range(depth)])
        self.pooler = nn.Linear(dim, dim)
        self.classifier = nn.Linear(dim, num_classes)
        randomised(self, seed)

    def forward(self, ids):
        positions = torch.arange(ids.size(1), device=ids.device).unsqueeze(0).expand(ids.size(0), -1)
        x = self.norm(self.tokens(ids) + self.positions(positions))
        mask = (ids != self.pad_id)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask)
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


def _zoo():
    from tests.common.torch_zoo import import_zoo

    return import_zoo()


def timm_vit(num_classes: int = 10, seed: int = 0) -> nn.Module:
    """timm's vit_tiny_patch16_224 family, built small: 32x32 images, 8x8 patches, two blocks."""
    timm = _zoo()[1]
    return randomised(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8,
                                        depth=2, num_classes=num_classes), seed)


def torchvision_vit(num_classes: int = 10, seed: int = 0) -> nn.Module:
    """torchvision's VisionTransformer, built small."""
    torchvision = _zoo()[0]
    VisionTransformer = torchvision.models.vision_transformer.VisionTransformer  # noqa: N806 - its class
    return randomised(VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                                        mlp_dim=64, num_classes=num_classes), seed)



def torchvision_cnn(name: str = "regnet_y_400mf", num_classes: int = 10, seed: int = 0) -> nn.Module:
    """A torchvision classification model by name (RegNet: nn.Sequential subclasses whose children are named
    ``block1-0``; DenseNet: an OrderedDict of named layers), random throughout."""
    torchvision = _zoo()[0]
    return randomised(getattr(torchvision.models, name)(num_classes=num_classes), seed)


class FunctionalDropoutHead(nn.Module):
    """A head with dropout as timm's heads write it: ``F.dropout(x, p=self.drop_rate, training=self.training)``."""

    def __init__(self, features: int = 8, num_classes: int = 3, drop_rate: float = 0.25):
        super().__init__()
        self.drop_rate = drop_rate
        self.fc1 = nn.Linear(features, 4000)
        self.fc2 = nn.Linear(4000, num_classes)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.dropout(x, p=self.drop_rate, training=self.training)
        return self.fc2(x)


class AuxiliaryHead(nn.Module):
    """A classifier with an auxiliary head it computes in training mode only, as GoogLeNet's and Inception's do."""

    def __init__(self, features: int = 8, num_classes: int = 3):
        super().__init__()
        self.fc = nn.Linear(features, num_classes)
        self.aux = nn.Linear(features, num_classes)

    def forward(self, x):
        out = self.fc(x)
        if self.training:
            return out, self.aux(x)
        return out


class IndexedBias(nn.Module):
    """A bias gathered from a learned table by an index buffer read in forward (``self.index.view(-1)``), as
    MaxViT's relative position bias is."""

    def __init__(self, features: int = 6, num_classes: int = 3):
        super().__init__()
        self.table = nn.Parameter(torch.randn(5, num_classes))
        self.register_buffer("index", torch.tensor([[4, 0], [2, 2], [1, 3]]))
        self.fc = nn.Linear(features, num_classes)

    def forward(self, x):
        bias = self.table[self.index.view(-1)].view(3, 2, -1).sum(1).mean(0)
        return self.fc(x) + bias
