"""Hugging Face models as users build them, sized by keyword: the decision table's models.

The zoo's own ``gpt2``/``neox``/``vit`` fix the sequence length, switch dropout off and pick
the ``eager`` attention so that gradient checks are exact on tiny sizes. The decision table
(``configs/sweeps/decide-*.yaml``) needs the opposite: models at a size where an eager step
takes a tenth of a second on a CPU, with every argument a user leaves alone at its Hugging
Face default (dropout on, the default attention implementation). Each factory returns
``(model, sample)`` for ``hiremate sweep`` (``factory: "hiremate.zoo.sized:gpt2"``), and is
deterministic: weights and sample come from a fixed seed inside ``torch.random.fork_rng``, so
the caller's random state is left as it was.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hiremate.errors import ConfigError
from hiremate.zoo.hf import _transformers
from hiremate.zoo.registry import SEED

def _check(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _seeded(build: Any) -> Any:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return build()


def gpt2(layers: int = 6, width: int = 256, heads: int = 4, seq: int = 256, batch: int = 2,
         vocab: int = 50257) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """``GPT2LMHeadModel`` from ``GPT2Config`` with only the sizes given (dropout 0.1)."""
    _check(layers=layers, width=width, heads=heads, seq=seq, batch=batch, vocab=vocab)
    tf = _transformers()

    def build() -> tuple[nn.Module, dict[str, torch.Tensor]]:
        # the default start/end token (50256) must lie inside a smaller vocabulary
        special = min(50256, vocab - 1)
        config = tf.GPT2Config(vocab_size=vocab, n_positions=max(1024, seq), n_embd=width,
                               n_layer=layers, n_head=heads, bos_token_id=special,
                               eos_token_id=special)
        return (tf.GPT2LMHeadModel(config),
                {"input_ids": torch.randint(0, vocab, (batch, seq))})
    return _seeded(build)


def llama(layers: int = 4, width: int = 256, heads: int = 4, seq: int = 256, batch: int = 2,
          vocab: int = 32000) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """``LlamaForCausalLM`` from ``LlamaConfig`` with only the sizes given (FFN = 8/3 width,
    rounded up to a multiple of 64, as Llama sizes it)."""
    _check(layers=layers, width=width, heads=heads, seq=seq, batch=batch, vocab=vocab)
    tf = _transformers()
    ffn = -(-(8 * width // 3) // 64) * 64

    def build() -> tuple[nn.Module, dict[str, torch.Tensor]]:
        config = tf.LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=ffn,
                                num_hidden_layers=layers, num_attention_heads=heads,
                                max_position_embeddings=max(2048, seq))
        return (tf.LlamaForCausalLM(config),
                {"input_ids": torch.randint(0, vocab, (batch, seq))})
    return _seeded(build)


def vit(layers: int = 6, width: int = 256, heads: int = 4, image: int = 96, patch: int = 8,
        batch: int = 4, labels: int = 10) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """``ViTForImageClassification`` from ``ViTConfig`` with only the sizes given."""
    _check(layers=layers, width=width, heads=heads, image=image, patch=patch, batch=batch,
           labels=labels)
    if image % patch:
        raise ConfigError(f"image size {image} must be a multiple of the patch size {patch}")
    tf = _transformers()

    def build() -> tuple[nn.Module, dict[str, torch.Tensor]]:
        config = tf.ViTConfig(image_size=image, patch_size=patch, hidden_size=width,
                              num_hidden_layers=layers, num_attention_heads=heads,
                              intermediate_size=4 * width, num_labels=labels)
        return (tf.ViTForImageClassification(config),
                {"pixel_values": torch.randn(batch, 3, image, image)})
    return _seeded(build)


__all__ = ["gpt2", "llama", "vit"]
