"""pstar.torch: the parameters of a torch.nn.Module in libpstar chunks.

    model = MyModel()
    pm = pstar.torch.attach(model, compute_dtype="f32", device_capacity_bytes=...)
    for x, y in data:
        with pm.train_iteration():
            loss = loss_fn(model(x), y)
            loss.backward()
            pm.step()              # libpstar's AdamW; ends the iteration

How it works, at the tensor level (no module hooks, so it sees every use):

- Each parameter becomes a ``PstarParameter`` (an nn.Parameter subclass)
  whose own storage is empty; its values live in the engine.  Any torch
  function that receives it (``F.linear(x, self.weight)``, ``w.t()``,
  ``emb.weight @ h.T`` in a tied head, a parameter used outside its module)
  goes through ``__torch_function__``: inside an iteration the parameter is
  acquired (FORWARD, or RECOMPUTE inside a backward pass: activation
  checkpointing), a zero-copy view of the chunk memory stands in for it in
  the call, and it is released right after.  (The view comes from a tensor
  of the parameter's memory made through DLPack once per address it
  occupies; the release checks, by the storage's references, that no other
  view of it is alive.)  Metadata (shape,
  dtype, device...) is answered without acquiring: the device and dtype are
  those the parameter computes in (the engine's).
- Outside an iteration a parameter reads as a copy of its current weights
  in the compute dtype (``engine.read``, no acquire): ``state_dict()``,
  ``torch.save``, ``save_pretrained``, inference under ``torch.no_grad()``,
  ``generate()``.  ``copy_`` into it (``load_state_dict``) writes the engine
  (``pstar_param_write``); every other write is refused with an error that
  says what to do.
- The stand-in comes out of a small autograd Function per use, so autograd
  calls back once per use in backward: there the gradient is written to the
  engine (pstar_grad_write, in the compute dtype: the engine sums in fp32)
  between a BACKWARD acquire and its release.
  Tied weights and modules called twice make several uses: the engine adds
  their gradients.  A parameter no gradient reached gets no BACKWARD use at
  all, and the engine leaves it untouched (no weight decay, no moment
  update), as torch does for a parameter whose ``grad`` is None.
- Saved tensors: a pstar.torch iteration installs saved-tensor hooks, so an
  op that saves the stand-in for backward saves a handle instead; when
  backward needs it, the parameter is acquired (BACKWARD) and a fresh
  zero-copy tensor is returned (a parameter that takes no gradient: a copy,
  acquired for RECOMPUTE and released at once).  The chunk is thus free to
  move between forward and backward, as the engine decides.
- A result that aliases chunk memory (``w.t()`` returned to the caller) is
  copied before the release, so no tensor outlives its acquire.  Inside a
  checkpoint's recomputation, the stand-in is a copy too.  Both checkpoint
  modes work: non-reentrant (the original forward's graph writes the
  gradients; the recomputed one is never walked) and reentrant (the forward
  ran without a graph; the recomputed graph is walked, and its uses write
  the gradients).
- Leaving ``train_iteration()`` by an exception, or without ``step()``,
  abandons the iteration (pstar_iteration_abort): nothing is updated and the
  next iteration starts clean.

Refused with an error that says what to do: in-place writes to parameters
inside an iteration or other than ``copy_`` (use ``ParameterModel.write``),
``.data``, moving or converting the module after attach (``.to`` to another
device or dtype, ``.cuda()``, ``.float()``), ``copy.deepcopy``, pickling a
parameter, ``torch.compile``, unfreezing a parameter that was frozen at
attach.  Documented: gradients go to the engine, so ``p.grad`` stays None
(a warning says so once); ``pm.optimizer`` is the torch.optim.Optimizer
over the engine's AdamW, torch's and Accelerate's ``clip_grad_norm_`` clip
in the engine, and a torch optimizer over attached parameters is refused
(pstar/_torch_optim.py); autocast, sparse or complex parameters, DDP
wrappers are not supported.
"""
import contextlib
import gc
import inspect
import sys
import traceback
import warnings
import weakref

import torch

from ._engine import Engine, Options, View
from ._errors import BusyError, InvalidArgumentError, InvalidStateError, PstarError, UnsupportedError, check
from . import _dlpack
from . import capi as _c

_TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
_ENGINE_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
# Gradients pstar_grad_write takes as they are (the engine sums them in fp32).
_GRAD_DTYPES = {torch.float32: _c.PSTAR_DTYPE_F32, torch.float16: _c.PSTAR_DTYPE_F16,
                torch.bfloat16: _c.PSTAR_DTYPE_BF16}
_STAGES = {"forward": _c.PSTAR_STAGE_FORWARD, "backward": _c.PSTAR_STAGE_BACKWARD,
           "recompute": _c.PSTAR_STAGE_RECOMPUTE}
# References to a storage (C++ use count): the tensors of chunk memory alive.
_storage_refs = torch._C._storage_Use_Count


def _unsupported(message):
    return UnsupportedError(_c.PSTAR_ERR_UNSUPPORTED, "PSTAR_ERR_UNSUPPORTED", message)


def _invalid_state(message):
    return InvalidStateError(_c.PSTAR_ERR_INVALID_STATE, "PSTAR_ERR_INVALID_STATE", message)


