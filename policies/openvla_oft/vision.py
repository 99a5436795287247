"""OpenVLA's vision side: DINOv2 and SigLIP ViTs fused into one patch featurizer, and the image
preprocessing in front of them.

The ViTs are timm's ``VisionTransformer`` re-written in plain torch with the same parameter names,
so the checkpoints' ``vision_backbone.featurizer.*`` / ``fused_featurizer.*`` keys load as they
are (timm itself cannot be imported next to a CPU-only torch: it needs torchvision). One
difference from timm's names is OpenVLA's: LayerScale's ``gamma`` is called ``scale_factor``
(Hugging Face loaders rename keys containing "gamma").

Features are the patch tokens (class and register tokens dropped) of the second-to-last block,
without the final norm, as Prismatic's featurizer returns them; the fused featurizer concatenates
DINOv2's and SigLIP's patches along the channel dim (1024 + 1152 = 2176 for OpenVLA-7B).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nets.errors import BadInput


@dataclass(frozen=True)
class ViTSpec:
    """Shape of one timm ViT tower."""

    image_size: int = 224
    patch_size: int = 14
    embed_dim: int = 1024
    depth: int = 24
    num_heads: int = 16
    mlp_hidden: int = 4096
    class_token: bool = True
    reg_tokens: int = 0
    layer_scale: bool = False  # LayerScale after attention and MLP (DINOv2)
    map_head: bool = False  # attention-pooling head (SigLIP); in the checkpoint, unused for features
    gelu_tanh: bool = False
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)  # per-channel normalization of pixels
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ViTSpec:
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise BadInput(
                f"unknown ViT spec keys {sorted(unknown)}; expected {sorted(cls.__dataclass_fields__)}"
            )
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


# The timm towers OpenVLA's checkpoints name in ``timm_model_ids`` (at their 224 px input size).
TIMM_VITS = {
    "vit_large_patch14_reg4_dinov2.lvd142m": ViTSpec(reg_tokens=4, layer_scale=True),
    "vit_so400m_patch14_siglip_224": ViTSpec(
        embed_dim=1152,
        depth=27,
        num_heads=16,
        mlp_hidden=4304,
        class_token=False,
        map_head=True,
        mean=(0.5, 0.5, 0.5),
        std=(0.5, 0.5, 0.5),
    ),
}


class PatchEmbed(nn.Module):
    def __init__(self, spec: ViTSpec):
        super().__init__()
        self.proj = nn.Conv2d(3, spec.embed_dim, spec.patch_size, spec.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, d // self.num_heads).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, gelu_tanh: bool = False):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh" if gelu_tanh else "none")
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale_factor = nn.Parameter(torch.full((dim,), 1e-5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale_factor


class Block(nn.Module):
    def __init__(self, spec: ViTSpec):
        super().__init__()
        d = spec.embed_dim
        self.norm1 = nn.LayerNorm(d, eps=1e-6)
        self.attn = Attention(d, spec.num_heads)
        self.ls1 = LayerScale(d) if spec.layer_scale else nn.Identity()
        self.norm2 = nn.LayerNorm(d, eps=1e-6)
        self.mlp = Mlp(d, spec.mlp_hidden, spec.gelu_tanh)
        self.ls2 = LayerScale(d) if spec.layer_scale else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class AttentionPool(nn.Module):
    """SigLIP's attention-pooling head (timm ``AttentionPoolLatent``). Its weights are part of the
    checkpoints, so it exists to load them strictly; OpenVLA's features never pass through it."""

    def __init__(self, spec: ViTSpec):
        super().__init__()
        d = spec.embed_dim
        self.latent = nn.Parameter(torch.zeros(1, 1, d))
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.mlp = Mlp(d, spec.mlp_hidden, spec.gelu_tanh)


class VisionTransformer(nn.Module):
    """One timm-named ViT tower; ``forward`` returns the second-to-last block's patch tokens."""

    def __init__(self, spec: ViTSpec):
        super().__init__()
        self.spec = spec
        d = spec.embed_dim
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if spec.class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, spec.reg_tokens, d)) if spec.reg_tokens else None
        self.pos_embed = nn.Parameter(torch.randn(1, spec.num_patches, d) * 0.02)
        self.patch_embed = PatchEmbed(spec)
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.depth))
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.attn_pool = AttentionPool(spec) if spec.map_head else None
        self.num_prefix_tokens = int(spec.class_token) + spec.reg_tokens
        self.apply(_init_weights)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Normalized pixels ``[B, 3, S, S]`` -> patch features ``[B, P, D]``."""
        x = self.patch_embed(pixels) + self.pos_embed  # position embedding on patches only
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        x = torch.cat([*prefix, x], dim=1)
        for block in self.blocks[: len(self.blocks) - 1]:
            x = block(x)
        return x[:, self.num_prefix_tokens :]


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        nn.init.zeros_(module.bias)


class VisionBackbone(nn.Module):
    """``featurizer`` (first tower) and, when fused, ``fused_featurizer`` (second tower).

    ``forward`` takes pixels ``[B, n_images, 3 * n_towers, S, S]`` (each tower's normalization of the
    same image, stacked on channels) and returns patches ``[B, n_images * P, D_1 (+ D_2)]``.
    """

    def __init__(self, specs: list[ViTSpec]):
        super().__init__()
        if len(specs) not in (1, 2):
            raise BadInput(f"expected 1 or 2 vision towers, got {len(specs)}")
        if len({(s.image_size, s.num_patches) for s in specs}) != 1:
            raise BadInput(f"fused towers must share image size and patch grid, got {specs}")
        self.specs = specs
        self.featurizer = VisionTransformer(specs[0])
        self.fused_featurizer = VisionTransformer(specs[1]) if len(specs) == 2 else None
        self.embed_dim = sum(s.embed_dim for s in specs)
        self.image_size = specs[0].image_size
        self.num_patches = specs[0].num_patches

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        b, n = pixels.shape[:2]
        flat = pixels.flatten(0, 1)
        towers = [self.featurizer] + ([self.fused_featurizer] if self.fused_featurizer is not None else [])
        patches = torch.cat([t(flat[:, 3 * i : 3 * i + 3]) for i, t in enumerate(towers)], dim=-1)
        return patches.reshape(b, n * self.num_patches, self.embed_dim)

    def pixel_values(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images ``[B, n, S, S, 3]`` at the towers' size -> normalized pixels
        ``[B, n, 3 * n_towers, S, S]`` in the dtype of the weights."""
        x = images.permute(0, 1, 4, 2, 3).float() / 255.0
        dtype = self.featurizer.pos_embed.dtype
        per_tower = []
        for spec in self.specs:
            mean = torch.tensor(spec.mean, device=x.device)[:, None, None]
            std = torch.tensor(spec.std, device=x.device)[:, None, None]
            per_tower.append((x - mean) / std)
        return torch.cat(per_tower, dim=2).to(dtype)
