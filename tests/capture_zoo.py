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
blocks ``resnet_block``, ``convnext_block`` and ``vit_block`` rebuild what those models do that
matters to capture (``x += shortcut`` with ``ReLU(inplace=True)``; depthwise conv, channels-last
LayerNorm and layer scale; fused scaled-dot-product attention) without timm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

VOCAB = 128
SEQ = 16
BATCH = 2
WIDTH = 32
HEADS = 4
LAYERS = 2
FFN = 64
IMAGE = 16
PATCH = 4

Built = tuple[nn.Module, Any, Callable[[Any], torch.Tensor]]


class Unavailable(Exception):
    """A case's dependency cannot be imported; the message says which and why."""


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


def _tokens(length: int = SEQ) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, length))


def _pixels(channels: int = 3, size: int = IMAGE) -> torch.Tensor:
    return torch.randn(BATCH, channels, size, size, dtype=torch.float64)


def logits_sum(out: Any) -> torch.Tensor:
    return out.logits.sum()


def last_hidden_sum(out: Any) -> torch.Tensor:
    return out.last_hidden_state.sum()


def model_loss(out: Any) -> torch.Tensor:
    return out.loss


def tensor_sum(out: torch.Tensor) -> torch.Tensor:
    return out.sum()


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


# -- blocks equivalent to the timm models, written here ---------------------------------------

class BasicBlock(nn.Module):
    """timm/torchvision ResNet basic block: ``x += shortcut`` then ``ReLU(inplace=True)``."""

    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.act2 = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.bn2(self.conv2(x))
        x += shortcut
        return self.act2(x)


class ResNetBlocks(nn.Module):
    def __init__(self, c: int = 16, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
                                  nn.ReLU(inplace=True))
        self.blocks = nn.Sequential(BasicBlock(c), BasicBlock(c))
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(x.mean((2, 3)))


class ConvNeXtBlock(nn.Module):
    """timm ConvNeXt block: depthwise 7x7 conv, LayerNorm channels-last, MLP, layer scale,
    residual."""

    def __init__(self, c: int):
        super().__init__()
        self.conv_dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.fc1 = nn.Linear(c, 4 * c)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.conv_dw(x).permute(0, 2, 3, 1)
        x = self.fc2(self.act(self.fc1(self.norm(x))))
        x = x.mul(self.gamma).permute(0, 3, 1, 2)
        return x + shortcut


class ConvNeXtBlocks(nn.Module):
    def __init__(self, c: int = 32, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 4, stride=4)
        self.stem_norm = nn.LayerNorm(c, eps=1e-6)
        self.blocks = nn.Sequential(ConvNeXtBlock(c), ConvNeXtBlock(c))
        self.head_norm = nn.LayerNorm(c, eps=1e-6)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem_norm(self.stem(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        x = self.blocks(x)
        return self.fc(self.head_norm(x.mean((2, 3))))


class VitBlock(nn.Module):
    """timm ViT block: pre-norm attention through ``F.scaled_dot_product_attention`` (timm's
    fused attention), pre-norm GELU MLP, two residuals."""

    def __init__(self, c: int, heads: int = HEADS):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.norm2 = nn.LayerNorm(c)
        self.fc1 = nn.Linear(c, 4 * c)
        self.fc2 = nn.Linear(4 * c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, c))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class VitBlocks(nn.Module):
    def __init__(self, c: int = WIDTH, classes: int = 10):
        super().__init__()
        tokens = (IMAGE // PATCH) ** 2
        self.patch = nn.Conv2d(3, c, PATCH, stride=PATCH)
        self.cls = nn.Parameter(torch.randn(1, 1, c) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, tokens + 1, c) * 0.02)
        self.blocks = nn.Sequential(VitBlock(c), VitBlock(c))
        self.norm = nn.LayerNorm(c)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


def resnet_block() -> Built:
    return ResNetBlocks(), _pixels(), tensor_sum


def convnext_block() -> Built:
    return ConvNeXtBlocks(), _pixels(), tensor_sum


def vit_block() -> Built:
    return VitBlocks(), _pixels(), tensor_sum


# -- recurrent, in-place, checkpointed ------------------------------------------------------

class Recurrent(nn.Module):
    def __init__(self, cell: type[nn.Module]):
        super().__init__()
        self.rnn = cell(WIDTH, WIDTH, num_layers=LAYERS, batch_first=True)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out)


