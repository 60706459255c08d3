"""The models users bring: one builder per model, for the capture acceptance test
(``tests/test_capture_models.py``) and its table (``bench/capture_models.py``, ``docs/models.md``).

Each builder returns ``(model, sample, loss_fn)``: the model in float64 and training mode, the
sample a user would pass (a tensor, or a dict of keyword arguments: ``input_ids``,
``pixel_values``, ``input_values``...), and ``loss_fn(output) -> scalar``. Sizes are tiny (2
layers, width 32, 4 heads, vocabulary 128, 16 tokens, batch 2) and weights random (no download);
weights and sample come from ``torch.manual_seed(0)`` inside ``torch.random.fork_rng``, so the
caller's random state is untouched and two calls give the same model.

Hugging Face models are built from their config with nothing set that a user would not set
but the sizes (and the special token ids that T5, Whisper and GPT2 need when the vocabulary is
small): default dropout, default cache, default attention implementation, default call
arguments. The loss is ``out.loss`` when the model returns one (T5 with labels), else the sum of
the main output (logits, or ``last_hidden_state``). For CLIP vision it is the sum of
``last_hidden_state`` alone, so the post-layernorm that only feeds ``pooler_output`` gets no
gradient: eager leaves its ``.grad`` None.

timm builders raise :class:`Unavailable` (with the reason) when ``import timm`` fails; the
blocks ``resnet_block``, ``convnext_block`` and ``vit_block`` (in ``capture_zoo_torch.py``, with
the recurrent, in-place and checkpointed models written in plain PyTorch) rebuild what those
models do that matters to capture (``x += shortcut`` with ``ReLU(inplace=True)``; depthwise conv,
channels-last LayerNorm and layer scale; fused scaled-dot-product attention) without timm.
Sizes, sample makers and losses are in ``capture_sizes.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from capture_sizes import (  # noqa: F401  (re-exported: the checks and scratch use cz.*)
    BATCH, FFN, HEADS, IMAGE, LAYERS, PATCH, SEQ, VOCAB, WIDTH, Built, Unavailable, _pixels,
    _tokens, last_hidden_sum, logits_sum, model_loss, tensor_sum,
)
from capture_zoo_torch import (
    checkpoint_nonreentrant, checkpoint_reentrant, conv_bn_inplace, convnext_block, gru, lstm,
    lstm_packed, mlp_bn_inplace, resnet_block, vit_block,
)


@dataclass(frozen=True)
class Case:
    """One model of the table.

    ``expect``: for a case whose right outcome is an error, the error class name and a
    regular expression its message must match (e.g. Wav2Vec2 with LayerDrop). ``slow``: left out
    of the default test run. ``fast_config``: overrides that the default run passes to
    ``HRockmate`` (slow cases and the benchmark use the default preset).
    """

    name: str
    build: Callable[[], Built]
    what: str
    slow: bool = True
    expect: tuple[str, str] | None = None
    fast_config: dict | None = None


def _seeded(builder: Callable[[], Built]) -> Callable[[], Built]:
    def build() -> Built:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model, sample, loss_fn = builder()
        return model.to(torch.float64).train(), sample, loss_fn
    build.__name__ = builder.__name__
    build.__doc__ = builder.__doc__
    return build



def _tf() -> Any:
    import transformers  # a test dependency; the import takes seconds, so only when needed

    return transformers


# -- Hugging Face causal language models -----------------------------------------------------

def _token_model(model_class: str, config_class: str, **config: Any) -> Built:
    """A transformers model built from its config class with ``config``, on token ids, with
    the sum of its logits as the loss."""
    tf = _tf()
    model = getattr(tf, model_class)(getattr(tf, config_class)(**config))
    return model, {"input_ids": _tokens()}, logits_sum


def llama() -> Built:
    return _token_model("LlamaForCausalLM", "LlamaConfig",
                        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN,
                        num_hidden_layers=LAYERS, num_attention_heads=HEADS)


def mistral() -> Built:
    return _token_model("MistralForCausalLM", "MistralConfig",
                        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN,
                        num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                        num_key_value_heads=HEADS)


def qwen2() -> Built:
    return _token_model("Qwen2ForCausalLM", "Qwen2Config",
                        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN,
                        num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                        num_key_value_heads=HEADS)


def opt() -> Built:
    return _token_model("OPTForCausalLM", "OPTConfig",
                        vocab_size=VOCAB, hidden_size=WIDTH, ffn_dim=FFN,
                        num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                        word_embed_proj_dim=WIDTH)


def bloom() -> Built:
    return _token_model("BloomForCausalLM", "BloomConfig",
                        vocab_size=VOCAB, hidden_size=WIDTH, n_layer=LAYERS, n_head=HEADS)


def gpt_neox() -> Built:
    return _token_model("GPTNeoXForCausalLM", "GPTNeoXConfig",
                        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN,
                        num_hidden_layers=LAYERS, num_attention_heads=HEADS)


def gpt2() -> Built:
    return _token_model("GPT2LMHeadModel", "GPT2Config",
                        vocab_size=VOCAB, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS,
                        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)


def falcon() -> Built:
    """Falcon's rotary embedding indexes some dimensions only (``x[..., idx]``): its backward is
    an ``index_put`` whose index list holds None, which the executor once called wrongly."""
    return _token_model("FalconForCausalLM", "FalconConfig",
                        vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=LAYERS,
                        num_attention_heads=HEADS)


def gemma() -> Built:
    return _token_model("GemmaForCausalLM", "GemmaConfig",
                        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN,
                        num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                        num_key_value_heads=HEADS, head_dim=WIDTH // HEADS)


# -- Hugging Face encoders, encoder-decoders, vision and audio ------------------------------

def deberta_v2() -> Built:
    return _token_model("DebertaV2ForMaskedLM", "DebertaV2Config",
                        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN,
                        num_hidden_layers=LAYERS, num_attention_heads=HEADS)


def bart() -> Built:
    tf = _tf()
    cfg = tf.BartConfig(vocab_size=VOCAB, d_model=WIDTH, encoder_layers=LAYERS,
                        decoder_layers=LAYERS, encoder_attention_heads=HEADS,
                        decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN)
    sample = {"input_ids": _tokens(), "labels": _tokens()}
    return tf.BartForConditionalGeneration(cfg), sample, model_loss


def swin() -> Built:
    tf = _tf()
    cfg = tf.SwinConfig(image_size=2 * IMAGE, patch_size=PATCH, embed_dim=16, depths=[1, 1],
                        num_heads=[2, 2], window_size=PATCH, num_labels=10)
    return tf.SwinForImageClassification(cfg), {"pixel_values": _pixels(size=2 * IMAGE)}, \
        logits_sum


def patchtst() -> Built:
    """PatchTST's BatchNorm runs on a transposed input and its result is reshaped: CPU
    ``native_batch_norm`` lays its result out otherwise than its fake tensor, and the build's
    real run once failed on the view the trace recorded for that reshape."""
    tf = _tf()
    cfg = tf.PatchTSTConfig(num_input_channels=3, context_length=32, patch_length=8,
                            patch_stride=8, prediction_length=8, d_model=WIDTH,
                            num_attention_heads=HEADS, num_hidden_layers=LAYERS, ffn_dim=FFN)
    sample = {"past_values": torch.randn(BATCH, 32, 3, dtype=torch.float64),
              "future_values": torch.randn(BATCH, 8, 3, dtype=torch.float64)}
    return tf.PatchTSTForPrediction(cfg), sample, model_loss


def videomae() -> Built:
    """VideoMAE slices its position table, a plain attribute that the trace records as a
    constant of the program (the grouping once ended in a KeyError on it)."""
    tf = _tf()
    cfg = tf.VideoMAEConfig(image_size=IMAGE, patch_size=PATCH, num_frames=4, tubelet_size=2,
                            hidden_size=WIDTH, num_hidden_layers=LAYERS,
                            num_attention_heads=HEADS, intermediate_size=FFN)
    video = torch.randn(BATCH, 4, 3, IMAGE, IMAGE, dtype=torch.float64)
    return tf.VideoMAEModel(cfg), {"pixel_values": video}, last_hidden_sum


def bert_mlm() -> Built:
    return _token_model("BertForMaskedLM", "BertConfig",
                        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN,
                        num_hidden_layers=LAYERS, num_attention_heads=HEADS)


def t5() -> Built:
    tf = _tf()
    cfg = tf.T5Config(vocab_size=VOCAB, d_model=WIDTH, d_kv=WIDTH // HEADS, d_ff=FFN,
                      num_layers=LAYERS, num_heads=HEADS, decoder_start_token_id=0)
    sample = {"input_ids": _tokens(), "labels": _tokens()}
    return tf.T5ForConditionalGeneration(cfg), sample, model_loss


def whisper() -> Built:
    tf = _tf()
    mels, frames = 16, 2 * SEQ  # the encoder's two convs halve the frames to max_source_positions
    cfg = tf.WhisperConfig(vocab_size=VOCAB, num_mel_bins=mels, d_model=WIDTH,
                           encoder_layers=LAYERS, decoder_layers=LAYERS,
                           encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                           encoder_ffn_dim=FFN, decoder_ffn_dim=FFN,
                           max_source_positions=SEQ, max_target_positions=SEQ,
                           pad_token_id=VOCAB - 1, bos_token_id=VOCAB - 2,
                           eos_token_id=VOCAB - 1, decoder_start_token_id=VOCAB - 2)
    sample = {"input_features": torch.randn(BATCH, mels, frames, dtype=torch.float64),
              "decoder_input_ids": _tokens(SEQ // 2)}
    return tf.WhisperForConditionalGeneration(cfg), sample, logits_sum


def vit() -> Built:
    tf = _tf()
    cfg = tf.ViTConfig(hidden_size=WIDTH, intermediate_size=FFN, num_hidden_layers=LAYERS,
                       num_attention_heads=HEADS, image_size=IMAGE, patch_size=PATCH)
    return tf.ViTForImageClassification(cfg), {"pixel_values": _pixels()}, logits_sum


def clip_vision() -> Built:
    tf = _tf()
    cfg = tf.CLIPVisionConfig(hidden_size=WIDTH, intermediate_size=FFN,
                              num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                              image_size=IMAGE, patch_size=PATCH)
    return tf.CLIPVisionModel(cfg), {"pixel_values": _pixels()}, last_hidden_sum


def _wav2vec2(model_class: str = "Wav2Vec2Model", **extra: Any) -> Built:
    tf = _tf()
    # three feature-extractor convs (total stride 20): 400 samples give 19 frames
    cfg = tf.Wav2Vec2Config(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN,
                            num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                            conv_dim=(WIDTH,) * 3, conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2),
                            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                            **extra)
    sample = {"input_values": torch.randn(BATCH, 400, dtype=torch.float64)}
    return getattr(tf, model_class)(cfg), sample, last_hidden_sum


def wav2vec2() -> Built:
    """Wav2Vec2 with ``layerdrop=0`` and ``mask_time_prob=0``: what the capture errors tell users
    to set (LayerDrop is a random branch; SpecAugment draws its masks with numpy)."""
    return _wav2vec2(layerdrop=0.0, mask_time_prob=0.0)


def wav2vec2_ctc() -> Built:
    """Wav2Vec2 fine-tuned for speech recognition: the CTC loss on labels padded with -100, as
    a data collator pads them (the loss flattens them with ``masked_select``)."""
    model, sample, _ = _wav2vec2("Wav2Vec2ForCTC", layerdrop=0.0, mask_time_prob=0.0)
    labels = torch.randint(1, VOCAB, (BATCH, 6))
    labels[1, 4:] = -100
    return model, {**sample, "labels": labels}, model_loss


def wav2vec2_specaugment() -> Built:
    """Wav2Vec2 with ``layerdrop=0`` and its default SpecAugment (``mask_time_prob=0.05``, masks
    drawn with numpy): capture must refuse, naming ``mask_time_prob``."""
    return _wav2vec2(layerdrop=0.0)


def wav2vec2_layerdrop() -> Built:
    """Wav2Vec2 with its default LayerDrop (0.1): capture must refuse, naming ``layerdrop``."""
    return _wav2vec2()


# -- timm (skipped with the reason when timm cannot be imported) ----------------------------

def _timm(name: str, **kwargs: Any) -> nn.Module:
    try:
        import timm
    except Exception as exc:  # ImportError, or a broken torchvision under it
        raise Unavailable(f"timm cannot be imported ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''})") from exc
    return timm.create_model(name, pretrained=False, **kwargs)


def timm_resnet18() -> Built:
    return _timm("resnet18", num_classes=10), _pixels(size=32), tensor_sum


def timm_vit_tiny() -> Built:
    model = _timm("vit_tiny_patch16_224", num_classes=10, img_size=32, patch_size=8)
    return model, _pixels(size=32), tensor_sum


def timm_convnext_atto() -> Built:
    return _timm("convnext_atto", num_classes=10), _pixels(size=32), tensor_sum


def timm_efficientnet_b0() -> Built:
    return _timm("efficientnet_b0", num_classes=10), _pixels(size=32), tensor_sum




# -- the table ----------------------------------------------------------------------------------

# What the default test run passes to HRockmate for its cases (H-ILP at its root on subgraphs
# of at most 40 compute nodes, hilp-top 10 branch-and-bound nodes: work limits, so that the
# schedule does not depend on the machine's load; rk-Rotor 100 slots, one process, menus of
# three peaks at the lowest save, no FastSA polish: these cases check what capture and the
# executor give, not how good the schedule is); slow cases and bench/capture_models.py use
# the default preset as it is.
FAST = {"n_jobs": 1, "progress": False, "menu_peaks": 3, "menu_saves": 1, "polish": [],
        "solver_params": {"hilp": {"work_limit": 1, "large_work_limit": 1, "max_nodes": 40},
                          "rk-rotor": {"slots": 100}, "hilp-top": {"work_limit": 10}}}


def _case(name: str, builder: Callable[[], Built], what: str, default_run: bool = False,
          **kw: Any) -> Case:
    """``default_run``: in the default test run, with :data:`FAST` (else ``slow``)."""
    if default_run:
        kw.update(slow=False, fast_config=FAST)
    return Case(name, _seeded(builder), what, **kw)


CASES: list[Case] = [
    _case("llama", llama, "transformers LlamaForCausalLM"),
    _case("mistral", mistral, "transformers MistralForCausalLM"),
    _case("qwen2", qwen2, "transformers Qwen2ForCausalLM"),
    _case("opt", opt, "transformers OPTForCausalLM"),
    _case("bloom", bloom, "transformers BloomForCausalLM"),
    _case("gpt_neox", gpt_neox, "transformers GPTNeoXForCausalLM"),
    _case("gpt2", gpt2, "transformers GPT2LMHeadModel"),
    _case("falcon", falcon, "transformers FalconForCausalLM"),
    _case("gemma", gemma, "transformers GemmaForCausalLM"),
    _case("bert_mlm", bert_mlm, "transformers BertForMaskedLM"),
    _case("deberta_v2", deberta_v2, "transformers DebertaV2ForMaskedLM"),
    _case("bart", bart, "transformers BartForConditionalGeneration, with labels"),
    _case("t5", t5, "transformers T5ForConditionalGeneration, with labels"),
    _case("whisper", whisper, "transformers WhisperForConditionalGeneration"),
    _case("vit", vit, "transformers ViTForImageClassification", default_run=True),
    _case("clip_vision", clip_vision, "transformers CLIPVisionModel, loss on last_hidden_state"),
    _case("swin", swin, "transformers SwinForImageClassification (32x32, window 4)"),
    _case("patchtst", patchtst, "transformers PatchTSTForPrediction, with future values"),
    _case("videomae", videomae, "transformers VideoMAEModel (4 frames), loss on "
          "last_hidden_state"),
    _case("wav2vec2", wav2vec2, "transformers Wav2Vec2Model, layerdrop=0, mask_time_prob=0"),
    _case("wav2vec2_ctc", wav2vec2_ctc,
          "transformers Wav2Vec2ForCTC with padded labels (CTC loss)", default_run=True),
    _case("wav2vec2_specaugment", wav2vec2_specaugment,
          "transformers Wav2Vec2Model, layerdrop=0, default SpecAugment: GraphCaptureError "
          "naming mask_time_prob", default_run=True,
          expect=("GraphCaptureError", r"mask_time_prob")),
    _case("wav2vec2_layerdrop", wav2vec2_layerdrop,
          "transformers Wav2Vec2Model, default LayerDrop: GraphCaptureError naming layerdrop",
          default_run=True, expect=("GraphCaptureError", r"(?i)layerdrop")),
    _case("timm_resnet18", timm_resnet18, "timm resnet18"),
    _case("timm_vit_tiny", timm_vit_tiny, "timm vit_tiny_patch16_224 (32x32, patch 8)"),
    _case("timm_convnext_atto", timm_convnext_atto, "timm convnext_atto"),
    _case("timm_efficientnet_b0", timm_efficientnet_b0, "timm efficientnet_b0"),
    _case("resnet_block", resnet_block, "2 ResNet basic blocks: x += shortcut, ReLU(inplace)",
          default_run=True),
    _case("convnext_block", convnext_block, "2 ConvNeXt blocks: dw conv, LN, MLP, layer scale",
          default_run=True),
    _case("vit_block", vit_block, "2 ViT blocks with F.scaled_dot_product_attention",
          default_run=True),
    _case("lstm", lstm, "nn.LSTM (2 layers, batch_first) + Linear", default_run=True),
    _case("gru", gru, "nn.GRU (2 layers, batch_first) + Linear"),
    _case("lstm_packed", lstm_packed,
          "nn.LSTM (2 layers) on pack_padded_sequence, lengths as a tensor, unsorted"),
    _case("mlp_bn_inplace", mlp_bn_inplace, "MLP with BatchNorm1d and ReLU(inplace=True)",
          default_run=True),
    _case("conv_bn_inplace", conv_bn_inplace, "3 convs + BatchNorm + ReLU(inplace) + y += h",
          default_run=True),
    _case("checkpoint_nonreentrant", checkpoint_nonreentrant,
          "segment under checkpoint(use_reentrant=False)", default_run=True),
    _case("checkpoint_reentrant", checkpoint_reentrant,
          "segment under checkpoint(use_reentrant=True)", default_run=True),
]

def get(name: str) -> Case:
    for case in CASES:
        if case.name == name:
            return case
    raise KeyError(f"no capture case {name!r}; cases: {', '.join(c.name for c in CASES)}")
