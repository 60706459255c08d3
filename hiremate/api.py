"""``HRockmate``: a model that trains within an activation-memory budget, in one call.

``HRockmate(model, sample, budget, config="hiremate", **overrides)`` captures the model's
CD-graph, solves it (:func:`hiremate.composer.solve.solve`: flat solvers on small graphs, menus of
blocks and rk-Rotor on large ones, the fastest schedule the simulator accepts within the budget)
and runs the schedule with the executor (``hiremate.runtime.executor.RematModule``). The result is an
``nn.Module`` to call instead of the model. ``save``/``load`` keep the graph and the schedule, so
a later run skips capture and solving.

The wrapper drops in for the model (:class:`hiremate.wrapper.ModelWrapper`): its parameters,
buffers, ``state_dict`` keys, submodules and training flag are the model's own, and attributes
it does not define (``config``, ``generate``, ``save_pretrained``...) are the model's. The
schedule runs only where a backward may follow: with autograd recording and every module in
the training mode it had at build. Under ``torch.no_grad()``/``inference_mode``, or after
``eval()`` (of a wrapper built in training mode), the call is the model's plain forward, with
the model's outputs and hooks.

Building never changes the model (parameters, buffers, ``.grad``) or the global RNG states,
although cost measurement and calibration run it for real: one guard
(:func:`hiremate.runtime.preserve.preserved`) around the whole build keeps that promise whatever stage
runs the model, rather than each stage keeping it for itself. Calls with inputs of other shapes
(another batch size or sequence length) are captured again, once per input signature, and take
over a schedule already solved when it fits (config ``on_new_inputs``, ``max_shapes``,
``transfer_schedules``), else are solved; so are calls after parameters frozen at
the build were made trainable, once per set of them. A call under another ``torch.autocast``
than the build's runs the plain forward: build inside the autocast context training uses.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable

import torch

from hiremate.ir.budget import resolve_budget
from hiremate.config import Config, load_config
from hiremate.errors import (ConfigError, GraphCaptureError, HiremateError, InfeasibleBudgetError,
                             InputMismatchError, ModelChangedError)
from hiremate.ir.graph import DataKind, Graph, same_program
from hiremate.graphbuilder.build import autocast_dtype, check_model
from hiremate.graphbuilder.capture import is_capturing
from hiremate.runtime import structure
from hiremate.runtime.building import trainable_build, traceable, training_modes
from hiremate.runtime.hooks import user_module_hooks
from hiremate.runtime.io import in_sample_form, positional_sample
from hiremate.runtime.loss_step import TARGET_KEYWORD, LossStep, check_loss_fn
from hiremate.runtime.preserve import initialise_lazy, preserved
from hiremate.ir.schedule import Schedule
from hiremate.composer.whole_step import step_budget
from hiremate import saved, solving
from hiremate.solving import Built, solve_graph  # noqa: F401 (solve_graph: this module's API)
from hiremate.wrapper import ModelWrapper

log = logging.getLogger(__name__)


class HRockmate(ModelWrapper):
    """``model`` rescheduled to fit ``budget`` (bytes, ``"512MiB"``, or a fraction of the
    autodiff peak); call it like the model. See the module docstring.

    The budget bounds the whole training step above the memory allocated before the forward
    (parameters and their gradients aside): the forward, the user's loss and the backward.

    - With ``loss_fn`` (``(output) -> loss``, or ``(output, target) -> loss`` given
      ``target=``, the sample's target), the loss is captured into the graph with the model
      and scheduled with it (:mod:`hiremate.runtime.loss_step`): a call returns the scalar loss,
      ``wrapped(*inputs, target=y)`` (or ``wrapped(*inputs)`` without a target), ready for
      ``.backward()``. Targets are call arguments; a loss that reads tensors from elsewhere is
      refused, since the capture would freeze them.
    - With ``loss_fn`` and ``capture_loss=False``, a call returns the model's outputs, the loop
      applies ``loss_fn`` to them, and what the loss allocates is measured once at build (the
      loss run on the model's outputs and differentiated back to them) and reserved.
    - Without ``loss_fn``, the loss is taken to need two tensors the size of the outputs it
      differentiates besides their gradients (cross-entropy's log-softmax and its gradient, a
      squared error's residual and its scaled copy), and that is reserved; a loss the model
      returns itself (below) needs nothing more.

    The gradients of the outputs that the loss hands to the backward are counted by the graph,
    and so are the random-generator states kept to rerun random ops. A model that returns a
    scalar loss beside other outputs (a Hugging Face model given labels) is taken to be trained
    from the loss alone (config ``output_gradients``, docs/design.md "The executor").

    Building leaves ``model`` as it was: parameters, buffers, ``.grad`` and the global RNG
    states (:func:`hiremate.runtime.preserve.preserved` around the whole build). A call with inputs of
    other shapes than ``sample`` is captured again for them, once, and runs the sample's
    schedule when its whole step fits their budget (a fraction is of their peak, but never
    fewer bytes than the sample's), else is solved (config ``on_new_inputs``, ``max_shapes``,
    ``transfer_schedules``); so is a CPU training step at another intra-op thread count than
    the build's, whose convolutions take scratch of another size. ``recaptures`` counts those
    builds and :meth:`variants` lists the ones kept.

    The wrapper shares the model's parameters and names (``state_dict()`` and
    ``named_parameters()`` keys are the model's), its mode (``train()``/``eval()``) and its
    attributes; ``hiremate_config`` is the :class:`~hiremate.config.Config` it was built with,
    ``wrapped_model`` the model. Calls without autograd, or in another training mode than at
    build, run the model's plain forward (see the module docstring). ``forward`` reports the
    model's signature; code that inspects the *class* instead (Hugging Face's ``Trainer`` finds
    label names so) sees ``HRockmate``'s: pass ``TrainingArguments(label_names=["labels"])``
    for evaluation losses there.
    """

    def __init__(self, model: torch.nn.Module, sample: Any, budget: int | float | str,
                 config: str | Path | dict | Config | None = "hiremate", *,
                 loss_fn: Callable[..., torch.Tensor] | None = None, target: Any = None,
                 capture_loss: bool = True, **overrides: Any):
        super().__init__()
        cfg = load_config(config, **overrides)
        check_model(model, "HRockmate")
        if budget is None:
            raise ConfigError("HRockmate needs a budget: bytes, '512MiB', or a fraction (0.5)")
        resolve_budget(budget, reference=1)  # a malformed budget fails before the capture
        self._init_state(budget, loss_fn, model, target, capture_loss)
        initialise_lazy(model, traceable(sample))
        step = self._loss_step
        if step is not None:
            sample = step.step_inputs(sample, target)
        runs = self._runs(model)
        try:
            with trainable_build(), preserved(runs, python_state_warning=True):
                built = self._build(runs, cfg, traceable(sample), budget)
        except GraphCaptureError as exc:
            if step is not None and step.output_error is not None:
                raise step.output_error from exc
            raise
        built.report["loss_captured"] = step is not None
        self._adopt(model, built, cfg)

    def _init_state(self, budget: int | float | str,
                    loss_fn: Callable[..., torch.Tensor] | None = None,
                    model: torch.nn.Module | None = None, target: Any = None,
                    capture_loss: bool = False) -> None:
        if target is not None and (loss_fn is None or not capture_loss):
            raise ConfigError("target= is the sample target of a captured loss_fn; pass "
                              "loss_fn=(output, target) -> loss with it (and capture_loss=True)")
        step = None
        if loss_fn is not None and capture_loss:
            check_loss_fn(loss_fn, model, target is not None)
            step = LossStep(model, loss_fn)
        elif loss_fn is not None and not callable(loss_fn):
            raise ConfigError(f"loss_fn must be callable (output -> scalar loss), got "
                              f"{type(loss_fn).__name__}")
        # the budget as the user wrote it: a fraction is resolved again for every new shape
        self._budget_arg = budget
        self._loss_fn = loss_fn
        # the model and the loss as one module, when the loss is captured (else None); kept
        # off the module tables, which become the model's
        self._own("_loss_step", step)
        self._has_target = target is not None
        self.recaptures = 0
        self.rebuilds = 0  # captures again after the model changed
        # keyed by the module itself (hashed by identity), so that copies and pickles of this
        # module keep each report with its copied variant
        self._variant_reports: dict[Any, dict[str, Any]] = {}

    def _build(self, model, cfg: Config, sample: Any, budget: int | float | str,
               graph: Graph | None = None, variant: bool = False) -> Built:
        """Capture (unless ``graph`` is given), solve, make the executor and calibrate it
        (``variant``: for other inputs than the sample's, see :meth:`_make_executor`)."""
        if graph is None:
            from hiremate import build_graph

            # a loss applied outside to the outputs may use any of them
            scalars = cfg.output_gradients == "auto" and not (
                self._loss_fn is not None and self._loss_step is None)
            # the roofline fit belongs to the machine, not to the menus' cache_dir: it stays
            # in $HIREMATE_CACHE, fitted once whatever cache_dir each build names
            graph = build_graph(model, sample, cost_model=cfg.cost_model,
                                output_gradients="scalars" if scalars else "all")
        loss_bytes = solving.loss_bytes(model, graph, sample, self._loss_fn,
                                        self._loss_step is not None)
        target = step_budget(budget, graph, loss_bytes)
        result = None
        if variant:  # a fraction is of these inputs' peak, but never less than the sample had
            target = max(target, self._report["budget"])
            if cfg.transfer_schedules:  # other sizes of a program already solved
                result = solving.transfer_schedule(graph, target, loss_bytes, self._solved(),
                                                   cfg)
        if result is None:
            result = solving.solve_graph(graph, target, cfg, loss_bytes=loss_bytes)
        built = Built(graph, tuple(result.schedule), dict(result.report),
                       self._make_executor(model, graph, tuple(result.schedule), cfg, sample,
                                           variant))
        if built.executor is not None and cfg.calibrate and sample is not None:
            built = solving.calibrate(
                built, sample, target, cfg, result.report["solve_time"],
                lambda schedule: self._make_executor(model, graph, schedule, cfg, sample,
                                                     variant),
                None if self._loss_step is not None else self._loss_fn)
        return built

    def _runs(self, model: torch.nn.Module) -> torch.nn.Module:
        """What is captured and run: the model, or the model and its loss as one module."""
        return model if self._loss_step is None else self._loss_step

    @classmethod
    def from_graph(cls, model: torch.nn.Module, graph: Graph, budget: int | float | str,
                   config: str | Path | dict | Config | None = "hiremate", sample: Any = None,
                   *, loss_fn: Callable[[Any], torch.Tensor] | None = None,
                   capture_loss: bool = True, **overrides: Any) -> "HRockmate":
        """Like the constructor, on a graph already captured from ``model`` (no capture). The
        graph is the model's alone, so a ``loss_fn`` runs outside: pass ``capture_loss=False``
        with it."""
        if loss_fn is not None and capture_loss:
            raise ConfigError("from_graph takes a graph of the model alone, which cannot hold "
                              "the loss: pass capture_loss=False (the loss runs outside the "
                              "module and its memory is measured), or build with HRockmate("
                              "model, sample, budget, loss_fn=...) to capture it")
        cfg = load_config(config, **overrides)
        self = cls.__new__(cls)
        torch.nn.Module.__init__(self)
        self._init_state(budget, loss_fn)
        with preserved(model, python_state_warning=True):
            built = self._build(model, cfg, sample, budget, graph=graph)
        self._adopt(model, built, cfg)
        return self

    # -- construction ---------------------------------------------------------------------------
    def _adopt(self, model: torch.nn.Module, built: Built, cfg: Config,
               modes: list[bool] | None = None) -> None:
        """Make ``built`` (the sample's) the module's graph, schedule, report and executor, and
        wrap ``model`` (``modes``: the training flags the graph was captured with, by default
        the model's now)."""
        self._own("graph", built.graph)
        self._own("schedule", built.schedule)
        self._own("_report", built.report)
        self._own("hiremate_config", cfg)
        # which parameters the graph differentiates: one made trainable after the build needs
        # another capture (the graph computes no gradient for it), see _executor_for
        captured = set(built.graph.meta.get("param_names", []))
        names = [n for n, _ in self._runs(model).named_parameters()]
        self._own("_trainable", (names, tuple(n in captured for n in names)))
        self._own("_trainable_variants", {})
        self._own("_constant_values", {})  # per argument path: values captured again
        self._own("_positional_sample", positional_sample(built.graph, self._loss_step is not None))
        # the executor is not a registered submodule: the model is not re-registered under it,
        # and the state-dict keys stay the model's
        self._own("executor", built.executor)
        self._own("_built_modes", training_modes(model) if modes is None else modes)
        # read at every call: walking a list costs less than walking modules() again
        self._own("_mode_modules", list(model.modules()))
        self._own("_mode_notes", set())
        self._own("_hooks_at_build", user_module_hooks(self._mode_modules))
        if self._hooks_at_build:
            log.warning("%s has %d module hooks (forward or backward): they ran once while "
                        "capturing, on traced values, and do not run in calls through the "
                        "schedule (what they return is part of the captured program, what else "
                        "they do is not)", type(model).__name__, self._hooks_at_build)
        if not model.training:
            log.warning("%s is in eval mode: the schedule serves calls in eval mode with autograd "
                        "on; in training mode the model's plain forward runs, without the memory "
                        "bound. Call model.train() before building to train within the budget",
                        type(model).__name__)
        self._wrap(model)

    def _make_executor(self, model, graph: Graph, schedule: Schedule, cfg: Config,
                       sample: Any = None, variant: bool = False):
        """The executor; the sample's dispatches other inputs to :meth:`_recapture` (config
        ``on_new_inputs``), a variant's raises on inputs it was not built for."""
        try:
            from hiremate.runtime.executor import RematModule
        except ImportError as exc:
            log.warning("hiremate.runtime.executor is not available (%s): the schedule is solved but "
                        "cannot run", exc)
            return None
        again = {"on_output_gradient": self._differentiate_all}
        if variant or cfg.on_new_inputs == "raise":
            return RematModule(model, graph, schedule, sample=sample, **again)
        return RematModule(model, graph, schedule, sample=sample, on_mismatch=self._recapture,
                           max_others=cfg.max_shapes, **again)

    def _differentiate_all(self, args: tuple, kwargs: dict, *rest: Any) -> list:
        """A backward reached an output besides the scalar ones that the graph was captured to
        be differentiated from (config ``output_gradients``): capture and solve the model again
        from this call with every output differentiated, make that the module's (later calls
        use it), and take this call's gradients from it, run again (``RematModule``'s
        ``on_output_gradient``)."""
        from hiremate.runtime.executor import differentiate_again

        if "untangented_outputs" not in self.graph.meta:  # an earlier call rebuilt it already
            return differentiate_again(self.executor, args, kwargs, *rest)
        log.warning("the backward reached an output of %s besides its scalar ones (the loss), "
                    "which the schedule was solved without: capturing and solving it again with "
                    "every output differentiated (set output_gradients='all' to start so)",
                    type(self.wrapped_model).__name__)
        cfg = dataclasses.replace(self.hiremate_config, output_gradients="all")
        # the backward runs outside the forward's autocast: capture under the graph's again
        cast = self.graph.meta.get("autocast")
        try:
            with torch.autocast(torch.device(self.graph.meta.get("device", "cpu")).type,
                                dtype=getattr(torch, cast or "float32"), enabled=cast is not None):
                built = self._take_over(args, kwargs, cfg)
        except InfeasibleBudgetError as exc:
            raise InfeasibleBudgetError(
                f"the backward reached outputs besides the loss, so the model was solved again "
                f"with every output differentiated (their gradients take memory too), but: {exc}",
                min_budget=exc.min_budget) from exc
        return differentiate_again(built.executor, args, kwargs, *rest)

    def _recapture(self, args: tuple, kwargs: dict, error: InputMismatchError):
        """A module for inputs that differ from the sample: captured and solved for them, with
        the user's budget resolved again (a fraction is of *their* autodiff peak), the model
        left untouched. Called once per input signature by the executor, which keeps the
        result (at most ``max_shapes``, least recently used evicted)."""
        if args and kwargs:  # a sample is positional or keyword arguments, not both
            raise InputMismatchError(
                f"{error}. These arguments cannot all be passed by position, and a sample is "
                "positional or keyword arguments, not both: build the module from a sample "
                "of keyword arguments (a dict) that includes them") from error
        live = {id(m) for m in [*self.executor.variants, *self._trainable_variants.values()]}
        self._variant_reports = {m: r for m, r in self._variant_reports.items() if id(m) in live}
        log.info("%s; capturing and solving for these inputs (budget %r)", error,
                 self._budget_arg)
        start = time.perf_counter()
        try:
            built = self._build_for_call(args, kwargs, variant=True)
        except InfeasibleBudgetError as exc:
            raise InfeasibleBudgetError(
                f"new inputs ({error}) were captured again, but: {exc}",
                min_budget=exc.min_budget) from exc
        except GraphCaptureError as exc:  # e.g. a dtype the model cannot take
            raise InputMismatchError(
                f"{error}. Capturing the model again for these inputs failed as well, so they "
                f"cannot run: {exc}") from exc
        self.recaptures += 1
        built.report["recapture_time"] = time.perf_counter() - start
        checker = self.executor._checker
        path = getattr(error, "constant_path", None)
        if path is not None and same_program(built.graph, self.graph):
            # the argument's value is not part of the program (a step counter passed along):
            # the sample's module serves every value of it from now on
            log.info("argument %s does not change the captured program: no longer checked",
                     path)
            checker.ignore_constant(path)
            return self.executor
        for ignored in checker.ignored():
            built.executor._checker.ignore_constant(ignored)
        if path is not None:
            self._constant_values[path] = self._constant_values.get(path, 0) + 1
            if self._constant_values[path] == self.hiremate_config.max_shapes + 1:
                log.warning("argument %s has taken %d values, each captured and solved again: "
                            "pass it as a tensor, so that it is an input of the program rather "
                            "than part of it", path, self._constant_values[path])
        self._variant_reports[built.executor] = built.report
        log.info("built a module for the new inputs in %.2fs (budget %s bytes)",
                 built.report["recapture_time"], built.report.get("budget"))
        return built.executor

    def _build_for_call(self, args: tuple, kwargs: dict, variant: bool,
                        cfg: Config | None = None) -> Built:
        """Capture and solve the model with a call's arguments as the sample, the model left
        untouched (a call under no_grad or inference_mode too: :func:`_trainable_build`)."""
        model = self._runs(self.wrapped_model)
        sample = tuple(args) if args else dict(kwargs)
        with trainable_build(), preserved(model, python_state_warning=True):
            return self._build(model, cfg or self.hiremate_config, traceable(sample),
                               self._budget_arg, variant=variant)

    def _take_over(self, args: tuple, kwargs: dict, cfg: Config) -> Built:
        """Capture and solve from this call's arguments, and make that the module's graph,
        schedule and executor; what was built for other inputs or trainable sets is dropped."""
        built = self._build_for_call(args, kwargs, variant=False, cfg=cfg)
        built.report["loss_captured"] = self._loss_step is not None
        self._adopt(self.wrapped_model, built, cfg)
        self._variant_reports = {}
        self.rebuilds += 1
        return built

    def _rebuild(self, args: tuple, kwargs: dict, change: str) -> None:
        """Capture and solve the model again after it changed (:mod:`hiremate.runtime.
        structure`), from this call's arguments (:meth:`_take_over`)."""
        if args and kwargs:
            raise ModelChangedError(
                f"the model changed after this module was built ({change}), and this call's "
                "arguments cannot serve as a sample (positional and keyword at once): build "
                "the module again from the changed model")
        log.warning("%s changed after this module was built (%s): capturing and solving it "
                    "again (budget %r)", type(self.wrapped_model).__name__, change,
                    self._budget_arg)
        self._take_over(args, kwargs, self.hiremate_config)

    def _solved(self) -> list[tuple[Graph, Schedule, dict[str, Any]]]:
        """What new inputs may take over (:func:`~hiremate.solving.transfer_schedule`): the
        graphs, schedules and reports of the sample's module and of the variants solved (not
        themselves taken over, so that gaps to the bound do not add up)."""
        if self.executor is None:
            return []
        kept = [(self.executor, self._report), *((m, self._variant_reports.get(m, {}))
                                                 for m in self.executor.variants)]
        return [(m.graph, m.schedule, r) for m, r in kept if "transferred_from" not in r]

    def variants(self) -> list[dict[str, Any]]:
        """The modules built for other inputs than the sample's, least recently used first:
        ``{"inputs": [(path, shape, dtype), ...], "cpu_threads": intra-op threads of a CPU
        build (else None), "report": {...}, "module": RematModule}``."""
        if self.executor is None:
            return []
        out = []
        for m in self.executor.variants:
            g = m.graph
            shapes = [(tuple(d.shape), d.dtype) for d in g.data if d.kind is DataKind.INPUT]
            out.append({"inputs": [(p, *sd) for p, sd in zip(g.meta.get("input_paths", []),
                                                               shapes)],
                        "cpu_threads": g.meta.get("cpu_threads"),
                        "report": dict(self._variant_reports.get(m, {})), "module": m})
        return out

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The model's outputs (the loss, when it was captured: see the class docstring):
        through the schedule when a backward may follow (autograd on, the training flags as at
        build), else from the model's plain forward."""
        model = self._runs(self.wrapped_model)
        args, kwargs = self._in_sample_form(args, kwargs)
        if self._loss_step is not None:
            args, kwargs = self._loss_step_inputs(args, kwargs), {}
        if not self._runs_schedule(self.wrapped_model):
            return model(*args, **kwargs)
        if self.executor is None:
            raise HiremateError("hiremate.runtime.executor is not installed in this build: the schedule "
                                "was solved (see .report()) but cannot be run")
        return self._executor_for(args, kwargs)(*args, **kwargs)

    def _executor_for(self, args: tuple, kwargs: dict):
        """The executor for the parameters trainable now. A parameter frozen at the build and
        trainable now (a backbone unfrozen after some epochs) has no gradient in the graph, so
        it is captured and solved again, once per set of such parameters, as for new inputs;
        a parameter frozen since the build only has its gradient dropped, as eager leaves it."""
        change = self.executor.model_change()
        if change is not None:
            self._rebuild(args, kwargs, change)
        names, at_build = self._trainable
        # read at every call (parameters may be replaced: load_state_dict(assign=True))
        flags = tuple(p.requires_grad for p in self._runs(self.wrapped_model).parameters())
        if len(flags) != len(names):
            raise InputMismatchError(
                f"the model has {len(flags)} parameters now and had {len(names)} when this "
                "module was built; build the module again for the changed model")
        unfrozen = tuple(n for n, now, was in zip(names, flags, at_build) if now and not was)
        if not unfrozen:
            return self.executor
        found = self._trainable_variants.get(unfrozen)
        if found is None:
            shown = ", ".join(unfrozen[:3]) + (", ..." if len(unfrozen) > 3 else "")
            found = self._recapture(args, kwargs, InputMismatchError(
                f"{len(unfrozen)} parameters frozen when this module was built need a gradient "
                f"now ({shown})"))
            self._trainable_variants[unfrozen] = found
        return found

    def _in_sample_form(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The call's model arguments in the sample's form, positional or keyword
        (:func:`~hiremate.runtime.io.in_sample_form`); a captured loss's target stays a
        keyword."""
        target = {}
        if self._has_target and TARGET_KEYWORD in kwargs:
            kwargs = dict(kwargs)
            target = {TARGET_KEYWORD: kwargs.pop(TARGET_KEYWORD)}
        args, kwargs = in_sample_form(self.wrapped_model.forward, args, kwargs,
                                      self._positional_sample)
        return args, {**kwargs, **target}

    def _loss_step_inputs(self, args: tuple, kwargs: dict) -> tuple:
        """A call's arguments as the captured loss step takes them: the model's, and the
        target passed as ``target=`` when the module was built with one."""
        kwargs = dict(kwargs)
        if self._has_target:
            if TARGET_KEYWORD not in kwargs:
                raise InputMismatchError(
                    f"this module was built with a captured loss and a target: call it as "
                    f"module(*inputs, {TARGET_KEYWORD}=...); it returns the loss")
            return (tuple(args), kwargs, kwargs.pop(TARGET_KEYWORD))
        return (tuple(args), kwargs)

    def _runs_schedule(self, model: torch.nn.Module) -> bool:
        """Whether a call runs the schedule: with autograd off no backward can follow, and in
        another mode than at build the graph computes something else (dropout, BatchNorm);
        the autocast, hooks and ``torch.func`` transforms of the call must allow it too."""
        if not torch.is_grad_enabled() or is_capturing():  # see graphbuilder's capturing()
            return False
        if not self._autocast_as_captured():
            return False
        if torch._C._are_functorch_transforms_active():
            self._warn_once("functorch", "%s is called under a torch.func transform (vmap, grad, "
                            "jacrev...), which the schedule's autograd function cannot run "
                            "under: running the plain forward (no memory bound)")
            return False
        if user_module_hooks(self._mode_modules) != self._hooks_at_build:
            self._warn_once("hooks", "module hooks were added to or removed from %s after the "
                            "build: running its plain forward (no memory bound), where they "
                            "run; build the wrapper again to train within the budget")
            return False
        if [m.training for m in self._mode_modules] == self._built_modes:
            return True
        built_training = self._built_modes[0]
        if model.training != built_training and model.training not in self._mode_notes:
            self._mode_notes.add(model.training)
            # training in another mode than the schedule's is worth a warning; a call with
            # gradients in eval mode (a saliency map, say) is expected to run the plain model
            level = logging.WARNING if model.training else logging.INFO
            log.log(level, "%s is in %s mode but the schedule was built in %s mode: running its "
                    "plain forward (no memory bound)", type(model).__name__,
                    "training" if model.training else "eval",
                    "training" if built_training else "eval")
        return False

    def _warn_once(self, key: str, message: str) -> None:
        """Log ``message`` (``%s``: the model's class) the first time ``key`` comes up."""
        if key not in self._mode_notes:
            self._mode_notes.add(key)
            log.warning(message, type(self.wrapped_model).__name__)

    def _autocast_as_captured(self) -> bool:
        """Whether this call's autocast is the capture's (the graph holds the casts of the
        autocast at capture, or none): under another the captured program would compute in
        other dtypes than the model now does, so the plain forward runs, with a warning once."""
        graph = self.graph
        captured = graph.meta.get("autocast")
        now = autocast_dtype(torch.device(graph.meta.get("device", "cpu")).type)
        if now == captured:
            return True
        if (now, captured) not in self._mode_notes:
            self._mode_notes.add((now, captured))
            log.warning("%s is called %s but was captured %s: running its plain forward (no "
                        "memory bound). Build the wrapper inside the autocast context that "
                        "training uses, to train within the budget", graph.meta.get("model"),
                        f"under autocast to {now}" if now else "without autocast",
                        f"under autocast to {captured}" if captured else "without autocast")
        return False

    # -- facts ------------------------------------------------------------------------------------
    def written_parameters(self) -> list[torch.Tensor]:
        """The parameters a call writes in place (``RematModule.written_parameters``)."""
        return self.executor.written_parameters() if self.executor is not None else []

    def report(self) -> dict[str, Any]:
        """Predicted figures, autodiff's, solving time, hierarchy facts and winning solvers
        (for the sample's inputs; :meth:`variants` has the others')."""
        return dict(self._report)

    # -- persistence ------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Graph, schedule, report, configuration and the budget as given, as one JSON file (no
        weights: :mod:`hiremate.saved`)."""
        saved.write(path, self.graph, self.schedule, self._report, self.hiremate_config,
                    self._budget_arg, self._built_modes,
                    None if self._loss_step is None else {"target": self._has_target},
                    structure.to_json(self.executor.captured_fingerprint))

    @classmethod
    def load(cls, model: torch.nn.Module, path: str | Path,
             loss_fn: Callable[..., torch.Tensor] | None = None) -> "HRockmate":
        """Rebuild from :meth:`save`'s file on ``model`` (same architecture, checked against
        the one saved: :func:`~hiremate.runtime.structure.check_saved_model`): no capture, no
        solving; the schedule is checked with the simulator. A module saved with a captured
        loss needs that ``loss_fn`` again (functions are not saved)."""
        file = saved.read(path, loss_fn is not None)
        self = cls.__new__(cls)
        torch.nn.Module.__init__(self)
        loss = file.loss
        self._init_state(file.budget_arg, loss_fn, model,
                         True if loss and loss.get("target") else None, loss is not None)
        structure.check_saved_model(file.model, self._runs(model), path)
        modes = file.training_modes
        # the flags the graph was captured with, where the file has them for this architecture
        fits = modes and len(modes) == len(training_modes(model))
        modes = [bool(m) for m in modes] if fits else None
        executor = self._make_executor(self._runs(model), file.graph, tuple(file.schedule),
                                       file.config)
        self._adopt(model, Built(file.graph, tuple(file.schedule), file.report, executor),
                    file.config, modes)
        return self

    def extra_repr(self) -> str:
        rep = self._report
        return (f"budget={rep.get('budget')}, predicted_peak={rep.get('predicted_peak')}, "
                f"autodiff_peak={rep.get('autodiff_peak')}, steps={len(self.schedule)}")

    def __repr__(self) -> str:
        inner = repr(self.wrapped_model).replace("\n", "\n  ")
        return f"HRockmate(\n  {self.extra_repr()}\n  (model): {inner}\n)"

