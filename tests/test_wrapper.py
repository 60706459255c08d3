"""HRockmate drops in for the model it wraps: the model's state-dict and parameter names (both
ways), the model's parameters (an optimizer on the wrapper trains the model), the model's
attributes and mode, and the model's plain forward where no backward can follow."""

from __future__ import annotations

import copy
import inspect
import io
import logging

import pytest
import torch
from torch import nn

from hiremate import HRockmate
from hiremate.config import Config
from test_model_untouched import FAST, assert_grads_match, snapshot
from test_model_untouched import one_thread  # noqa: F401 (an autouse fixture)


class Net(nn.Module):
    """Parameters at the root and in nested children, a buffer, dropout (the mode matters), and
    a plain attribute and a method that the wrapper does not define."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.Tanh()), nn.Dropout(0.3),
                                  nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 4)
        self.gain = nn.Parameter(torch.ones(4))
        self.register_buffer("offset", torch.zeros(4))
        self.note = "a user attribute"

    def forward(self, x):
        return self.head(self.body(x)) * self.gain + self.offset

    def describe(self) -> str:
        return f"Net with {sum(p.numel() for p in self.parameters())} parameters"


# the solver does not matter here, the wrapper does: TW-Remat alone solves in a blink
QUICK = {**FAST, "flat": ["twremat"], "calibrate": 0}


def new_net(seed: int) -> Net:
    torch.manual_seed(seed)
    return Net().double()


@pytest.fixture(scope="module")
def built():
    model = new_net(0)
    x = torch.randn(5, 8, dtype=torch.float64)
    return HRockmate(model, x, 0.7, **QUICK), x


@pytest.fixture
def rm(built):
    """A wrapper of its own (a deep copy: its own model, sharing with it as the original)."""
    return copy.deepcopy(built[0])


@pytest.fixture
def x(built):
    return built[1]


def counting(rm: HRockmate) -> list[int]:
    """Calls of the schedule's executor, counted."""
    calls: list[int] = []
    rm.executor.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def train_step(module: nn.Module, x: torch.Tensor, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    loss = module(x).square().sum()
    loss.backward()
    return loss.detach()


# -- names and state ------------------------------------------------------------------------------
def test_state_dict_and_parameter_names_are_the_models(rm, tmp_path):
    model = rm.wrapped_model
    assert list(rm.state_dict()) == list(model.state_dict())
    assert "body.0.0.weight" in rm.state_dict() and "gain" in rm.state_dict()
    # the same tensors, not copies: an optimizer on the wrapper trains the model
    assert list(dict(rm.named_parameters())) == list(dict(model.named_parameters()))
    assert all(p is q for p, q in zip(rm.parameters(), model.parameters()))
    assert [n for n, _ in rm.named_buffers()] == [n for n, _ in model.named_buffers()]
    assert dict(rm.named_children()).keys() == dict(model.named_children()).keys()
    # a checkpoint saved from the wrapper loads into a plain model, strictly
    torch.save(rm.state_dict(), tmp_path / "ckpt.pt")
    plain = new_net(5)
    plain.load_state_dict(torch.load(tmp_path / "ckpt.pt"), strict=True)
    for (name, a), b in zip(plain.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_plain_checkpoint_loads_into_the_wrapper_and_changes_what_it_computes(rm, x):
    other = new_net(7)
    before = train_step(rm, x, seed=3)
    result = rm.load_state_dict(other.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    for p, q in zip(rm.wrapped_model.parameters(), other.parameters()):
        p.grad = None
        assert torch.equal(p, q)
    calls = counting(rm)
    ours = train_step(rm, x, seed=3)
    assert calls == [1]  # through the schedule
    ref = train_step(other, x, seed=3)
    assert not torch.equal(ours, before)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=0)
    assert_grads_match(rm.wrapped_model, other)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        rm.load_state_dict({**other.state_dict(), "executor.model.gain": other.gain})


def test_an_optimizer_on_the_wrappers_parameters_trains_the_model_as_eager(rm, x):
    model = rm.wrapped_model
    eager = copy.deepcopy(model)
    calls = counting(rm)
    opt = torch.optim.Adam(rm.parameters(), lr=1e-2)
    opt_eager = torch.optim.Adam(eager.parameters(), lr=1e-2)
    for step in range(3):
        for o in (opt, opt_eager):
            o.zero_grad(set_to_none=True)
        ours, ref = train_step(rm, x, step), train_step(eager, x, step)
        torch.testing.assert_close(ours, ref, rtol=1e-12, atol=0)
        opt.step()
        opt_eager.step()
    assert calls == [1, 1, 1]
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=0, msg=name)
    assert not torch.equal(model.head.weight, new_net(0).head.weight)  # it did train


def test_building_adds_nothing_to_the_model_and_changes_nothing():
    model = new_net(1)
    before = snapshot(model)
    attrs = dict(vars(model))
    children = dict(model.named_children())
    h = HRockmate(model, torch.randn(5, 8, dtype=torch.float64), 1.0, **QUICK)
    assert vars(model).keys() == attrs.keys()
    assert dict(model.named_children()) == children  # the executor is not registered there
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert h.wrapped_model is model and h.executor.model is model


def test_a_wrapper_inside_another_module_keeps_the_models_names(rm, x):
    outer = nn.Module()
    outer.body = rm
    keys = list(outer.state_dict())
    assert keys == [f"body.{k}" for k in rm.wrapped_model.state_dict()]
    assert [n for n, _ in outer.named_parameters()] == [
        f"body.{n}" for n, _ in rm.wrapped_model.named_parameters()]
    other = new_net(9)
    outer.load_state_dict({f"body.{k}": v for k, v in other.state_dict().items()}, strict=True)
    assert torch.equal(rm.wrapped_model.head.weight, other.head.weight)


# -- attributes -----------------------------------------------------------------------------------
def test_attributes_fall_through_to_the_model(rm):
    model = rm.wrapped_model
    assert rm.note == "a user attribute" and rm.describe() == model.describe()
    assert rm.head is model.head and rm.gain is model.gain and rm.offset is model.offset
    assert isinstance(rm.hiremate_config, Config)
    assert rm.graph is not None and rm.report()["budget"] > 0  # the wrapper's own
    rm.note = "changed"  # written on the model, read back through it
    assert model.note == "changed" and "note" not in vars(rm)
    rm.extra = 3
    assert model.extra == 3
    rm._bookkeeping = 1  # a new private name stays on the wrapper
    assert "_bookkeeping" in vars(rm) and not hasattr(model, "_bookkeeping")
    del rm.extra
    assert not hasattr(model, "extra") and not hasattr(rm, "extra")
    with pytest.raises(AttributeError, match="no_such_thing"):
        rm.no_such_thing
    # special names are the wrapper's: copy.deepcopy(rm) must not find a model's __deepcopy__
    model.__deepcopy__ = lambda memo: "the model's copy"
    assert getattr(rm, "__deepcopy__", None) is None
    del model.__deepcopy__
    assert "describe" in dir(rm) and "report" in dir(rm)
    assert inspect.signature(rm.forward) == inspect.signature(model.forward)


def test_module_methods_act_on_the_model(rm, x):
    model = rm.wrapped_model
    assert rm.float() is rm and model.gain.dtype == model.offset.dtype == torch.float32
    rm.double()
    seen: list[nn.Module] = []
    assert rm.apply(seen.append) is rm
    assert seen[-1] is model and len(seen) == len(list(model.modules()))
    assert all(m is not rm for m in seen)
    assert rm.get_submodule("body.0.0") is model.body[0][0]
    train_step(rm, x, 1)
    rm.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())