# Tensor attributes and methods that read metadata only, answered without an
# acquire.  The value names how (see ParameterModel._metadata); "meta": from
# a meta tensor of the parameter's shape, dtype and requires_grad.  (Keys
# are compared by equality: `torch.Tensor.device.__get__` is a new object at
# every access.)
_METADATA = {
    torch.Tensor.size: "meta", torch.Tensor.dim: "meta", torch.Tensor.numel: "meta",
    torch.Tensor.nelement: "meta", torch.Tensor.__len__: "meta", torch.Tensor.stride: "meta",
    torch.Tensor.element_size: "meta", torch.Tensor.is_floating_point: "meta", torch.Tensor.is_complex: "meta",
    torch.Tensor.is_contiguous: "meta", torch.Tensor.storage_offset: "meta",
    torch.Tensor.shape.__get__: "meta", torch.Tensor.dtype.__get__: "meta", torch.Tensor.ndim.__get__: "meta",
    torch.Tensor.layout.__get__: "meta", torch.Tensor.requires_grad.__get__: "meta",
    torch.Tensor.is_leaf.__get__: "meta", torch.Tensor.is_sparse.__get__: "meta",
    torch.Tensor.is_quantized.__get__: "meta", torch.Tensor.itemsize.__get__: "meta",
    torch.Tensor.nbytes.__get__: "meta",
    torch.Tensor.device.__get__: "device", torch.Tensor.is_cuda.__get__: "is_cuda",
    torch.Tensor.is_cpu.__get__: "is_cpu", torch.Tensor.is_meta.__get__: "false",
    torch.Tensor.get_device: "get_device", torch.Tensor.grad_fn.__get__: "none",
    torch.Tensor.grad.__get__: "grad", torch.Tensor.grad.__set__: "grad_set",
    torch.Tensor._grad.__get__: "grad", torch.Tensor.__hash__: "hash",
    torch.Tensor.data.__get__: "data", torch.Tensor.data.__set__: "data",
    torch.Tensor.requires_grad.__set__: "requires_grad_set", torch.Tensor.requires_grad_: "requires_grad_",
    torch.Tensor.__reduce_ex__: "pickle", torch.Tensor.__deepcopy__: "deepcopy",
}

# In-place dunders (the other in-place methods end in "_").
_INPLACE_DUNDERS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
                    "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__"}

# Reads outside an iteration that are fine with autograd enabled (the copy
# takes no gradient, as the caller expects of them).
_PLAIN_READS = {torch.Tensor.detach}


def _is_inplace(func, args, kwargs):
    name = getattr(func, "__name__", "")
    if name in _INPLACE_DUNDERS or (name.endswith("_") and not name.startswith("__")):
        return args and isinstance(args[0], PstarParameter)
    out = kwargs.get("out")
    return out is not None and any(isinstance(o, PstarParameter) for o in _flatten(out))


class PstarParameter(torch.nn.Parameter):
    """A parameter whose values live in a libpstar chunk (see the module doc)."""

    _pstar = None        # the _Slot of this parameter
    _pstar_owner = None  # its ParameterModel (the model's parameters keep it alive)

    def __new__(cls, data, slot, owner):
        p = torch.Tensor._make_subclass(cls, data, data.requires_grad)
        p._pstar = slot
        p._pstar_owner = owner
        return p

    def __repr__(self):
        return f"PstarParameter(name={self._pstar.name!r}, shape={tuple(self._pstar.shape)})"

    def __deepcopy__(self, memo):
        raise _unsupported(f"{self._pstar.name}: a model attached to pstar.torch cannot be deep-copied (its "
                           "parameters live in the engine): copy the model before attach, or build a new one and "
                           "load_state_dict(pm.state_dict()) into it")

    def __reduce_ex__(self, proto):
        raise _unsupported(f"{self._pstar.name}: a PstarParameter cannot be pickled (torch.save(model)): save "
                           "model.state_dict() (copies of the weights) or pm.engine.save_checkpoint(dir)")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        slots = []
        owner = None
        for a in _leaves(args, kwargs):
            if isinstance(a, PstarParameter) and a._pstar not in slots:
                slots.append(a._pstar)
                owner = owner or a._pstar_owner
        if not slots:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        if torch.compiler.is_compiling():
            raise _unsupported("torch.compile of a model attached to pstar.torch is not supported (its parameters "
                               "are acquired from the engine at every use): call the model uncompiled")
        how = _METADATA.get(func)
        if how is not None:
            return owner._metadata(how, func, slots[0], args, kwargs)
        if _is_inplace(func, args, kwargs):
            return owner._inplace(func, slots, args, kwargs)
        if not owner._in_iteration:
            if not torch.is_grad_enabled() or func in _PLAIN_READS:
                return owner._read_outside(func, slots, args, kwargs)
            # A use with autograd outside an iteration: the forward of a
            # training step written without train_iteration().
            owner._begin_implicit()
        return owner._call(func, slots, args, kwargs)


def _leaves(args, kwargs):
    """The arguments' leaves in _flatten's order; without nesting (F.linear(x,
    w, b), the usual call) the arguments themselves."""
    for a in args:
        if isinstance(a, (list, tuple, dict)):
            return _flatten((args, kwargs))
    for a in kwargs.values():
        if isinstance(a, (list, tuple, dict)):
            return _flatten((args, kwargs))
    return (*args, *kwargs.values()) if kwargs else args


def _replace_args(args, subst):
    # _replace of the positional arguments, a leaf at a time.
    return tuple(subst[id(a._pstar)] if isinstance(a, PstarParameter)
                 else _replace(a, subst) if isinstance(a, (list, tuple, dict)) else a for a in args)


def _replace(obj, subst):
    if isinstance(obj, PstarParameter):
        return subst[id(obj._pstar)]
    if isinstance(obj, list):
        return [_replace(o, subst) for o in obj]
    if isinstance(obj, tuple):
        return tuple(_replace(o, subst) for o in obj)
    if isinstance(obj, dict):
        return {k: _replace(v, subst) for k, v in obj.items()}
    return obj


