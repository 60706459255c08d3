"""hiremate.zoo: small, deterministic models to capture, schedule and test on.

Usage::

    from hiremate import zoo

    model, sample = zoo.get("resnet", layers=2, width=16, batch=4, dtype=torch.float64)
    args, kwargs = zoo.split_sample(sample)      # sample: tensor, tuple of args, or dict of kwargs
    loss = zoo.output_loss(model(*args, **kwargs))
    loss.backward()

``zoo.names()`` lists the models, ``zoo.describe(name)`` says what each argument scales,
``zoo.spec(name).defaults`` gives the defaults. Why a zoo of our own: the tests and benchmarks
of every stage need the same models, small enough that a CPU runs one forward+backward in
milliseconds, scalable when a benchmark wants them large, and built without downloads.

Arguments (each ``None`` takes the model's default):

- ``layers``: depth (transformer layers, blocks per stage, UNet levels, Fourier layers);
  ``resnet`` and ``regnet`` also take a tuple of four stage depths.
- ``width``: hidden size or channels; some models need a multiple (heads, group width).
- ``batch``: batch size, the leading dimension of every input tensor.
- ``dtype``: floating dtype of the parameters and of the floating inputs (float32 default;
  float64 for gradient checks). Token ids stay int64.

An unknown name, a bad value, or an argument the model has no use for raises
:class:`hiremate.errors.ConfigError` naming the valid choices.

Determinism: weights and sample come from ``torch.manual_seed(0)`` inside
``torch.random.fork_rng``, so two calls give identical models and samples and the caller's
random state is untouched. No model uses dropout (probabilities are 0), so two forwards of one
model agree exactly, as recomputation needs. Models are returned in training mode, so BatchNorm
(``resnet``, ``regnet``) updates its running statistics. No activation is in place.

Models and their defaults (the parameter counts are those of the default sizes; how long one
forward+backward takes and how many ATen ops each capture path sees are in docs/graphs.md,
"The zoo at its default sizes"):

=============  ======  =====  =====  =======
name           layers  width  batch  params
=============  ======  =====  =====  =======
mlp            3       64     8      11,082
gpt2           2       64     2      136,960
neox           2       64     2      165,632
vit            2       64     2      114,250
transformer    2       32     2      59,520
unet           2       8      2      27,394
resnet         1       8      2      130,002
regnet         1       16     2      70,218
mlpmixer       2       32     2      52,074
fno1d          4       16     4      18,097
fno3d          3       8      2      41,889
=============  ======  =====  =====  =======

What each model is (and what its arguments scale):

- ``mlp``: Linear/GELU chain, input 32 features, 10 outputs; layers = hidden layers.
- ``gpt2``: transformers ``GPT2LMHeadModel``, lm_head tied to wte, vocabulary 512, 32 tokens,
  4 heads; sample ``{"input_ids": ...}``.
- ``neox``: transformers ``GPTNeoXForCausalLM`` (rotary, parallel residual), same sizes;
  width a multiple of 8 (even head size for the rotary embedding).
- ``vit``: transformers ``ViTForImageClassification``, 32x32 images, 8x8 patches, 10 labels;
  sample ``{"pixel_values": ...}``.
- ``transformer``: ``torch.nn.Transformer`` itself, batch_first, 4 heads, feed-forward 4*width;
  layers = encoder layers = decoder layers; sample ``(src, tgt)`` of 16 and 12 positions.
- ``unet``: double 3x3 conv + GroupNorm + ReLU per level, max-pool down, transposed conv up,
  skip concatenations merged by a 1x1 conv (why: :mod:`hiremate.zoo.unet`); layers = levels;
  images of side max(32, 2**(layers+1)).
- ``resnet``: Bottleneck blocks (expansion 4) in 4 stages, BatchNorm, 3x3 stem on 32x32 images;
  layers = blocks per stage; ``layers=(3, 4, 6, 3), width=64`` is ResNet-50 (23.5M parameters
  with the 10-class head; ``(3, 4, 23, 3)`` is ResNet-101).
- ``regnet``: RegNetY-style blocks: group convolution (group width 8) and squeeze-excitation;
  4 stages; width a multiple of 8.
- ``mlpmixer``: MLP-Mixer on 32x32 images, 4x4 patches (64 tokens).
- ``fno1d``: Fourier Neural Operator on 64 points, 8 modes, input ``(batch, 64, 2)``.
- ``fno3d``: Fourier Neural Operator on an 8x8x8 grid, 3x3x3 modes (four corners),
  input ``(batch, 8, 8, 8, 4)``. Complex weights are pairs of real parameters, and the
  spectrum is zero-filled without in-place writes, so both capture paths work.

Paper sizes: ``zoo.get_paper("gpt-24")`` builds the setting that stands for one model of the
HiRemate paper's broad study (its Table 3), with a forward graph within half to twice the
paper's size; ``zoo.paper_models()`` lists them with the paper's figures
(:mod:`hiremate.zoo.paper`; sizes in docs/graphs.md, "Zoo at the paper's sizes").

Capture: every model exports with ``torch.export.export`` (``strict=False`` and ``strict=True``)
and traces jointly with ``make_fx`` with ``seq_nr`` on every op. The transformers models use
``attn_implementation="eager"`` (plain matmul/softmax ops) and ``use_cache=False``.

Known limit: transformers' eager attention of ViT and GPT-NeoX takes its softmax in float32 even
when the model is float64, so in float64 those two models are exact only to float32 rounding in
the attention probabilities (finite-difference checks need a step of about 1e-5 there).
"""

from __future__ import annotations

from hiremate.zoo import fno, hf, mlp, mlpmixer, regnet, resnet, transformer, unet  # noqa: F401
from hiremate.zoo.paper import PAPER_MODELS, PaperModel, get_paper, paper_model, paper_models
from hiremate.zoo.registry import (
    ModelSpec,
    describe,
    get,
    names,
    output_loss,
    spec,
    split_sample,
)

__all__ = [
    "PAPER_MODELS", "ModelSpec", "PaperModel", "describe", "get", "get_paper", "names",
    "output_loss", "paper_model", "paper_models", "spec", "split_sample",
]