# -- mode -----------------------------------------------------------------------------------------
def test_train_and_eval_are_the_models(rm):
    model = rm.wrapped_model
    assert rm.eval() is rm
    assert not rm.training and not model.training
    assert all(not m.training for m in model.modules())
    rm.train()
    assert rm.training and all(m.training for m in model.modules())
    model.eval()  # the other way round: the wrapper's flag is the model's
    assert not rm.training


@pytest.mark.parametrize("how", ["eval", "no_grad", "inference_mode"])
def test_eval_and_no_grad_run_the_plain_forward(rm, x, how):
    model = rm.wrapped_model
    eager = copy.deepcopy(model)
    calls = counting(rm)
    if how == "eval":
        rm.eval()
        eager.eval()
    context = {"eval": torch.enable_grad, "no_grad": torch.no_grad,
               "inference_mode": torch.inference_mode}[how]
    with context():
        torch.manual_seed(4)
        ours = rm(x)
        rng = torch.get_rng_state()
        torch.manual_seed(4)
        ref = eager(x)
    assert torch.equal(ours, ref)  # the model's own forward: identical, dropout included
    assert torch.equal(rng, torch.get_rng_state())
    assert calls == []
    if how == "eval":  # autograd still works, as on the model
        ours.sum().backward()
        ref.sum().backward()
        assert_grads_match(model, eager)
    rm.train()
    train_step(rm, x, 5)
    assert calls == [1]