class _Slot:
    """Bookkeeping of one parameter: its engine Param and open views.

    `owner` is a weak reference: the ParameterModel holds its slots, and the
    model's PstarParameters hold the ParameterModel (no reference cycle, so
    dropping the model and the ParameterModel frees the engine at once)."""

    def __init__(self, owner, name, param, shape, requires_grad):
        self.owner = weakref.ref(owner)
        self.name = name
        self.param = param
        self.shape = torch.Size(shape)
        self.requires_grad = requires_grad
        self.frozen_at_attach = not requires_grad  # the engine keeps no optimizer state for it
        self.held = None        # the View while acquired
        self.held_count = 0     # uses sharing it
        # The tensor of the chunk memory at one address, kept while the
        # parameter stays there: (address, tensor, its storage, the storage's
        # references when no other tensor of it is alive).  A use is a view
        # of it, and the release checks that no view outlives it.
        self.chunk = None
        self.reset_counts()

    def reset_counts(self):
        # Engine acquires this iteration (a held View shared by several uses
        # is one acquire): what the engine counts, so what step() pads.
        self.engine_forward = 0
        self.engine_backward = 0
        self.unpacked = 0       # BACKWARD holds from unpack awaiting their use's gradient


class _Use(torch.autograd.Function):
    """One use of a parameter: forward hands out the chunk tensor, backward
    writes this use's gradient to the engine.  `recomputed`: a use inside a
    checkpoint's recomputation (see _call), whose backward runs only when
    the recomputed graph is the one walked (reentrant checkpointing, whose
    forward built no graph); it never reuses a BACKWARD hold of unpack."""

    @staticmethod
    def forward(ctx, anchor, tensor, slot, recomputed):
        ctx.slot = slot
        ctx.recomputed = recomputed
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        ctx.slot.owner()._backward_use(ctx.slot, grad, reuse_unpacked=not ctx.recomputed)
        return None, None, None, None


class _Packed:
    """A saved stand-in: the slot and the view's geometry in the chunk."""

    __slots__ = ("slot", "size", "stride", "offset")

    def __init__(self, slot, t):
        self.slot = slot
        self.size = t.size()
        self.stride = t.stride()
        self.offset = t.storage_offset()


def _guarded_apply(module_ref):
    """Module._apply of an attached module (model.to, .cuda(), .float(),
    .half()...): buffers are converted as usual; parameters only when the
    conversion changes nothing (model.to(model.device) stays a no-op),
    otherwise refused."""

    def _apply(fn, recurse=True):
        module = module_ref()
        owner = next((p._pstar_owner for p in module.parameters() if isinstance(p, PstarParameter)), None)
        if owner is not None:
            here = f"the module's parameters live in a libpstar engine that computes in {owner.dtype} on {owner.device}"
            advice = ("convert the model before attach, or create the engine with the compute_dtype and device "
                      "wanted")
            try:
                with torch.no_grad():
                    probe = fn(torch.empty(1, dtype=owner.dtype, device=owner.device))
            except Exception as e:
                raise _unsupported(f"{here}; moving or converting them after attach is not supported ({e}): "
                                   f"{advice}") from e
            if probe.dtype != owner.dtype or probe.device != owner.device:
                raise _unsupported(f"{here}; converting them to {probe.dtype} on {probe.device} after attach is "
                                   f"not supported: {advice}")
        # The parameters stay; buffers (and submodules, whose own _apply is
        # guarded too) are converted.
        if recurse:
            for child in module.children():
                child._apply(fn)
        for key, buf in module._buffers.items():
            if buf is not None:
                module._buffers[key] = fn(buf)
        return module

    return _apply


