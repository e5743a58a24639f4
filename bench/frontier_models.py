"""Models of the benchmark frontier (``bench/frontier.py``), at three scales.

    build("gpt2", "small") -> FrontierModel(model, batch, chain, block_lists)

Every model's ``forward(*batch)`` returns a scalar loss (random weights, seed set by the
caller). Scales: ``tiny`` (the ``--quick`` smoke run, seconds per compile), ``small`` (the
default: minutes in all on a 2-core CPU), ``gpu`` (the published architectures' sizes, for a
GPU: GPT-2 small, BERT-base, a 16-layer Llama, ResNet-50/101 at 224², a 4-level U-Net at
256², ViT-B/16, a 32 × 4096 MLP).

- ``gpt2``, ``bert``, ``llama``: Hugging Face ``transformers`` models built from a config
  (``GPT2LMHeadModel``, ``BertForMaskedLM``, ``LlamaForCausalLM``; offline, random weights,
  ``use_cache=False``, dropout 0 so every strategy computes the same loss; attention is the
  library's default, SDPA). Need ``pip install transformers``.
- ``resnet50``, ``resnet101``: bottleneck ResNets ([3, 4, 6, 3] and [3, 4, 23, 3] blocks) with
  batchnorm; the ``small``/``tiny`` scales narrow the base width and use a 3×3 stem.
- ``unet``: ``fxremat.models.UNet`` (long skips across the bottleneck: not a chain); sizes
  ``{"channels": [3, 16, 32, 64], "image": 96, "batch": 8, "norm": false}`` are issue #27's U-Net.
- ``vit``: a ViT (patch embedding, class token, pre-LN blocks with SDPA attention).
- ``mlp``: a deep MLP of Linear + ReLU blocks.
- ``decoder``: ``fxremat.models.Decoder``, an ordinary decoder-only language model not tuned for
  fxremat (pre-LN, SDPA causal attention, head tied to the embedding); ``small`` is issue #26's
  16 layers, width 64, sequence 256, batch 8.
- ``UNSEEN``: Hugging Face architectures outside the zoo, built as a new user would (random
  weights, dropout 0, ``use_cache=False``), to check fxremat's promises on models it was not
  tuned for: ``t5`` (``T5ForConditionalGeneration``: encoder and decoder stacks, cross
  attention, a relative position bias made in the first layer and read by the others),
  ``gpt_neox`` (parallel attention and MLP residuals, partial rotary embeddings), ``phi``,
  ``qwen2`` (grouped-query attention), ``opt``, ``bloom`` (ALiBi position biases), ``falcon``
  (parallel attention and MLP, one key and value head), ``gptj`` (interleaved rotary embeddings
  on part of each head), ``mistral`` (sliding-window attention), ``gemma`` (GeGLU, tied head) and
  ``bart`` (encoder and decoder, learned positions). Tiny and small scales only; no chain.
- ``UNSEEN_VISION``: Hugging Face's image classifiers, likewise (``hf_resnet``: a bottleneck
  ResNet; ``hf_convnext``: depthwise 7x7 convolutions, layer norms over permuted channels;
  ``hf_regnet``: grouped convolutions, squeeze-and-excitation; ``hf_mobilenet_v2``: inverted
  residuals, ReLU6), two stages of widths 16 and 32 (MobileNetV2: its depth multiplier), 32x32
  images. Tiny scale only; no chain.
- ``transformer``: ``fxremat.models.TransformerStack`` (pre-LN blocks with explicit attention,
  whose seq² scores dominate the activations; continuous inputs, mean-squared loss): the
  activation-heavy transformer of issue #4.

``chain``: where the model's blocks form a chain (each block's output is the next block's
first input, with the same other arguments), ``(owner, attribute)`` of that container;
``sequential`` says it is an ``nn.Sequential`` called with one tensor, which
``torch.utils.checkpoint.checkpoint_sequential`` takes as is. ``block_lists``: containers whose
items are the blocks that per-block checkpointing wraps.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from fxremat.models import Bottleneck, PreLNBlock  # the blocks the tests use too

SCALES = ("tiny", "small", "gpu")
HF_MODELS = ("gpt2", "bert", "llama")
MODELS = ("gpt2", "bert", "llama", "resnet50", "resnet101", "unet", "vit", "mlp", "transformer", "decoder")
ENCODER_DECODER = ("t5", "bart")
UNSEEN = ("t5", "gpt_neox", "phi", "qwen2", "opt", "bloom", "falcon", "gptj", "mistral", "gemma", "bart")
UNSEEN_VISION = ("hf_resnet", "hf_convnext", "hf_regnet", "hf_mobilenet_v2")
# (not the frontier's zoo: see the module docstring)


@dataclasses.dataclass
class FrontierModel:
    model: nn.Module
    batch: tuple
    chain: tuple[nn.Module, str] | None  # (owner, attribute) of the chain container
    sequential: bool  # the chain is an nn.Sequential called with one tensor
    block_lists: list[nn.Module]  # ModuleList / Sequential containers of blocks
    sizes: dict

    @property
    def blocks(self) -> list[nn.Module]:
        return [b for container in self.block_lists for b in container]


# --- sizes -----------------------------------------------------------------------------

SIZES: dict[str, dict[str, dict]] = {
    "gpt2": {
        "tiny": dict(layers=2, dim=64, heads=4, seq=32, batch=2, vocab=256),
        "small": dict(layers=4, dim=128, heads=4, seq=128, batch=4, vocab=512),
        "gpu": dict(layers=12, dim=768, heads=12, seq=1024, batch=8, vocab=50257),
    },
    "bert": {
        "tiny": dict(layers=2, dim=64, heads=4, seq=32, batch=2, vocab=256),
        "small": dict(layers=4, dim=128, heads=4, seq=128, batch=4, vocab=512),
        "gpu": dict(layers=12, dim=768, heads=12, seq=512, batch=16, vocab=30522),
    },
    "llama": {
        "tiny": dict(layers=2, dim=64, heads=4, kv_heads=2, ffn=172, seq=32, batch=2, vocab=256),
        "small": dict(layers=4, dim=128, heads=4, kv_heads=2, ffn=344, seq=128, batch=4, vocab=512),
        "gpu": dict(layers=16, dim=1024, heads=16, kv_heads=4, ffn=2816, seq=2048, batch=4, vocab=32000),
    },
    "resnet50": {
        "tiny": dict(depths=(1, 1, 1, 1), width=4, image=16, batch=2, classes=10),
        "small": dict(depths=(3, 4, 6, 3), width=8, image=32, batch=8, classes=10),
        "gpu": dict(depths=(3, 4, 6, 3), width=64, image=224, batch=64, classes=1000),
    },
    "resnet101": {
        "tiny": dict(depths=(1, 1, 2, 1), width=4, image=16, batch=2, classes=10),
        "small": dict(depths=(3, 4, 23, 3), width=8, image=32, batch=4, classes=10),
        "gpu": dict(depths=(3, 4, 23, 3), width=64, image=224, batch=64, classes=1000),
    },
    "unet": {
        "tiny": dict(channels=(3, 8, 16), image=16, batch=2),
        "small": dict(channels=(3, 16, 32, 64, 128), image=64, batch=4),
        "gpu": dict(channels=(3, 64, 128, 256, 512), image=256, batch=8),
    },
    "vit": {
        "tiny": dict(layers=2, dim=64, heads=4, patch=8, image=32, batch=2, classes=10),
        "small": dict(layers=6, dim=128, heads=4, patch=8, image=64, batch=8, classes=10),
        "gpu": dict(layers=12, dim=768, heads=12, patch=16, image=224, batch=64, classes=1000),
    },
    # Issue #4's activation-heavy configuration is layers=12, dim=512, heads=8, seq=512, batch=8
    # (--sizes '{"transformer": {...}}'); "small" is a quarter of its depth and a fraction of its width.
    "transformer": {
        "tiny": dict(layers=2, dim=64, heads=4, seq=32, batch=2),
        "small": dict(layers=6, dim=128, heads=4, seq=256, batch=4),
        "gpu": dict(layers=24, dim=1024, heads=16, seq=1024, batch=8),
    },
    "decoder": {
        "tiny": dict(layers=2, dim=32, heads=2, seq=32, batch=2, vocab=256),
        "small": dict(layers=16, dim=64, heads=4, seq=256, batch=8, vocab=256),
        "gpu": dict(layers=24, dim=1024, heads=16, seq=2048, batch=8, vocab=32000),
    },
    # The same sizes for each (T5, BART: that many encoder and as many decoder blocks, 2 of each when tiny).
    **{name: {"tiny": dict(layers=2 if name in ENCODER_DECODER else 3, dim=32, heads=4, ffn=64, seq=16, batch=2, vocab=128),
              "small": dict(layers=4, dim=128, heads=4, ffn=344, seq=128, batch=4, vocab=512)}
       for name in UNSEEN},
    **{name: {"tiny": dict(width=16, image=32, batch=4, classes=10)} for name in UNSEEN_VISION},
    "mlp": {
        "tiny": dict(layers=4, width=32, batch=256, classes=10),
        "small": dict(layers=16, width=256, batch=2048, classes=10),
        "gpu": dict(layers=32, width=4096, batch=4096, classes=1000),
    },
}


def build(name: str, scale: str = "small", overrides: dict | None = None) -> FrontierModel:
    sizes = dict(SIZES[name][scale])
    sizes.update(overrides or {})
    return _with_sizes(_BUILDERS[name](**sizes), sizes)


def _with_sizes(m: FrontierModel, sizes: dict) -> FrontierModel:
    m.sizes = {k: list(v) if isinstance(v, tuple) else v for k, v in sizes.items()}
    return m


# --- Hugging Face ------------------------------------------------------------------------


class HFLoss(nn.Module):
    """``forward(inputs, labels) -> loss`` around a Hugging Face model, ``inputs`` handed to it as
    ``keyword`` (``input_ids``; an image classifier's ``pixel_values``)."""

    def __init__(self, hf: nn.Module, keyword: str = "input_ids"):
        super().__init__()
        self.hf = hf
        self.keyword = keyword

    def forward(self, inputs, labels):
        return self.hf(**{self.keyword: inputs}, labels=labels).loss


def _hf_batch(batch: int, seq: int, vocab: int):
    ids = torch.randint(0, vocab, (batch, seq))
    return ids, ids.clone()  # the models shift causal labels themselves; BERT predicts every token


def _quiet_hf():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def make_gpt2(layers, dim, heads, seq, batch, vocab) -> FrontierModel:
    _quiet_hf()
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=layers, n_embd=dim, n_head=heads, n_positions=seq, vocab_size=vocab,
                        bos_token_id=0, eos_token_id=0, use_cache=False,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf = GPT2LMHeadModel(config)
    h = hf.transformer.h
    return FrontierModel(HFLoss(hf), _hf_batch(batch, seq, vocab), (hf.transformer, "h"), False, [h], {})


def make_bert(layers, dim, heads, seq, batch, vocab) -> FrontierModel:
    _quiet_hf()
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(num_hidden_layers=layers, hidden_size=dim, num_attention_heads=heads,
                        intermediate_size=4 * dim, max_position_embeddings=seq, vocab_size=vocab, use_cache=False,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    hf = BertForMaskedLM(config)
    layer = hf.bert.encoder.layer
    return FrontierModel(HFLoss(hf), _hf_batch(batch, seq, vocab), (hf.bert.encoder, "layer"), False, [layer], {})


def make_llama(layers, dim, heads, kv_heads, ffn, seq, batch, vocab) -> FrontierModel:
    _quiet_hf()
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=layers, hidden_size=dim, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, intermediate_size=ffn, max_position_embeddings=seq,
                         vocab_size=vocab, use_cache=False, attention_dropout=0.0,
                         bos_token_id=0, eos_token_id=0, pad_token_id=None)
    hf = LlamaForCausalLM(config)
    layers_ = hf.model.layers
    return FrontierModel(HFLoss(hf), _hf_batch(batch, seq, vocab), (hf.model, "layers"), False, [layers_], {})


def make_unseen_hf(name: str, layers, dim, heads, ffn, seq, batch, vocab, use_cache: bool = False) -> FrontierModel:
    """One of ``UNSEEN``, from its config as a new user would write it; ``use_cache``: the
    library's default for most of them (True), under which the forward also returns each
    layer's keys and values."""
    _quiet_hf()
    import transformers as t

    common = dict(vocab_size=vocab, hidden_size=dim, num_hidden_layers=layers, num_attention_heads=heads,
                  max_position_embeddings=max(seq, 64), use_cache=use_cache)
    if name == "t5":  # ``layers`` encoder blocks and as many decoder blocks
        hf = t.T5ForConditionalGeneration(t.T5Config(
            vocab_size=vocab, d_model=dim, d_kv=dim // heads, d_ff=ffn, num_layers=layers, num_decoder_layers=layers,
            num_heads=heads, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, use_cache=use_cache))
        stacks = [hf.encoder.block, hf.decoder.block]
    elif name == "gpt_neox":
        hf = t.GPTNeoXForCausalLM(t.GPTNeoXConfig(intermediate_size=ffn, hidden_dropout=0.0, attention_dropout=0.0,
                                                  **common))
        stacks = [hf.gpt_neox.layers]
    elif name == "phi":
        hf = t.PhiForCausalLM(t.PhiConfig(intermediate_size=ffn, resid_pdrop=0.0, embd_pdrop=0.0,
                                          attention_dropout=0.0, **common))
        stacks = [hf.model.layers]
    elif name == "qwen2":
        hf = t.Qwen2ForCausalLM(t.Qwen2Config(intermediate_size=ffn, num_key_value_heads=max(heads // 2, 1), **common))
        stacks = [hf.model.layers]
    elif name == "bloom":
        hf = t.BloomForCausalLM(t.BloomConfig(vocab_size=vocab, hidden_size=dim, n_layer=layers, n_head=heads,
                                              hidden_dropout=0.0, attention_dropout=0.0, use_cache=use_cache))
        stacks = [hf.transformer.h]
    elif name == "falcon":
        hf = t.FalconForCausalLM(t.FalconConfig(hidden_dropout=0.0, attention_dropout=0.0, **common))
        stacks = [hf.transformer.h]
    elif name == "gptj":  # rotary embeddings on a quarter of each head
        hf = t.GPTJForCausalLM(t.GPTJConfig(vocab_size=vocab, n_embd=dim, n_layer=layers, n_head=heads,
                                            n_inner=ffn, n_positions=max(seq, 64), rotary_dim=max(dim // heads // 4, 2),
                                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=use_cache))
        stacks = [hf.transformer.h]
    elif name == "mistral":  # a window of half the sequence
        hf = t.MistralForCausalLM(t.MistralConfig(intermediate_size=ffn, num_key_value_heads=max(heads // 2, 1),
                                                  sliding_window=max(seq // 2, 1), **common))
        stacks = [hf.model.layers]
    elif name == "gemma":
        hf = t.GemmaForCausalLM(t.GemmaConfig(intermediate_size=ffn, num_key_value_heads=max(heads // 2, 1),
                                              head_dim=dim // heads, **common))
        stacks = [hf.model.layers]
    elif name == "bart":  # ``layers`` encoder blocks and as many decoder blocks
        hf = t.BartForConditionalGeneration(t.BartConfig(
            vocab_size=vocab, d_model=dim, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads,
            decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, max_position_embeddings=max(seq, 64),
            dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, use_cache=use_cache))
        stacks = [hf.model.encoder.layers, hf.model.decoder.layers]
    elif name == "opt":
        hf = t.OPTForCausalLM(t.OPTConfig(ffn_dim=ffn, word_embed_proj_dim=dim, dropout=0.0, attention_dropout=0.0,
                                          **common))
        stacks = [hf.model.decoder.layers]
    else:
        raise KeyError(f"unknown unseen model {name!r}: one of {UNSEEN}")
    return FrontierModel(HFLoss(hf), _hf_batch(batch, seq, vocab), None, False, stacks, {})


# --- ResNet ---------------------------------------------------------------------------------


class ResNet(nn.Module):
    def __init__(self, depths, width: int, classes: int, large_stem: bool):
        super().__init__()
        if large_stem:  # 7x7 stride 2 + max pool, for 224x224 images
            self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
        else:
            self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        blocks, inplanes = [], width
        for i, depth in enumerate(depths):
            planes = width * 2**i
            for j in range(depth):
                blocks.append(Bottleneck(inplanes, planes, stride=2 if (i > 0 and j == 0) else 1))
                inplanes = planes * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(inplanes, classes)

    def forward(self, x, y):
        h = self.blocks(self.stem(x))
        return F.cross_entropy(self.fc(h.mean(dim=(2, 3))), y)


def _make_resnet(depths, width, image, batch, classes) -> FrontierModel:
    model = ResNet(depths, width, classes, large_stem=image >= 128)
    data = (torch.randn(batch, 3, image, image), torch.randint(0, classes, (batch,)))
    return FrontierModel(model, data, (model, "blocks"), True, [model.blocks], {})


make_resnet50 = _make_resnet
make_resnet101 = _make_resnet


# --- U-Net ------------------------------------------------------------------------------------


def make_unet(channels, image, batch, norm=True) -> FrontierModel:
    from fxremat.models import UNet

    model = UNet(tuple(channels), norm)
    data = (torch.randn(batch, 3, image, image), torch.randn(batch, 3, image, image))
    return FrontierModel(model, data, None, False, [model.down, model.up], {})


# --- ViT --------------------------------------------------------------------------------------


class ViT(nn.Module):
    def __init__(self, layers, dim, heads, patch, image, classes):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        tokens = (image // patch) ** 2 + 1
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        self.blocks = nn.Sequential(*(PreLNBlock(dim, heads, causal=False) for _ in range(layers)))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x, y):
        h = self.patch(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1) + self.pos
        h = self.ln(self.blocks(h))
        return F.cross_entropy(self.head(h[:, 0]), y)


def make_vit(layers, dim, heads, patch, image, batch, classes) -> FrontierModel:
    model = ViT(layers, dim, heads, patch, image, classes)
    data = (torch.randn(batch, 3, image, image), torch.randint(0, classes, (batch,)))
    return FrontierModel(model, data, (model, "blocks"), True, [model.blocks], {})


# --- deep MLP ---------------------------------------------------------------------------------


class DeepMLP(nn.Module):
    def __init__(self, layers, width, classes):
        super().__init__()
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(layers)))
        self.head = nn.Linear(width, classes)

    def forward(self, x, y):
        return F.cross_entropy(self.head(self.blocks(x)), y)


def make_mlp(layers, width, batch, classes) -> FrontierModel:
    model = DeepMLP(layers, width, classes)
    data = (torch.randn(batch, width), torch.randint(0, classes, (batch,)))
    return FrontierModel(model, data, (model, "blocks"), True, [model.blocks], {})


# --- plain transformer ------------------------------------------------------------------------


def make_transformer(layers, dim, heads, seq, batch) -> FrontierModel:
    from fxremat.models import TransformerStack

    model = TransformerStack(dim=dim, heads=heads, layers=layers)
    data = (torch.randn(batch, seq, dim), torch.randn(batch, seq, dim))
    return FrontierModel(model, data, (model, "blocks"), True, [model.blocks], {})


def make_decoder(layers, dim, heads, seq, batch, vocab) -> FrontierModel:
    from fxremat.models import make_decoder as make

    model, data = make(batch=batch, seq=seq, vocab=vocab, layers=layers, dim=dim, heads=heads)
    return FrontierModel(model, data, (model, "blocks"), False, [model.blocks], {})


def make_unseen_hf_vision(name: str, width: int, image: int, batch: int, classes: int) -> FrontierModel:
    """One of ``UNSEEN_VISION``, from its config as a new user would write it (random weights,
    training mode). Hugging Face sets ``config.problem_type`` in the first call, so Dynamo
    compiles the model a second time (the same graph and plan)."""
    import transformers as tf

    torch.manual_seed(0)
    stages = dict(hidden_sizes=[width, 2 * width], depths=[1, 1])
    if name == "hf_resnet":
        hf = tf.ResNetForImageClassification(tf.ResNetConfig(
            num_channels=3, embedding_size=width, layer_type="bottleneck", num_labels=classes, **stages))
    elif name == "hf_convnext":
        hf = tf.ConvNextForImageClassification(tf.ConvNextConfig(
            num_channels=3, num_stages=2, image_size=image, num_labels=classes, **stages))
    elif name == "hf_regnet":
        hf = tf.RegNetForImageClassification(tf.RegNetConfig(
            num_channels=3, embedding_size=width, groups_width=width // 2, num_labels=classes, **stages))
    elif name == "hf_mobilenet_v2":
        hf = tf.MobileNetV2ForImageClassification(tf.MobileNetV2Config(
            num_channels=3, image_size=image, depth_multiplier=width / 64, num_labels=classes))
    else:
        raise KeyError(f"unknown unseen vision model {name!r}: one of {UNSEEN_VISION}")
    batch_ = (torch.randn(batch, 3, image, image), torch.randint(0, classes, (batch,)))
    return FrontierModel(HFLoss(hf.train(), "pixel_values"), batch_, None, False, [], {})


_BUILDERS = {
    "gpt2": make_gpt2, "bert": make_bert, "llama": make_llama, "resnet50": make_resnet50,
    "resnet101": make_resnet101, "unet": make_unet, "vit": make_vit, "mlp": make_mlp,
    "transformer": make_transformer, "decoder": make_decoder,
    **{name: functools.partial(make_unseen_hf, name) for name in UNSEEN},
    **{name: functools.partial(make_unseen_hf_vision, name) for name in UNSEEN_VISION},
}