def test_another_mode_than_at_build_runs_the_plain_forward_and_says_so(x, caplog):
    model = new_net(2).eval()
    with caplog.at_level(logging.WARNING, logger="hiremate.api"):
        h = HRockmate(model, x, 1.0, **QUICK)
    assert any("eval mode" in r.getMessage() for r in caplog.records)
    calls = counting(h)
    train_step(h, x, 1)  # eval mode, with gradients: the mode of the build, the schedule runs
    assert calls == [1]
    caplog.clear()
    eager = copy.deepcopy(model).train()
    h.train()
    with caplog.at_level(logging.WARNING, logger="hiremate.api"):
        for _ in range(2):
            h.zero_grad()
            eager.zero_grad()
            torch.testing.assert_close(train_step(h, x, 2), train_step(eager, x, 2),
                                       rtol=1e-12, atol=0)
    assert calls == [1]
    assert_grads_match(model, eager)
    assert sum("plain forward" in r.getMessage() for r in caplog.records) == 1  # once
    # one submodule in another mode than at build is another mode as well
    h.eval()
    model.body[1].train()
    train_step(h, x, 3)
    assert calls == [1]


# -- copies and files -----------------------------------------------------------------------------
def test_copies_and_pickles_share_with_their_own_model(built, x):
    rm = built[0]
    for other in (copy.deepcopy(rm), _pickled(rm)):
        model = other.wrapped_model
        assert model is not rm.wrapped_model and other.executor.model is model
        assert all(p is q for p, q in zip(other.parameters(), model.parameters()))
        assert list(other.state_dict()) == list(rm.state_dict())
        torch.testing.assert_close(train_step(other, x, 1), train_step(rm, x, 1),
                                   rtol=1e-12, atol=0)
        rm.zero_grad(set_to_none=True)


def _pickled(rm: HRockmate) -> HRockmate:
    buf = io.BytesIO()
    torch.save(rm, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def test_save_and_load_keep_the_build_mode(built, x, tmp_path):
    rm = built[0]
    rm.save(tmp_path / "rm.json")
    model = copy.deepcopy(rm.wrapped_model)
    loaded = HRockmate.load(model, tmp_path / "rm.json")
    assert list(loaded.state_dict()) == list(model.state_dict())
    calls = counting(loaded)
    train_step(loaded, x, 1)
    assert calls == [1]
    loaded.eval()
    loaded(x)
    assert calls == [1]


# -- a Hugging Face model under transformers' Trainer ---------------------------------------------
VOCAB, SEQ, BATCH = 64, 8, 2


@pytest.fixture(scope="module")
def gpt2():
    """A tiny GPT-2 (2 layers, width 32, default dropout) in float64, its wrapper at 0.6 of the
    autodiff peak, and a synthetic data set of ``input_ids`` + ``labels``."""
    tf = pytest.importorskip("transformers")
    cfg = tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=SEQ,
                        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(cfg).double()
    gen = torch.Generator().manual_seed(1)
    data = []
    for _ in range(4 * BATCH):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=gen)
        data.append({"input_ids": ids, "labels": ids.clone()})
    sample = {k: torch.stack([d[k] for d in data[:BATCH]]) for k in ("input_ids", "labels")}
    eager = copy.deepcopy(model)
    rm = HRockmate(model, sample, 0.6, **QUICK)
    assert rm.report()["predicted_peak"] < rm.report()["autodiff_peak"]
    return tf, rm, eager, data, sample