class ParameterModel:
    """A module whose parameters live in a libpstar engine."""

    def __init__(self, module: torch.nn.Module, engine: Engine):
        self._module = weakref.ref(module)
        self.engine = engine
        self.dtype = _TORCH_DTYPES[engine.compute_dtype]
        self.device = torch.device("cpu") if engine.device == "emulated" else torch.device(
            "cuda", engine.options.device_ordinal)
        self.slots = []
        self._live = {}  # storage address of a held view -> slot (while acquired in forward)
        self._in_iteration = False
        self._implicit = False   # the iteration was begun by a use, not by train_iteration()
        self._warned_grad = False
        self._warned_abandon = False
        # Clipping asked by clip_grad_norm_ (pstar/_torch_optim.py) holds for
        # one step: _step_clip is this iteration's max_norm; the engine's own
        # threshold (_clip_base: the option, or what the user set since) is
        # put back at the next step that asks for none.  _clip_set: the
        # value this model last wrote (another value found in the engine
        # was set by the user and becomes the base).
        self._step_clip = None
        self._clip_base = engine.hparam("clip_norm")
        self._clip_set = None
        self._optimizer_ref = None

    @property
    def module(self):
        """The attached module (None once it is gone)."""
        return self._module()

    @property
    def optimizer(self):
        """The engine's AdamW as a torch.optim.Optimizer (pstar._torch_optim
        .PstarOptimizer), for Trainer, Accelerate, Lightning and torch's LR
        schedulers.  One per model: the same object while it is alive."""
        opt = self._optimizer_ref() if self._optimizer_ref is not None else None
        if opt is None:
            _torch_optim.install_hooks()
            opt = _torch_optim.PstarOptimizer(self)
            self._optimizer_ref = weakref.ref(opt)
        return opt

    # -- setup -------------------------------------------------------------
    def _adopt(self, module, init=None):
        seen = {}
        for mod_name, mod in module.named_modules():
            for pname, p in list(mod._parameters.items()):
                if p is None:
                    continue
                if id(p) in seen:  # tied: the same PstarParameter
                    mod._parameters[pname] = seen[id(p)]
                    continue
                if isinstance(p, PstarParameter):
                    raise _unsupported(f"{mod_name}.{pname}: already attached to pstar.torch")
                if p.is_sparse or p.is_complex():
                    raise ValueError(f"{mod_name}.{pname}: sparse and complex parameters are not supported")
                full = f"{mod_name}.{pname}" if mod_name else pname
                param = self.engine.register(full, tuple(p.shape) or (1,), frozen=not p.requires_grad)
                if p.device.type == "meta" and init is None:
                    raise ValueError(f"{full}: on the meta device (no values); pass attach(..., init=fn), where "
                                     f"fn(name, tensor) fills a CPU float32 tensor of the parameter's shape")
                slot = _Slot(self, full, param, p.shape, p.requires_grad)
                # The values are read one parameter at a time after the build
                # (no fp32 copy of the whole model beside the engine's lists).
                slot.initial = p
                self.slots.append(slot)
                placeholder = torch.empty(0, dtype=self.dtype, device=self.device)
                placeholder.requires_grad_(p.requires_grad)
                new = PstarParameter(placeholder, slot, self)
                slot.param_ref = weakref.ref(new)  # weak: the parameter holds this ParameterModel
                seen[id(p)] = new
                mod._parameters[pname] = new
        self.engine.build()
        for slot in self.slots:
            p = slot.initial
            del slot.initial
            if p.device.type == "meta":
                values = torch.empty(tuple(p.shape), dtype=torch.float32)
                with torch.no_grad():
                    init(slot.name, values)
            else:
                values = p.detach().to("cpu", torch.float32).contiguous()
            del p
            self.engine.write(slot.param, values.numpy().reshape(-1))
            del values
        for mod in module.modules():
            mod._apply = _guarded_apply(weakref.ref(mod))

    # -- iterations ---------------------------------------------------------
    def _begin_implicit(self):
        # The TRAIN iteration of a loop written as for a torch optimizer
        # (forward, backward, pm.step()): begun by the first use, ended by
        # step() or abandon_iteration().  The saved-tensor hooks are pushed
        # now and popped then.
        self.engine_iteration_begin()
        torch._C._autograd._push_saved_tensors_default_hooks(self._pack, self._unpack)
        self._implicit = True

    def _end_implicit(self):
        if self._implicit:
            self._implicit = False
            torch._C._autograd._pop_saved_tensors_default_hooks()

    def _settle_implicit(self, what):
        # An iteration begun implicitly by a forward with autograd on (a
        # notebook's model(x)) that never reached backward: abandoned, with
        # the bits of one never begun, so that it does not trap the model.
        if not (self._in_iteration and self._implicit):
            return
        if any(s.engine_backward or s.unpacked for s in self.slots):
            return
        self.abandon_iteration()
        if not self._warned_abandon:
            self._warned_abandon = True
            warnings.warn(f"pstar.torch: {what}: a forward with autograd on outside train_iteration() began a TRAIN "
                          "iteration that no backward followed; it was abandoned (nothing updated). Use "
                          "torch.no_grad() or pm.eval_iteration() for a forward without training",
                          RuntimeWarning, stacklevel=3)

    def _refuse_nested(self, what):
        if self._in_iteration:
            how = ("begun implicitly by a use of a parameter with autograd outside train_iteration()"
                   if self._implicit else "in progress")
            raise _invalid_state(f"{what}: a TRAIN iteration is {how}: end it with pm.step(), or "
                                 "pm.abandon_iteration() to drop it")

    @contextlib.contextmanager
    def train_iteration(self):
        """A TRAIN iteration: forward, backward and step() inside.  Leaving
        it by an exception, or without step(), abandons the iteration:
        nothing is updated (a warning says so in the second case)."""
        self._settle_implicit("train_iteration()")
        self._refuse_nested("train_iteration()")
        self.engine_iteration_begin()
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield self
        except BaseException as e:
            self._abandon_after(e)
            raise
        if self._in_iteration:
            self.abandon_iteration()
            warnings.warn("pstar.torch: train_iteration() left without pm.step(): the iteration was abandoned, "
                          "nothing was updated", RuntimeWarning, stacklevel=3)

    @contextlib.contextmanager
    def eval_iteration(self):
        """An EVAL iteration (forward only, no autograd graph)."""
        self._settle_implicit("eval_iteration()")
        self._refuse_nested("eval_iteration()")
        check(_c.pstar_iteration_begin(self.engine._handle(), _c.PSTAR_ITERATION_EVAL), "pstar_iteration_begin")
        self._in_iteration = True
        try:
            with torch.no_grad():
                yield self
        except BaseException as e:
            self._abandon_after(e)
            raise
        self._in_iteration = False
        check(_c.pstar_iteration_end(self.engine._handle()), "pstar_iteration_end")

    def engine_iteration_begin(self):
        check(_c.pstar_iteration_begin(self.engine._handle(), _c.PSTAR_ITERATION_TRAIN), "pstar_iteration_begin")
        self._in_iteration = True
        for s in self.slots:
            s.reset_counts()

    def abandon_iteration(self):
        """Ends the iteration in progress without updating anything
        (pstar_iteration_abort): the engine releases what is acquired and
        discards this iteration's gradients."""
        if not self._in_iteration:
            raise _invalid_state("abandon_iteration(): no pstar.torch iteration in progress")
        self._in_iteration = False
        self._step_clip = None
        self._end_implicit()
        self._forget_views()
        self.engine.abort_iteration()

    def _abandon_after(self, error):
        # The caller's exception is what propagates; an abort that fails too
        # (a data-parallel engine refuses it) is noted on it.
        if not self._in_iteration:
            return
        try:
            self.abandon_iteration()
        except PstarError as abort_error:
            error.add_note(f"pstar.torch: the iteration could not be abandoned: {abort_error}")

    def _forget_views(self):
        # The engine releases (or has released) them; tensors made from the
        # views may still be alive in a traceback.
        for s in self.slots:
            if s.held is not None:
                s.held.released = True
            s.held = None
            s.held_count = 0
            s.reset_counts()
        self._live.clear()

    def step(self):
        """Ends the TRAIN iteration with the engine's AdamW."""
        if not self._in_iteration:
            raise _invalid_state("step(): no pstar.torch TRAIN iteration in progress (train_iteration(), or a use "
                                 "of a parameter with autograd on, begins one)")
        self._complete_backward()
        self._apply_step_clip()
        result = self.engine.step()  # on an error the iteration stays open (retry, or abandon)
        self._in_iteration = False
        self._step_clip = None
        self._end_implicit()
        return result

    def _apply_step_clip(self):
        # Inside the iteration, before the step: no wait for the step in flight.
        engine = self.engine
        current = engine.hparam("clip_norm")
        if self._clip_set is not None and current != self._clip_set:
            self._clip_base, self._clip_set = current, None  # the user's own setting since
        if self._step_clip is not None:
            want = self._step_clip
        elif self._clip_set is not None:
            want = self._clip_base  # back from the last step's clip_grad_norm_
        else:
            return
        engine.set_hparam("clip_norm", want)
        self._clip_set = engine.hparam("clip_norm") if self._step_clip is not None else None

    def _clip_state(self):
        return {"base": self._clip_base, "set": self._clip_set}

    def _set_clip_state(self, state):
        # After a checkpoint load (pm.optimizer.load_state_dict): the engine's
        # threshold is the saved run's, and so is what it was overridden by.
        if state:
            self._clip_base, self._clip_set = state["base"], state["set"]
        else:
            self._clip_base, self._clip_set = self.engine.hparam("clip_norm"), None

    def _complete_backward(self):
        """Ends every use still open before the step (or the norm)."""
        for s in self.slots:
            while s.held is not None:
                self._release(s)
            # Uses whose backward never ran (a use that did not reach the
            # loss, a parameter that takes no gradient now): when some use
            # of the parameter had a backward, one BACKWARD use each, so
            # that the engine sees every use ended and sums the gradients
            # that came.  A parameter no gradient reached keeps its missing
            # uses: the engine does not update it.
            if s.engine_backward > 0:
                while s.engine_backward < s.engine_forward:
                    self._acquire(s, "backward")
                    self._release(s)

    # -- acquire / release -------------------------------------------------------
    def _stream(self):
        """torch's current stream on a CUDA engine (its cudaStream_t as an
        integer), so that the engine's copies and the model's kernels are
        ordered on it without device-wide syncs; None (the default stream,
        and nothing on the emulated device) otherwise."""
        if self.device.type != "cuda":
            return None
        return torch.cuda.current_stream(self.device).cuda_stream

    def _acquire(self, slot, stage):
        if slot.held is None:
            self._hold(slot, stage)
        slot.held_count += 1
        return slot.chunk[1].view(slot.shape)

    def _hold(self, slot, stage):
        # One engine acquire, shared by the uses until the last release.
        stream = self._stream()
        address = check(_c.pstar_param_acquire(self.engine._handle(), slot.param.id, _STAGES[stage], stream),
                        "pstar_param_acquire")
        slot.held = View(self.engine, slot.param, address, stage, stage != "forward", stream)
        slot.held_count = 0
        if stage == "forward":
            slot.engine_forward += 1
        elif stage == "backward":
            slot.engine_backward += 1
        chunk = slot.chunk
        if chunk is None or chunk[0] != address or _storage_refs(chunk[2]._cdata) != chunk[3]:
            # A new address (or tensors of the old one still alive, from an
            # abandoned iteration): a tensor of this memory, through DLPack
            # once (torch ignores the read-only flag, so one serves every
            # stage).  Uses made from it are views, so the storage's
            # references count them.
            capsule = _dlpack.make_capsule(address, slot.param.shape, self.engine.compute_dtype,
                                           slot.held.__dlpack_device__(), read_only=False, versioned=False)
            t = torch.from_dlpack(capsule)
            t = t.view(slot.shape) if slot.shape else t.view(())
            storage = t.untyped_storage()
            slot.chunk = (address, t, storage, _storage_refs(storage._cdata))

    def _views_alive(self, slot):
        """Tensors of the slot's chunk memory alive beside its own."""
        chunk = slot.chunk
        return _storage_refs(chunk[2]._cdata) - chunk[3] if chunk is not None else 0

    def _release(self, slot):
        slot.held_count -= 1
        if slot.held_count <= 0 and slot.held is not None:
            view = slot.held
            alive = self._views_alive(slot)
            if alive:  # tensors of chunk memory in reference cycles: collect them first
                gc.collect()
                alive = self._views_alive(slot)
                if alive:
                    slot.held_count = 1  # still held, by this last use
                    raise BusyError(_c.PSTAR_ERR_BUSY, "PSTAR_ERR_BUSY",
                                    f"{alive} tensor(s) of {slot.name!r}'s chunk memory still alive at its release",
                                    "pstar_param_release")
            try:
                view.release()
            except BusyError:
                slot.held_count = 1  # still held, by this last use
                raise
            slot.held = None
            slot.held_count = 0

    # -- the interception -------------------------------------------------------
    def _metadata(self, how, func, slot, args, kwargs):
        if how == "device":
            return self.device
        if how == "is_cuda":
            return self.device.type == "cuda"
        if how == "is_cpu":
            return self.device.type == "cpu"
        if how == "false":
            return False
        if how == "get_device":
            return self.device.index if self.device.type == "cuda" else -1
        if how == "none":
            return None
        if how == "hash":
            return object.__hash__(args[0])
        if how == "grad":
            self._grad_read(slot)
            return None
        if how == "grad_set":
            if args[1] is not None:
                raise _unsupported(f"{slot.name}: a PstarParameter's gradient goes to the engine; .grad cannot be "
                                   "set")
            return None
        if how == "data":
            raise _unsupported(f"{slot.name}: .data of a PstarParameter: read a copy with p.detach() (or "
                               "pm.read(p), fp32), write with pm.write(p, values) or load_state_dict() between "
                               "iterations")
        if how in ("requires_grad_set", "requires_grad_"):
            flag = args[1] if len(args) > 1 else kwargs.get("requires_grad", True)
            self._set_requires_grad(slot, args[0], bool(flag))
            return args[0] if how == "requires_grad_" else None
        if how == "pickle":
            return args[0].__reduce_ex__(*args[1:])
        if how == "deepcopy":
            return args[0].__deepcopy__(*args[1:])
        stand_in = torch.empty(slot.shape, dtype=self.dtype, device="meta")
        stand_in.requires_grad_(slot.requires_grad)
        args = tuple(stand_in if isinstance(a, PstarParameter) else a for a in args)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    def _grad_read(self, slot):
        # p.grad is None.  Read by a clipping function that was not routed
        # to the engine, that None would make a norm of 0 and clip nothing:
        # refused.  Read by zero_grad (which sets it to None): silent.
        frame = sys._getframe(3)  # _grad_read <- _metadata <- __torch_function__ <- the reader
        for _ in range(4):
            if frame is None:
                break
            if frame.f_code in _ZERO_GRAD_CODES or frame.f_code.co_name in _NONE_TESTING_READERS:
                return
            if _torch_optim.is_clipping_frame(frame.f_code):
                raise _unsupported(f"{slot.name}: {frame.f_code.co_name} read p.grad of a PstarParameter, which is "
                                   "None (gradients go to the engine), so it would clip nothing and report a norm "
                                   "of 0; call torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) or "
                                   "accelerator.clip_grad_norm_ (both routed to the engine once pstar.torch is "
                                   "imported), or set the engine's clip_norm")
            frame = frame.f_back
        if self._warned_grad:
            return
        self._warned_grad = True
        warnings.warn("pstar.torch: a PstarParameter's .grad is always None: gradients go to the engine, whose AdamW "
                      "is the optimizer (pm.optimizer, or pm.step()). torch.nn.utils.clip_grad_norm_ over the "
                      "model's parameters is routed to the engine; code that reads p.grad itself sees nothing",
                      UserWarning, stacklevel=5)

    def _set_requires_grad(self, slot, param, flag):
        if flag == slot.requires_grad:
            return
        self._settle_implicit("requires_grad_")
        if self._in_iteration:
            raise _invalid_state(f"{slot.name}: requires_grad changed inside an iteration; freeze or unfreeze "
                                 "between iterations")
        if flag and slot.frozen_at_attach:
            raise _unsupported(f"{slot.name}: was frozen when attached, so the engine keeps no fp32 master or Adam "
                               "state for it; set requires_grad=True before attach to train it (and freeze it "
                               "after attach if it should start frozen)")
        slot.requires_grad = flag
        with torch._C.DisableTorchFunctionSubclass():
            torch.Tensor.requires_grad_(param, flag)

    def _snapshot(self, slot):
        """The parameter's current weights in the compute dtype (a copy)."""
        if self.dtype == torch.bfloat16:
            t = torch.from_numpy(self.engine.read(slot.param, dtype="bf16")).view(torch.bfloat16)
        elif self.dtype == torch.float16:
            t = torch.from_numpy(self.engine.read(slot.param, dtype="f16"))
        else:
            t = torch.from_numpy(self.engine.read(slot.param))
        t = t.reshape(slot.shape)
        return t if self.device.type == "cpu" else t.to(self.device)

    def _read_outside(self, func, slots, args, kwargs):
        # Outside an iteration, without autograd: copies of the current
        # weights stand in.
        subst = {id(s): self._snapshot(s) for s in slots}
        with torch._C.DisableTorchFunctionSubclass():
            return func(*_replace(args, subst), **_replace(kwargs, subst))

    def _inplace(self, func, slots, args, kwargs):
        target = args[0] if args and isinstance(args[0], PstarParameter) else None
        if func == torch.Tensor.copy_ and target is not None:
            self._settle_implicit("copy_ into a parameter (load_state_dict)")
        if func == torch.Tensor.copy_ and target is not None and not self._in_iteration:
            # load_state_dict() and p.copy_(values): written into the engine.
            src = args[1]
            if isinstance(src, PstarParameter):
                src = src._pstar_owner._snapshot(src._pstar)
            src = torch.as_tensor(src)
            if src.shape != target._pstar.shape:
                src = src.expand(target._pstar.shape)
            self.write(target, src)
            return target
        name = getattr(func, "__name__", repr(func))
        where = "inside an iteration" if self._in_iteration else "on a PstarParameter"
        raise _unsupported(f"{slots[0].name}: in-place {name} {where} is not supported (its values live in the "
                           "engine): write new values between iterations with pm.write(p, values), p.copy_(values) "
                           "or model.load_state_dict(...)")

    def _call(self, func, slots, args, kwargs):
        in_backward = torch._C._current_autograd_node() is not None
        stage = "recompute" if in_backward else "forward"
        subst = {}
        out = None
        failure = None
        try:
            for slot in slots:
                t = self._acquire(slot, stage)
                if in_backward:
                    # A checkpoint's recomputation keeps what it saves until
                    # that backward runs: hand it a copy, not chunk memory,
                    # through a Function of the same shape as in forward (so
                    # the ops save the same tensors).
                    t = t.clone()
                    if slot.requires_grad and torch.is_grad_enabled():
                        anchor = args_anchor((args, kwargs), slot)
                        with torch._C.DisableTorchFunctionSubclass():
                            t = _Use.apply(anchor, t, slot, True)
                elif torch.is_grad_enabled():
                    # A use autograd may come back to: what the op saves of
                    # it is packed into a handle (_pack).
                    self._live[slot.held.address] = slot  # the storage of t starts there
                    if slot.requires_grad:
                        anchor = args_anchor((args, kwargs), slot)
                        with torch._C.DisableTorchFunctionSubclass():
                            t = _Use.apply(anchor, t, slot, False)
                subst[id(slot)] = t
            t = None
            with torch._C.DisableTorchFunctionSubclass():
                out = func(*_replace_args(args, subst), **(_replace(kwargs, subst) if kwargs else kwargs))
            out = self._detach_aliases(out, slots)
        except BaseException as e:
            failure = e
            if isinstance(e, InvalidStateError) and "after its backward began" in str(e):
                raise _invalid_state(f"{e.message}. In pstar.torch: a second forward before optimizer.step() or "
                                     "pm.step() (gradient accumulation: Trainer's gradient_accumulation_steps, "
                                     "accelerator.accumulate, Lightning's accumulate_grad_batches) needs "
                                     "attach(..., grad_accumulation=1); otherwise end each iteration with "
                                     "pm.optimizer.step() or pm.step()") from e
            raise
        finally:
            # No tensor of chunk memory may outlive the release.
            subst.clear()
            t = None
            for slot in slots:
                if self._live:
                    self._live = {k: v for k, v in self._live.items() if v is not slot}
                if slot.held is not None:
                    self._release_after(slot, failure)
        return out

    def _release_after(self, slot, failure):
        try:
            self._release(slot)
        except BusyError:
            if failure is None:
                raise
            # The failed call's frames (kept by the exception's traceback)
            # still hold the stand-in: clear their locals and try again.
            # Still exported: the view stays held, released by step() or
            # the abort once the exception is gone.
            traceback.clear_frames(failure.__traceback__)
            gc.collect()
            try:
                self._release(slot)
            except BusyError:
                pass

    def _detach_aliases(self, out, slots):
        # A result sharing chunk memory would outlive the release: copy it.
        # (The held views' addresses are their tensors' storage addresses.)
        ptrs = {s.held.address for s in slots if s.held is not None}
        def fix(o):
            if isinstance(o, torch.Tensor) and not isinstance(o, PstarParameter) and o.layout == torch.strided:
                try:
                    if o.untyped_storage().data_ptr() in ptrs:
                        return o.clone()
                except RuntimeError:
                    return o
            if isinstance(o, tuple):
                return tuple(fix(x) for x in o)
            if isinstance(o, list):
                return [fix(x) for x in o]
            return o
        return fix(out) if ptrs else out

    # -- backward -----------------------------------------------------------------
    def _pack(self, t):
        # Only a use in progress (inside _call) has chunk memory to save.
        if self._live and isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device == self.device:
            try:
                slot = self._live.get(t.untyped_storage().data_ptr())
            except RuntimeError:
                slot = None
            if slot is not None:
                return _Packed(slot, t)
        # Any other tensor: saved detached.  Returned as is, a tensor the
        # node saves of its own outputs would hold the node through its
        # grad_fn, a cycle through C++ that Python's collector never sees:
        # a forward no backward frees (an abandoned iteration) would keep
        # its graph, and through these hooks this ParameterModel and its
        # chunk views, for good.  Autograd rebuilds an unpacked tensor's
        # links from what it saved, so the detached data is all it needs
        # (the version counter is shared, in-place checks still hold).
        return t.detach()

    def _unpack(self, packed):
        if not isinstance(packed, _Packed):
            return packed
        slot = packed.slot
        if not slot.requires_grad:
            # No gradient comes for it, so no BACKWARD use (the engine must
            # not count one: it would update the parameter): a copy, read
            # under a RECOMPUTE acquire released at once.
            base = self._acquire(slot, "recompute")
            try:
                return base.as_strided(packed.size, packed.stride, packed.offset).clone()
            finally:
                base = None
                self._release(slot)
        base = self._acquire(slot, "backward")
        # Released by this use's _Use.backward, after the gradient.
        slot.unpacked += 1
        return base.as_strided(packed.size, packed.stride, packed.offset)

    def _backward_use(self, slot, grad, reuse_unpacked):
        # This use's gradient; the acquire from unpack (if any) is reused.
        if reuse_unpacked and slot.unpacked > 0:
            slot.unpacked -= 1
        elif slot.held is None:
            self._hold(slot, "backward")
            slot.held_count = 1
        else:
            slot.held_count += 1
        try:
            # In the compute dtype as autograd gives it (the engine converts
            # to its fp32 sum: the same bits as converting here).
            g = grad.detach()
            dtype = _GRAD_DTYPES.get(g.dtype)
            if dtype is None:
                g, dtype = g.to(torch.float32), _c.PSTAR_DTYPE_F32
            g = g.contiguous()
            if g.numel() != slot.param.numel:
                raise InvalidArgumentError(_c.PSTAR_ERR_INVALID_ARGUMENT, "PSTAR_ERR_INVALID_ARGUMENT",
                                           f"{slot.name}: a gradient of {g.numel()} elements for {slot.param.numel}",
                                           "pstar_grad_write")
            # On the host, or on torch's current stream, which produced `g`:
            # the engine reads it there, so the caching allocator may reuse
            # its memory once that stream's work is done.
            space = _c.PSTAR_MEM_HOST if g.device.type == "cpu" else _c.PSTAR_MEM_DEVICE
            if slot.held_count == 1 and not slot.held._exports and not self._views_alive(slot):
                # This use ends the engine's acquire and nothing reads the
                # weight after it: the gradient and the release in one call
                # (the engine may write it straight into the slot).
                check(_c.pstar_grad_write_release(self.engine._handle(), slot.param.id, g.data_ptr(),
                                                  slot.param.numel, dtype, space, self._stream()),
                      "pstar_grad_write_release")
                slot.held.released = True
                slot.held = None
                slot.held_count = 0
                return
            check(_c.pstar_grad_write(self.engine._handle(), slot.param.id, g.data_ptr(), slot.param.numel, dtype,
                                      space, self._stream()), "pstar_grad_write")
        finally:
            if slot.held is not None:
                self._release(slot)

    # -- values ------------------------------------------------------------------
    def read(self, name_or_param) -> torch.Tensor:
        """A parameter's fp32 values (a copy), by name or PstarParameter."""
        self._settle_implicit("pm.read()")
        self._refuse_nested("pm.read()")
        slot = name_or_param._pstar if isinstance(name_or_param, PstarParameter) else self._slot(name_or_param)
        return torch.from_numpy(self.engine.read(slot.param)).reshape(slot.shape)

    def write(self, name_or_param, values: torch.Tensor):
        """Writes a parameter's values (any dtype and device; converted to
        fp32) between iterations: master and compute copy."""
        self._settle_implicit("pm.write()")
        self._refuse_nested("pm.write()")
        slot = name_or_param._pstar if isinstance(name_or_param, PstarParameter) else self._slot(name_or_param)
        self.engine.write(slot.param, values.detach().to("cpu", torch.float32).contiguous().numpy().reshape(-1))

    def state_dict(self):
        """fp32 copies of every parameter, by name."""
        self._settle_implicit("pm.state_dict()")
        self._refuse_nested("pm.state_dict()")
        return {s.name: self.read(s.name) for s in self.slots}

    def _slot(self, name):
        for s in self.slots:
            if s.name == name:
                return s
        raise KeyError(name)