# recurrent layers unroll over time: 3 steps of 2 layers make a graph of some 150 nodes (6
# steps made 305, solved in 35-41 s of the default run; 16 steps made 785, two and a half
# minutes), and the unrolling is the same at any length
RNN_STEPS = 3


def lstm() -> Built:
    return Recurrent(nn.LSTM), torch.randn(BATCH, RNN_STEPS, WIDTH, dtype=torch.float64), \
        tensor_sum


def gru() -> Built:
    return Recurrent(nn.GRU), torch.randn(BATCH, RNN_STEPS, WIDTH, dtype=torch.float64), \
        tensor_sum


class PackedRecurrent(nn.Module):
    """An LSTM over a padded batch of sequences of different lengths, packed as sequence models
    are written (``enforce_sorted=False``), unpacked for a label per step."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(WIDTH, WIDTH, num_layers=LAYERS, batch_first=True)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True,
                                                   enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True,
                                                  total_length=x.shape[1])
        return self.head(out)


def lstm_packed() -> Built:
    x = torch.randn(BATCH + 1, RNN_STEPS + 1, WIDTH, dtype=torch.float64)
    return PackedRecurrent(), (x, torch.tensor([RNN_STEPS - 1, RNN_STEPS + 1, RNN_STEPS])), \
        tensor_sum


def mlp_bn_inplace() -> Built:
    model = nn.Sequential(
        nn.Linear(WIDTH, 2 * WIDTH), nn.BatchNorm1d(2 * WIDTH), nn.ReLU(inplace=True),
        nn.Linear(2 * WIDTH, 2 * WIDTH), nn.BatchNorm1d(2 * WIDTH), nn.ReLU(inplace=True),
        nn.Linear(2 * WIDTH, 10))
    return model, torch.randn(8, WIDTH, dtype=torch.float64), tensor_sum


class ConvBnInplace(nn.Module):
    """Three convs with BatchNorm and ``ReLU(inplace=True)`` and a ``y += h`` residual (found
    infeasible below 92% of the autodiff peak at 34340ab)."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.conv3, self.bn3 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(h)))
        y = self.bn3(self.conv3(y))
        y += h
        y = self.relu(y)
        return self.fc(y.mean((2, 3)))


def conv_bn_inplace() -> Built:
    return ConvBnInplace(), _pixels(), tensor_sum


class Checkpointed(nn.Module):
    """Linear, then a segment under ``torch.utils.checkpoint.checkpoint`` (its input requires
    grad, since it follows the Linear), then a head."""

    def __init__(self, use_reentrant: bool):
        super().__init__()
        self.use_reentrant = use_reentrant
        self.inp = nn.Linear(WIDTH, 2 * WIDTH)
        self.segment = nn.Sequential(nn.Linear(2 * WIDTH, 2 * WIDTH), nn.GELU(),
                                     nn.Linear(2 * WIDTH, 2 * WIDTH), nn.Tanh())
        self.head = nn.Linear(2 * WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        h = torch.utils.checkpoint.checkpoint(self.segment, h, use_reentrant=self.use_reentrant)
        return self.head(h)


def checkpoint_nonreentrant() -> Built:
    return Checkpointed(False), torch.randn(BATCH, SEQ, WIDTH, dtype=torch.float64), tensor_sum


def checkpoint_reentrant() -> Built:
    return Checkpointed(True), torch.randn(BATCH, SEQ, WIDTH, dtype=torch.float64), tensor_sum


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