def test_trainer_trains_the_wrapper_as_the_model(gpt2, tmp_path):
    """The same Trainer loop on the wrapper and on a deep copy of the model: the same losses
    and parameters, and every training step went through the schedule."""
    pytest.importorskip("accelerate")  # transformers' Trainer needs it
    tf, built, _, data, _ = gpt2
    rm = copy.deepcopy(built)
    eager = copy.deepcopy(rm.wrapped_model)
    start = copy.deepcopy(eager.state_dict())
    calls = counting(rm)

    class Recording(tf.Trainer):
        losses: list[torch.Tensor]

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            self.losses.append((out[0] if return_outputs else out).detach().clone())
            return out

    def train(module: nn.Module) -> torch.Tensor:
        args = tf.TrainingArguments(
            output_dir=str(tmp_path), per_device_train_batch_size=BATCH, max_steps=4,
            learning_rate=1e-2, use_cpu=True, report_to=[], save_strategy="no",
            logging_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0)
        trainer = Recording(model=module, args=args, train_dataset=data)
        trainer.losses = []
        trainer.train()
        return trainer

    mine, theirs = train(rm), train(eager)
    ours, ref = torch.stack(mine.losses), torch.stack(theirs.losses)
    assert len(ours) == 4 and calls == [1] * 4
    torch.testing.assert_close(ours, ref, rtol=1e-7, atol=0)  # HF computes the loss in float32
    params = rm.wrapped_model.state_dict()
    for name, q in eager.state_dict().items():
        torch.testing.assert_close(params[name], q, rtol=1e-10, atol=0, msg=name)
    assert not torch.equal(params["transformer.h.0.mlp.c_fc.weight"],
                           start["transformer.h.0.mlp.c_fc.weight"])
    # Trainer passes num_items_in_batch to a model that takes **kwargs: an input the sample did
    # not have, captured once
    assert mine.model_accepts_loss_kwargs == theirs.model_accepts_loss_kwargs
    assert rm.recaptures == int(mine.model_accepts_loss_kwargs)


def test_hugging_face_attributes_checkpoints_and_generation(gpt2, tmp_path):
    tf, rm, _, _, sample = gpt2
    model = rm.wrapped_model
    assert rm.config is model.config and rm.main_input_name == "input_ids"
    # save_pretrained on the wrapper writes the model's checkpoint
    rm.save_pretrained(tmp_path / "hf")
    loaded = tf.GPT2LMHeadModel.from_pretrained(tmp_path / "hf", dtype=torch.float64)
    mine = model.state_dict()
    theirs = loaded.state_dict()
    assert theirs.keys() == mine.keys()
    assert all(torch.equal(theirs[k], mine[k]) for k in mine)
    # and torch.save of its state_dict loads strictly into a plain model
    torch.save(rm.state_dict(), tmp_path / "sd.pt")
    plain = tf.GPT2LMHeadModel(model.config).double()
    plain.load_state_dict(torch.load(tmp_path / "sd.pt"), strict=True)
    assert all(torch.equal(v, mine[k]) for k, v in plain.state_dict().items())
    # generation and evaluation are the model's plain forward, outputs and all
    calls = counting(rm)
    prompt = sample["input_ids"][:, :3]
    settings = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": VOCAB - 1}
    assert torch.equal(rm.generate(prompt, **settings), model.generate(prompt, **settings))
    rm.eval()
    try:
        ours, ref = rm(**sample), model(**sample)
    finally:
        rm.train()
    assert type(ours) is type(ref) and ours.keys() == ref.keys()
    assert torch.equal(ours.logits, ref.logits) and torch.equal(ours.loss, ref.loss)
    assert calls == []