def args_anchor(args, slot):
    for a in args[0] if isinstance(args[0], tuple) else ():  # the positional arguments first: the usual place
        if isinstance(a, PstarParameter) and a._pstar is slot:
            return a
    for a in _flatten(args):
        if isinstance(a, PstarParameter) and a._pstar is slot:
            return a
    raise AssertionError("the parameter is not among the arguments")


def _flatten(obj):
    if isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _flatten(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _flatten(o)
    else:
        yield obj


def attach(module: torch.nn.Module, options: Options = None, init=None, **fields) -> ParameterModel:
    """Moves the module's parameters into a new engine (registered in the
    module's parameter order; the compute dtype is the engine's) and returns
    the ParameterModel that runs its iterations.  The engine lives as long
    as the model's parameters or the ParameterModel.

    A model too large to build in host memory beside the engine can be built
    on the meta device (``with torch.device("meta"): model = ...``): its
    parameters then have no values, and ``init(name, tensor)`` must fill a
    CPU float32 tensor of each one's shape (``name`` as in
    ``named_parameters()``), called once per parameter after the engine is
    built, so that only one parameter's values exist outside the engine at
    a time.  Buffers are not initialised: a model with buffers on the meta
    device must materialise them itself.

    Without ``options`` or a ``chunk_elems`` field, the chunks are sized to
    the module (``chunk_elems="auto"``: the size of least padding, see
    PSTAR_CHUNK_ELEMS_AUTO); ``chunk_elems=0`` asks for the engine's fixed
    default instead."""
    if options is None:
        fields.setdefault("chunk_elems", "auto")
    engine = Engine(options, **fields) if options is not None else Engine(**fields)
    pm = ParameterModel(module, engine)
    pm._adopt(module, init)
    return pm


# p.grad readers that only test it for None, by function name: Trainer's
# check for gradients on several device meshes (transformers 5).
_NONE_TESTING_READERS = {"_has_mixed_mesh_grads"}

# The p.grad readers that only set it to None.
_ZERO_GRAD_CODES = {inspect.unwrap(torch.nn.Module.zero_grad).__code__,
                    inspect.unwrap(torch.optim.Optimizer.zero_grad).__code__}

from . import _torch_optim  # noqa: E402  (it subclasses PstarParameter's users: imported after them)
from ._torch_optim import PstarOptimizer  # noqa: E402,F401

_torch_optim.install_hooks()
