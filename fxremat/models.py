"""Small bundled models: the demo's GPT and the test/benchmark zoo.

Each ``make_*`` returns ``(model, example_batch)``; the step under test is
``model(*batch)`` returning a scalar loss.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float = 0.0):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        # Explicit attention (not SDPA) so every op is visible to the partitioner.
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        att = F.dropout(att, self.dropout, self.training)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float = 0.0):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.dropout = dropout

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + F.dropout(self.mlp(self.ln2(x)), self.dropout, self.training)


class GPT(nn.Module):
    """A small GPT-style language model (token + position embeddings, pre-LN blocks)."""

    def __init__(self, vocab: int = 256, dim: int = 128, heads: int = 4, layers: int = 4,
                 seq: int = 64, dropout: float = 0.0):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class MaskedBlock(nn.Module):
    """A pre-LN block reading an attention mask made once by its model (SDPA)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for y in self.qkv(self.ln1(x)).split(d, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class PaddedGPT(nn.Module):
    """A GPT laid out as Hugging Face models are: the model builds one attention mask
    from the token ids (causal and padding, with indexing ops) and every block reads
    it; attention is SDPA (tagged random for its dropout, here 0). ``pad`` ids are
    masked out as keys."""

    def __init__(self, vocab: int = 256, dim: int = 64, heads: int = 4, layers: int = 4, seq: int = 32,
                 pad: int = 0):
        super().__init__()
        self.pad = pad
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(MaskedBlock(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx, targets):
        t = idx.shape[1]
        positions = torch.arange(t, device=idx.device)
        # Gathered from a table, as Hugging Face's mask builders index theirs: not an op
        # fxremat may recompute freely, so the mask is a value made once per step.
        table = torch.ones(t, t, dtype=torch.bool, device=idx.device).tril()
        causal = table[positions[:, None], positions[None, :]]  # (t, t)
        keys = (idx != self.pad)[:, None, None, :]  # (b, 1, 1, t)
        mask = causal[None, None] & keys
        mask = mask | torch.eye(t, dtype=torch.bool, device=idx.device)  # a padded query still sees itself
        x = self.tok(idx) + self.pos(positions)
        for block in self.blocks:
            x = block(x, mask)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class TransformerStack(nn.Module):
    """Transformer blocks on continuous inputs, with a mean-squared loss."""

    def __init__(self, dim: int = 64, heads: int = 4, layers: int = 2, dropout: float = 0.0):
        super().__init__()
        self.blocks = nn.Sequential(*(Block(dim, heads, dropout) for _ in range(layers)))

    def forward(self, x, y):
        return F.mse_loss(self.blocks(x), y)


class MLP(nn.Module):
    def __init__(self, dims=(64, 256, 256, 10)):
        super().__init__()
        layers: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        self.net = nn.Sequential(*layers[:-1])

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


class CNN(nn.Module):
    """Conv + batchnorm + ReLU stages and a linear classifier."""

    def __init__(self, channels=(3, 16, 32), classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = []
        for a, b in zip(channels[:-1], channels[1:]):
            layers += [nn.Conv2d(a, b, 3, padding=1), nn.BatchNorm2d(b), nn.ReLU(), nn.MaxPool2d(2)]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(channels[-1], classes)

    def forward(self, x, y):
        h = self.features(x).mean(dim=(2, 3))
        return F.cross_entropy(self.fc(h), y)


class InplaceNet(nn.Module):
    """In-place ops in the forward (mul_, add_, relu_), as users write them."""

    def __init__(self, dim: int = 32):
        super().__init__()
        self.a = nn.Linear(dim, dim)
        self.b = nn.Linear(dim, dim)

    def forward(self, x, y):
        h = self.a(x)
        h.mul_(0.5).add_(1.0)
        h.relu_()
        g = torch.tanh(self.b(h)) * h
        g.add_(h)
        return F.mse_loss(g, y)


class Bottleneck(nn.Module):
    """A ResNet-50 bottleneck block: 1x1, 3x3 (stride), 1x1 convolutions with batch norms,
    and a 1x1 downsample branch when the shape changes."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.down = None
        if stride != 1 or inplanes != out:
            self.down = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        return F.relu(h + (x if self.down is None else self.down(x)))


class UNet(nn.Module):
    """A small U-Net: each encoder level's output is carried across the bottleneck
    to the decoder level of the same resolution (long skips, concatenated). ``norm=False``
    drops the group norms: issue #27's U-Net (convolution, SiLU, convolution, SiLU)."""

    def __init__(self, channels=(3, 16, 32, 64), norm: bool = True):
        super().__init__()

        def stage(a, b):
            normed = [nn.GroupNorm(4, b)] if norm else []
            return nn.Sequential(nn.Conv2d(a, b, 3, padding=1), *normed, nn.SiLU(),
                                 nn.Conv2d(b, b, 3, padding=1), nn.SiLU())

        pairs = list(zip(channels[1:-1], channels[2:]))  # (skip channels, channels below)
        self.down = nn.ModuleList(stage(a, b) for a, b in zip(channels[:-1], channels[1:]))
        self.up = nn.ModuleList(stage(below + skip, skip) for skip, below in reversed(pairs))
        self.head = nn.Conv2d(channels[1], channels[0], 1)

    def forward(self, x, y):
        skips = []
        h = x
        for stage in self.down[:-1]:
            h = stage(h)
            skips.append(h)
            h = F.max_pool2d(h, 2)
        h = self.down[-1](h)
        for stage in self.up:
            h = F.interpolate(h, scale_factor=2.0, mode="nearest")
            h = stage(torch.cat([h, skips.pop()], dim=1))
        return F.mse_loss(self.head(h), y)


class PreLNBlock(nn.Module):
    """A pre-LN transformer block with PyTorch's fused attention (SDPA): causal in a
    decoder, not in a ViT (``bench/frontier_models.py``)."""

    def __init__(self, dim: int, heads: int, causal: bool = True):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class Decoder(nn.Module):
    """An ordinary decoder-only language model, written as a user would (not tuned for
    fxremat): token and position embeddings, pre-LN blocks with SDPA causal attention, a
    final layer norm and a head tied to the token embedding. ``checkpoint_blocks`` wraps
    every block in ``torch.utils.checkpoint`` (per-block checkpointing, the peer of issue #26)."""

    def __init__(self, vocab: int = 256, dim: int = 64, heads: int = 4, layers: int = 16, seq: int = 256,
                 checkpoint_blocks: bool = False):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(PreLNBlock(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.checkpoint_blocks = checkpoint_blocks

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            if self.checkpoint_blocks:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.ln(x) @ self.tok.weight.t()  # the head tied to the embedding
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def make_gpt(batch: int = 8, seq: int = 64, vocab: int = 256, **kw):
    model = GPT(vocab=vocab, seq=seq, **kw)
    idx = torch.randint(0, vocab, (batch, seq))
    return model, (idx, torch.roll(idx, -1, dims=1))


def make_decoder(batch: int = 8, seq: int = 256, vocab: int = 256, **kw):
    """Issue #26's decoder: 16 layers, width 64, 4 heads, sequence 256, batch 8 by default."""
    model = Decoder(vocab=vocab, seq=seq, **kw)
    idx = torch.randint(0, vocab, (batch, seq))
    return model, (idx, torch.roll(idx, -1, dims=1))


def make_padded_gpt(batch: int = 4, seq: int = 32, vocab: int = 256, **kw):
    model = PaddedGPT(vocab=vocab, seq=seq, **kw)
    idx = torch.randint(1, vocab, (batch, seq))
    idx[:, seq - seq // 4:] = 0  # padding at the end of each row
    return model, (idx, torch.roll(idx, -1, dims=1))


def make_transformer(batch: int = 4, seq: int = 16, dim: int = 64, **kw):
    model = TransformerStack(dim=dim, **kw)
    return model, (torch.randn(batch, seq, dim), torch.randn(batch, seq, dim))


def make_mlp(batch: int = 32):
    model = MLP()
    return model, (torch.randn(batch, 64), torch.randint(0, 10, (batch,)))


def make_cnn(batch: int = 4, size: int = 16):
    model = CNN()
    return model, (torch.randn(batch, 3, size, size), torch.randint(0, 10, (batch,)))


def make_inplace(batch: int = 16, dim: int = 32):
    model = InplaceNet(dim)
    return model, (torch.randn(batch, dim), torch.randn(batch, dim))


def make_deep_cnn(batch: int = 4, size: int = 32, depth: int = 8, width: int = 16):
    """A deep plain CNN: ``depth`` conv + batchnorm + ReLU layers at full resolution."""
    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, padding=1)]
    for _ in range(depth):
        layers += [nn.BatchNorm2d(width), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1)]
    model = _Classifier(nn.Sequential(*layers), width)
    return model, (torch.randn(batch, 3, size, size), torch.randint(0, 10, (batch,)))


class _Classifier(nn.Module):
    def __init__(self, features: nn.Module, width: int, classes: int = 10):
        super().__init__()
        self.features = features
        self.fc = nn.Linear(width, classes)

    def forward(self, x, y):
        return F.cross_entropy(self.fc(self.features(x).mean(dim=(2, 3))), y)


def make_unet(batch: int = 2, size: int = 32):
    model = UNet()
    return model, (torch.randn(batch, 3, size, size), torch.randn(batch, 3, size, size))


ZOO = {
    "mlp": make_mlp,
    "transformer": make_transformer,
    "cnn": make_cnn,
    "inplace": make_inplace,
    "unet": make_unet,
    "deep_cnn": make_deep_cnn,
    "gpt": make_gpt,
    "decoder": make_decoder,
    "padded_gpt": make_padded_gpt,
}
