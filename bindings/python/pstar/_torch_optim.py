"""pm.optimizer and the PyTorch ecosystem's entry points to the engine.

PstarOptimizer is a torch.optim.Optimizer over the engine's AdamW, so that
code written for a torch optimizer (transformers' Trainer, Accelerate,
Lightning, torch's and transformers' LR schedulers) drives the engine:

- ``param_groups`` is one group holding the model's trainable parameters,
  with the engine's ``lr``, ``betas``, ``eps`` and ``weight_decay``.  A
  change to them between steps (by the user or a scheduler) reaches the
  engine at the next ``step()``: the values are set inside the iteration,
  after the backward (pstar_hparam_set is legal there), so the bits are
  those of the same values set before the iteration.  The engine's
  per-parameter groups (``pm.engine.set_lr_scale``, ``set_weight_decay``)
  scale the group's values as before.
- ``step(closure=None)`` calls the closure first, when given (Lightning's
  automatic optimization, LBFGS-style callers), then ends the iteration
  with the engine's AdamW (``pm.step()``) and returns the closure's result.
- ``zero_grad()`` does nothing: gradients are the engine's, consumed by
  the step.
- ``state_dict()`` holds the engine's whole optimizer state as the files
  of an engine checkpoint (fp32 masters, moments, step count, loss scaler,
  hyperparameters, with their checksums) in uint8 tensors, plus the group's
  hyperparameters: ``torch.save`` writes it and ``torch.load`` (also with
  ``weights_only=True``) reads it back; ``load_state_dict`` restores the
  engine from it bit for bit.  One process only: with world_size > 1 each
  rank holds its shards, and both are refused naming the engine's
  checkpoints (save_checkpoint on a directory every rank sees, which load
  at another world size).
- ``add_param_group`` is refused: the engine's parameters are fixed at
  attach.

Gradient clipping: ``torch.nn.utils.clip_grad_norm_`` and Accelerate's
``Accelerator.clip_grad_norm_`` over an attached model's parameters ask the
engine to clip this iteration's step at ``max_norm`` and return the
engine's global norm (pstar_grad_norm, the bits the step uses), as torch
returns its total norm.  Both are wrapped when pstar.torch is imported (Accelerate's
then, or when it is imported later: a meta path hook).  A caller that reads ``p.grad`` of a PstarParameter inside a
function named like ``clip_grad...`` (an unwrapped copy of torch's
function, another library's clipping) gets an error, never a norm of 0.

A torch optimizer over PstarParameters (``torch.optim.AdamW(model
.parameters())``, Trainer's default optimizer) is refused when it is built:
torch.optim.Optimizer.add_param_group is wrapped to say to use
``pm.optimizer``.
"""
import functools
import math
import os
import sys
import tempfile
import weakref

import torch

from .torch import PstarParameter, _invalid_state, _unsupported

# The checkpoint format of state_dict() (the engine's files inside).
_STATE_FORMAT = 1

_ADVICE = ("use pm.optimizer, the torch.optim.Optimizer over the engine's AdamW: "
           "Trainer(model=model, args=args, train_dataset=ds, optimizers=(pm.optimizer, scheduler)), "
           "accelerator.prepare(model, pm.optimizer, ...), or return pm.optimizer from a LightningModule's "
           "configure_optimizers()")


