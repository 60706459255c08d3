"""Hugging Face transformers models built from small configs: ``gpt2``, ``neox``, ``vit``.

No weights are downloaded: each model is created from its config with random weights. Dropout is
set to zero so that the default models are deterministic (a recomputation then gives the very
values of the first computation, which makes gradient checks exact), the KV cache is off (its
objects are not tensors and would only complicate capture), and attention is the ``eager``
implementation: plain matmul/softmax ATen ops, which every capture path handles and whose
memory the cost model can see (the fused SDPA kernels hide their workspace).

``transformers`` is imported only when one of these models is built, since the import alone
is slow.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch
from torch import nn

from hiremate.errors import ConfigError
from hiremate.zoo.registry import register

log = logging.getLogger(__name__)

VOCAB = 512
SEQ_LEN = 32
HEADS = 4
IMAGE = 32
PATCH = 8
NUM_LABELS = 10


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - transformers is a test dependency
        raise ConfigError(
            "this zoo model is built with Hugging Face transformers, which is not installed; "
            "install it with: pip install 'hiremate[zoo]'"
        ) from exc
    _quiet_torchvision()
    return transformers


def _quiet_torchvision() -> None:
    """Import torchvision, when it is installed, with its image-extension warning held back.
    transformers imports it on the first model built, and a torchvision wheel built for
    another torch (timm's, installed beside the CPU torch) warns that its image library does
    not load, which no zoo model uses; the library stays quiet (logging only)."""
    import importlib.util
    import warnings

    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is None:
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Failed to load image Python extension")
        try:
            import torchvision  # noqa: F401
        except Exception as exc:  # a broken torchvision: transformers reports it if it needs it
            log.debug("torchvision does not import (%s)", exc)


def _token_sample(batch: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(0, VOCAB, (batch, SEQ_LEN))}


_LM_MEANING = {
    "layers": "number of transformer layers",
    "width": f"hidden size (model dimension; {HEADS} heads)",
    "batch": f"batch size (sequences of {SEQ_LEN} tokens)",
}


@register(
    "gpt2",
    "transformers GPT2LMHeadModel (tied lm_head/wte), vocabulary 512, 32 tokens",
    defaults={"layers": 2, "width": 64, "batch": 2},
    meaning=_LM_MEANING,
    width_multiple=HEADS,
)
def build_gpt2(layers: int, width: int, batch: int) -> tuple[nn.Module, dict[str, Any]]:
    tf = _transformers()
    config = tf.GPT2Config(
        vocab_size=VOCAB,
        n_positions=max(64, SEQ_LEN),
        n_embd=width,
        n_layer=layers,
        n_head=HEADS,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
        use_cache=False,
        attn_implementation="eager",
    )
    model = tf.GPT2LMHeadModel(config)
    return model, _token_sample(batch)


@register(
    "neox",
    "transformers GPTNeoXForCausalLM (rotary embeddings, parallel residual), 32 tokens",
    defaults={"layers": 2, "width": 64, "batch": 2},
    meaning=_LM_MEANING,
    # head size must be even for the rotary embedding
    width_multiple=2 * HEADS,
)
def build_neox(layers: int, width: int, batch: int) -> tuple[nn.Module, dict[str, Any]]:
    tf = _transformers()
    config = tf.GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        intermediate_size=4 * width,
        max_position_embeddings=max(64, SEQ_LEN),
        rotary_pct=1.0,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
        use_cache=False,
        attn_implementation="eager",
    )
    model = tf.GPTNeoXForCausalLM(config)
    return model, _token_sample(batch)


@register(
    "vit",
    f"transformers ViTForImageClassification, {IMAGE}x{IMAGE} images, {PATCH}x{PATCH} patches",
    defaults={"layers": 2, "width": 64, "batch": 2},
    meaning={
        "layers": "number of transformer layers",
        "width": f"hidden size ({HEADS} heads)",
        "batch": f"batch size (3x{IMAGE}x{IMAGE} images)",
    },
    width_multiple=HEADS,
)
def build_vit(layers: int, width: int, batch: int) -> tuple[nn.Module, dict[str, Any]]:
    tf = _transformers()
    config = tf.ViTConfig(
        image_size=IMAGE,
        patch_size=PATCH,
        num_channels=3,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        intermediate_size=4 * width,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=NUM_LABELS,
        attn_implementation="eager",
    )
    model = tf.ViTForImageClassification(config)
    return model, {"pixel_values": torch.randn(batch, 3, IMAGE, IMAGE)}