class PstarOptimizer(torch.optim.Optimizer):
    """The engine's AdamW as a torch.optim.Optimizer (see the module doc).
    Made by ``pm.optimizer``."""

    def __init__(self, pm):
        self._pm_ref = weakref.ref(pm)  # the parameters hold pm; no cycle through pm
        engine = pm.engine
        # One group of the trainable parameters (a tied one has one slot).
        params = [s.param_ref() for s in pm.slots if not s.frozen_at_attach]
        defaults = dict(lr=engine.hparam("lr"), betas=(engine.hparam("beta1"), engine.hparam("beta2")),
                        eps=engine.hparam("eps"), weight_decay=engine.hparam("weight_decay"))
        self._building = True  # torch's __init__ adds the group through add_param_group
        try:
            super().__init__([{"params": params}], defaults)
        finally:
            self._building = False
        self.last_result = None  # the StepResult of the last step()

    @property
    def pm(self):
        pm = self._pm_ref()
        if pm is None:
            raise _invalid_state("pm.optimizer: its ParameterModel is gone")
        return pm

    def add_param_group(self, param_group):
        if getattr(self, "_building", False):
            return super().add_param_group(param_group)
        raise _unsupported("pm.optimizer.add_param_group: the engine's parameters are fixed when the model is "
                           "attached; freeze or unfreeze them with requires_grad between iterations, and scale a "
                           "parameter's learning rate with pm.engine.set_lr_scale(param, scale)")

    def zero_grad(self, set_to_none: bool = True):
        """Does nothing: the engine's gradients are consumed by step()."""

    def _push_hparams(self):
        # Inside the iteration, after the backward: the step's values.
        engine = self.pm.engine
        g = self.param_groups[0]
        b1, b2 = g["betas"]
        for name, value in (("lr", g["lr"]), ("beta1", b1), ("beta2", b2), ("eps", g["eps"]),
                            ("weight_decay", g["weight_decay"])):
            value = float(value)
            if engine.hparam(name) != _as_float32(value):
                engine.set_hparam(name, value)

    @torch.no_grad()
    def step(self, closure=None):
        """Calls `closure` (with autograd enabled) when given, then ends the
        TRAIN iteration with the engine's AdamW; returns the closure's
        result.  The step's result is in ``last_result``."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        pm = self.pm
        if not pm._in_iteration:
            raise _invalid_state("pm.optimizer.step(): no TRAIN iteration in progress: run the forward and "
                                 "backward first (a use of a parameter with autograd on begins the iteration)")
        pm._complete_backward()
        self._push_hparams()
        self.last_result = pm.step()
        return loss

    def state_dict(self):
        """The engine's optimizer state (checkpoint files as uint8 tensors)
        and the group's hyperparameters."""
        pm = self.pm
        _refuse_sharded(pm, "state_dict")
        pm._settle_implicit("pm.optimizer.state_dict()")
        pm._refuse_nested("pm.optimizer.state_dict()")
        files = {}
        with tempfile.TemporaryDirectory(prefix="pstar-optim-") as d:
            pm.engine.save_checkpoint(d)
            for root, _dirs, names in os.walk(d):
                for name in sorted(names):
                    path = os.path.join(root, name)
                    with open(path, "rb") as f:
                        data = f.read()
                    files[os.path.relpath(path, d)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) \
                        if data else torch.empty(0, dtype=torch.uint8)
        groups = []
        for g in self.param_groups:
            entry = {k: v for k, v in g.items() if k != "params"}
            entry["params"] = list(range(len(g["params"])))
            groups.append(entry)
        return {"state": {}, "param_groups": groups, "pstar_format": _STATE_FORMAT, "pstar_checkpoint": files,
                "pstar_clip": pm._clip_state()}

    def load_state_dict(self, state_dict):
        """Restores what state_dict() returned: the engine's whole optimizer
        state (pstar_checkpoint_load, checksums verified) and the group's
        hyperparameters."""
        if not isinstance(state_dict, dict) or "pstar_checkpoint" not in state_dict:
            raise ValueError("pm.optimizer.load_state_dict: not a pm.optimizer state_dict (no 'pstar_checkpoint'; "
                             "the state of a torch optimizer cannot be loaded into the engine)")
        if state_dict.get("pstar_format") != _STATE_FORMAT:
            raise ValueError(f"pm.optimizer.load_state_dict: format {state_dict.get('pstar_format')!r}, this "
                             f"version reads {_STATE_FORMAT}")
        groups = state_dict.get("param_groups", [])
        if len(groups) != len(self.param_groups):
            raise ValueError(f"pm.optimizer.load_state_dict: {len(groups)} parameter groups, this optimizer has "
                             f"{len(self.param_groups)}")
        pm = self.pm
        _refuse_sharded(pm, "load_state_dict")
        pm._settle_implicit("pm.optimizer.load_state_dict()")
        pm._refuse_nested("pm.optimizer.load_state_dict()")
        with tempfile.TemporaryDirectory(prefix="pstar-optim-") as d:
            for rel, t in state_dict["pstar_checkpoint"].items():
                if os.path.isabs(rel) or ".." in rel.split(os.sep):
                    raise ValueError(f"pm.optimizer.load_state_dict: file name {rel!r} outside the checkpoint")
                path = os.path.join(d, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(t.detach().to("cpu", torch.uint8).contiguous().numpy().tobytes())
            pm.engine.load_checkpoint(d)
        for g, saved in zip(self.param_groups, groups):
            for k, v in saved.items():
                if k != "params":
                    g[k] = tuple(v) if k == "betas" else v
        pm._set_clip_state(state_dict.get("pstar_clip"))

    def __repr__(self):
        g = self.param_groups[0]
        return (f"PstarOptimizer(AdamW in libpstar; lr={g['lr']}, betas={tuple(g['betas'])}, eps={g['eps']}, "
                f"weight_decay={g['weight_decay']}, params={len(g['params'])})")


def _refuse_sharded(pm, what):
    # Each rank holds its shards: one rank's state_dict is not the state.
    world = pm.engine.stats["world_size"]
    if world > 1:
        raise _unsupported(f"pm.optimizer.{what} with world_size {world}: each rank holds only its shards of the "
                           "optimizer state; save and load it with pm.engine.save_checkpoint(dir) / "
                           "load_checkpoint(dir) on a directory every rank sees (loads at another world size too)")


def _as_float32(value: float) -> float:
    # The engine stores settings as floats (pstar_hparam_set rounds).
    import struct
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


# -- clipping -------------------------------------------------------------------

def clip_pstar(params, max_norm, norm_type=2.0, error_if_nonfinite=False):
    """clip_grad_norm_ over PstarParameters: the engine clips this
    iteration's step at max_norm; returns the engine's norm (a 0-dim
    float32 tensor on the model's device)."""
    owners = {id(p._pstar_owner): p._pstar_owner for p in params if isinstance(p, PstarParameter)}
    if len(owners) != 1:
        raise _unsupported("clip_grad_norm_: the parameters belong to several models attached to pstar.torch; "
                           "clip each model's parameters in its own call")
    pm = next(iter(owners.values()))
    others = [p for p in params if not isinstance(p, PstarParameter) and p.grad is not None]
    if others:
        raise _unsupported("clip_grad_norm_: a mix of PstarParameters and parameters with torch gradients; the "
                           "engine clips by the global norm of its own gradients: clip them in separate calls")
    if float(norm_type) != 2.0:
        raise _unsupported(f"clip_grad_norm_ with norm_type={norm_type}: the engine clips by the L2 norm only")
    given = {id(p._pstar) for p in params if isinstance(p, PstarParameter) and not p._pstar.frozen_at_attach}
    every = {id(s) for s in pm.slots if not s.frozen_at_attach}
    if given != every:
        raise _unsupported(f"clip_grad_norm_ over {len(given)} of the model's {len(every)} trainable parameters: "
                           "the engine clips by the global norm of all of them; pass model.parameters()")
    if not pm._in_iteration:
        raise _invalid_state("clip_grad_norm_: no TRAIN iteration in progress (call it after backward and before "
                             "optimizer.step())")
    max_norm = float(max_norm)
    if not max_norm >= 0.0:
        raise ValueError(f"clip_grad_norm_: max_norm {max_norm} must be >= 0")
    pm._complete_backward()
    norm = pm.engine.grad_norm()
    if error_if_nonfinite and not math.isfinite(norm):
        raise RuntimeError(f"The total norm of order {float(norm_type)} for gradients from `parameters` is "
                           "non-finite, so it cannot be clipped. To disable this error and scale the gradients "
                           "by the non-finite norm anyway, set `error_if_nonfinite=False`")
    # An infinite threshold (Trainer and Accelerate ask for the norm so)
    # clips nothing: the engine's 0.  Above the engine's range, the same.
    pm._step_clip = 0.0 if max_norm >= 1e30 else max_norm
    return torch.tensor(norm, dtype=torch.float32, device=pm.device)


_TORCH_CLIP = None
_TORCH_ADD_PARAM_GROUP = None
_ACCELERATE_CLIP = None


def _pstar_params(parameters):
    """clip_grad_norm_'s `parameters` as a list, and whether any is a
    PstarParameter (the call is then the engine's)."""
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    return params, any(isinstance(p, PstarParameter) for p in params)


def _wrap_torch_clip():
    global _TORCH_CLIP
    if _TORCH_CLIP is not None:
        return
    original = torch.nn.utils.clip_grad_norm_
    _TORCH_CLIP = original

    @functools.wraps(original)
    def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
        params, ours = _pstar_params(parameters)
        if ours:
            return clip_pstar(params, max_norm, norm_type, error_if_nonfinite)
        return original(params, max_norm, norm_type=norm_type, error_if_nonfinite=error_if_nonfinite,
                        foreach=foreach)

    clip_grad_norm_._pstar_wrapped = original
    torch.nn.utils.clip_grad_norm_ = clip_grad_norm_
    torch.nn.utils.clip_grad.clip_grad_norm_ = clip_grad_norm_


def _wrap_add_param_group():
    global _TORCH_ADD_PARAM_GROUP
    if _TORCH_ADD_PARAM_GROUP is not None:
        return
    original = torch.optim.Optimizer.add_param_group
    _TORCH_ADD_PARAM_GROUP = original

    @functools.wraps(original)
    def add_param_group(self, param_group):
        if not isinstance(self, PstarOptimizer) and isinstance(param_group, dict):
            params = param_group.get("params")
            if params is not None and not isinstance(params, (torch.Tensor, set)):
                params = param_group["params"] = list(params)
            for p in ([params] if isinstance(params, torch.Tensor) else params or ()):
                if isinstance(p, PstarParameter):
                    raise _unsupported(f"{type(self).__module__}.{type(self).__name__} over the parameters of a "
                                       f"model attached to pstar.torch ('{p._pstar.name}'): their gradients go to "
                                       f"the engine, so a torch optimizer would never see one; {_ADVICE}")
        return original(self, param_group)

    torch.optim.Optimizer.add_param_group = add_param_group


def _wrap_accelerate():
    """Accelerate (once it is imported): Accelerator.clip_grad_norm_ over
    PstarParameters is the engine's clipping, and prepare() leaves
    pm.optimizer's state where the engine keeps it (AcceleratedOptimizer's
    device placement would round-trip the whole optimizer state through
    state_dict() and load_state_dict(), and onto the accelerator)."""
    global _ACCELERATE_CLIP
    if _ACCELERATE_CLIP is not None or "accelerate" not in sys.modules:
        return
    try:
        from accelerate import Accelerator
        from accelerate.optimizer import AcceleratedOptimizer
    except Exception:  # an accelerate that does not import: nothing to wrap
        return
    original = Accelerator.clip_grad_norm_
    _ACCELERATE_CLIP = original
    init = AcceleratedOptimizer.__init__

    @functools.wraps(init)
    def accelerated_init(self, optimizer, device_placement=True, scaler=None, *args, **kwargs):
        if isinstance(optimizer, PstarOptimizer):
            device_placement = False
        init(self, optimizer, device_placement, scaler, *args, **kwargs)

    AcceleratedOptimizer.__init__ = accelerated_init

    @functools.wraps(original)
    def clip_grad_norm_(self, parameters, max_norm, norm_type=2):
        params, ours = _pstar_params(parameters)
        if ours:
            return clip_pstar(params, max_norm, norm_type)
        return original(self, params, max_norm, norm_type)

    Accelerator.clip_grad_norm_ = clip_grad_norm_


class _AccelerateImportHook:
    """A meta path finder that wraps Accelerate when it is imported after
    pstar.torch (it finds nothing itself: it lets the import run, then wraps)."""

    def find_spec(self, name, path=None, target=None):
        if name != "accelerate" or _ACCELERATE_CLIP is not None:
            return None
        import importlib.util
        sys.meta_path.remove(self)  # the real finder, then this one again
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            _wrap_accelerate()

        spec.loader.exec_module = exec_and_wrap
        return spec


_IMPORT_HOOK = _AccelerateImportHook()


def install_hooks():
    """Wraps torch's clip_grad_norm_ and Optimizer.add_param_group (once),
    and Accelerate now if it is imported, else when it is."""
    _wrap_torch_clip()
    _wrap_add_param_group()
    _wrap_accelerate()
    if _ACCELERATE_CLIP is None and _IMPORT_HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _IMPORT_HOOK)


def is_clipping_frame(code) -> bool:
    """A frame of a gradient-clipping function that reads p.grad (torch's
    own, kept by a caller from before the wrap, or another library's)."""
    return "clip_grad" in code.co_name

