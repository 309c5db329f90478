"""pm.optimizer, clipping and the refusals of issue 44, against the same loop
written with the engine directly (the same bits), each with a control that
fails when the feature is off."""
import io
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import pstar  # noqa: E402
import pstar.torch as ptorch  # noqa: E402
from pstar import _torch_optim  # noqa: E402
from common import batch, same, schedule, weights  # noqa: E402

transformers.logging.set_verbosity_error()
LR, WD = 1e-2, 0.1


def gpt2(dtype=torch.float32):
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
                                  eos_token_id=0, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).to(dtype)


def attach(model, dtype="bf16", **kw):
    fields = dict(device="emulated", compute_dtype=dtype, chunk_elems=4096, lr=LR, weight_decay=WD, adamw=1)
    fields.update(kw)
    return ptorch.attach(model, **fields)






def run_optimizer(steps=4, clip=0.05, sched=True, dtype="bf16"):
    """A loop written for a torch optimizer: forward, backward,
    clip_grad_norm_, optimizer.step(), scheduler.step(), zero_grad()."""
    model = gpt2()
    pm = attach(model, dtype)
    opt = pm.optimizer
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, schedule) if sched else None
    norms, losses = [], []
    for s in range(steps):
        loss = model(**batch(s)).loss
        loss.backward()
        if clip is not None:
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item())
        opt.step()
        if scheduler is not None:
            scheduler.step()
        opt.zero_grad()
        losses.append(loss.item())
    pm.last_result = opt.last_result
    return pm, norms, losses


def run_engine(steps=4, clip=0.05, dtype="bf16"):
    """The same with the engine's own calls: the step's lr and clip set
    after the backward (legal since issue 44), the norm from the step."""
    model = gpt2()
    pm = attach(model, dtype)
    base = pm.engine.hparam("lr")  # the float the engine keeps, a torch scheduler's base_lr
    norms, losses = [], []
    for s in range(steps):
        with pm.train_iteration():
            loss = model(**batch(s)).loss
            loss.backward()
            pm.engine.set_hparam("lr", base * schedule(s))
            pm.engine.set_hparam("clip_norm", clip or 0.0)
            r = pm.step()
        norms.append(r.grad_norm)
        losses.append(loss.item())
    return pm, norms, losses


def test_optimizer_schedule_and_clipping_are_the_engine_loop_bit_for_bit():
    pm_a, norms_a, losses_a = run_optimizer()
    pm_b, norms_b, losses_b = run_engine()
    assert losses_a == losses_b
    # clip_grad_norm_ returns the engine's norm (as float32, like torch's).
    assert norms_a == [float(torch.tensor(n, dtype=torch.float32)) for n in norms_b]
    assert all(n > 0.05 for n in norms_b)  # every step clipped
    assert same(weights(pm_a), weights(pm_b))
    assert pm_a.last_result.clip_coef < 1.0
    # Controls: without the schedule, or without clipping, the bits differ.
    pm_c, _, _ = run_optimizer(sched=False)
    assert not same(weights(pm_a), weights(pm_c))
    pm_d, _, _ = run_optimizer(clip=None)
    assert not same(weights(pm_a), weights(pm_d))


def test_param_groups_mirror_the_engine_and_changes_reach_the_next_step():
    model = gpt2()
    pm = attach(model, "f32")
    opt = pm.optimizer
    assert opt is pm.optimizer  # one per model
    (g,) = opt.param_groups
    assert len(g["params"]) == len(list(model.parameters()))
    assert g["lr"] == pytest.approx(LR) and g["weight_decay"] == pytest.approx(WD)
    assert g["betas"] == pytest.approx((0.9, 0.999)) and g["eps"] == pytest.approx(1e-8)
    g["lr"], g["betas"], g["eps"], g["weight_decay"] = 0.5, (0.5, 0.75), 1e-3, 0.25
    model(**batch()).loss.backward()
    opt.step()
    e = pm.engine
    assert (e.hparam("lr"), e.hparam("beta1"), e.hparam("beta2"), e.hparam("eps"),
            e.hparam("weight_decay")) == pytest.approx((0.5, 0.5, 0.75, 1e-3, 0.25))
    with pytest.raises(pstar.UnsupportedError, match="fixed when the model is attached"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})


def test_frozen_parameters_are_not_in_the_group():
    model = gpt2()
    model.transformer.wpe.weight.requires_grad_(False)
    pm = attach(model, "f32")
    names = {p._pstar.name for p in pm.optimizer.param_groups[0]["params"]}
    assert "transformer.wpe.weight" not in names and "transformer.wte.weight" in names


def test_step_with_a_closure_calls_it_first_and_returns_its_loss():
    model = gpt2()
    pm = attach(model)
    calls = []

    def closure():
        loss = model(**batch()).loss
        loss.backward()
        calls.append(loss.item())
        return loss

    before = weights(pm)
    loss = pm.optimizer.step(closure)
    assert calls == [loss.item()]
    assert not same(before, weights(pm))
    with pytest.raises(pstar.InvalidStateError, match="no TRAIN iteration"):
        pm.optimizer.step()


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_state_dict_through_torch_save_restores_bit_for_bit(dtype):
    model = gpt2()
    pm = attach(model, dtype)
    opt = pm.optimizer
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)

    def steps(model, opt, sched, first, n):
        for s in range(first, first + n):
            model(**batch(s)).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            sched.step()

    steps(model, opt, sched, 0, 2)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}, buf)
    steps(model, opt, sched, 2, 2)
    want = weights(pm)

    def resumed(load_optimizer):
        buf.seek(0)
        saved = torch.load(buf, weights_only=True)
        model2 = gpt2()
        pm2 = attach(model2, dtype)
        opt2 = pm2.optimizer
        sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, schedule)
        model2.load_state_dict(saved["model"])
        if load_optimizer:
            opt2.load_state_dict(saved["opt"])
        sched2.load_state_dict(saved["sched"])
        steps(model2, opt2, sched2, 2, 2)
        return pm2

    pm2 = resumed(True)
    assert same(want, weights(pm2))
    assert pm2.engine.hparam("step") == 4
    # Control: the model's weights alone (no masters, moments, step count).
    assert not same(want, weights(resumed(False)))


def test_load_state_dict_refuses_a_torch_optimizers_state():
    model = gpt2()
    pm = attach(model)
    plain = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))])
    with pytest.raises(ValueError, match="not a pm.optimizer state_dict"):
        pm.optimizer.load_state_dict(plain.state_dict())


def test_a_torch_optimizer_over_attached_parameters_is_refused_at_once():
    model = gpt2()
    attach(model)
    for make in (lambda: torch.optim.AdamW(model.parameters(), lr=1e-3),
                 lambda: torch.optim.SGD([{"params": list(model.parameters())}], lr=0.1)):
        with pytest.raises(pstar.UnsupportedError, match=r"pm\.optimizer.*optimizers=\(pm\.optimizer, scheduler\)"):
            make()
    # Other models' optimizers are untouched.
    torch.optim.AdamW(torch.nn.Linear(2, 2).parameters()).step()


def test_clipping_refusals_name_the_fix():
    model = gpt2()
    pm = attach(model)
    params = list(model.parameters())
    with pytest.raises(pstar.InvalidStateError, match="no TRAIN iteration"):
        torch.nn.utils.clip_grad_norm_(params, 1.0)
    model(**batch()).loss.backward()
    with pytest.raises(pstar.UnsupportedError, match="L2 norm only"):
        torch.nn.utils.clip_grad_norm_(params, 1.0, norm_type=1.0)
    with pytest.raises(pstar.UnsupportedError, match="of the model's"):
        torch.nn.utils.clip_grad_norm_(params[:3], 1.0)
    other = torch.nn.Parameter(torch.ones(2))
    other.grad = torch.ones(2)
    with pytest.raises(pstar.UnsupportedError, match="mix"):
        torch.nn.utils.clip_grad_norm_(params + [other], 1.0)
    # torch's own function kept from before the wrap reads p.grad: refused,
    # never a norm of 0.
    with pytest.raises(pstar.UnsupportedError, match="clip nothing"):
        _torch_optim._TORCH_CLIP(params, 1.0)
    pm.optimizer.step()


def test_plain_parameters_still_clip_as_torch_does():
    lin = torch.nn.Linear(3, 2)
    lin(torch.ones(1, 3)).sum().backward()
    want = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in lin.parameters()]))
    got = torch.nn.utils.clip_grad_norm_(lin.parameters(), 1e-3)
    assert torch.allclose(got, want)
    assert torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in lin.parameters()])) <= 1.01e-3


def test_a_forward_without_backward_does_not_trap_the_model():
    # Reference: two steps.
    model = gpt2()
    pm = attach(model)
    for s in range(2):
        model(**batch(s)).loss.backward()
        pm.optimizer.step()
    want = weights(pm)

    model = gpt2()
    pm = attach(model)
    model(**batch(0)).loss.backward()
    pm.optimizer.step()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = model(**batch(7))  # a notebook's look at the outputs, autograd on
        assert out.logits.requires_grad
        w = pm.read("transformer.wte.weight")  # abandons the iteration: warns once
        model(**batch(7))
        pm.state_dict()
        model(**batch(7))
        with pm.train_iteration():  # abandons it too
            model(**batch(1)).loss.backward()
            pm.step()
    abandoned = [x for x in seen if "no backward followed" in str(x.message)]
    assert len(abandoned) == 1, [str(x.message) for x in seen]
    assert w.shape == (64, 32)
    assert same(want, weights(pm))  # the bits of a run without those forwards
    # Once the backward has begun, the iteration is the user's: refused.
    model(**batch(3)).loss.backward()
    with pytest.raises(pstar.InvalidStateError, match="end it with pm.step"):
        pm.read("transformer.wte.weight")
    pm.abandon_iteration()


def test_accumulation_without_the_option_says_what_to_set():
    model = gpt2()
    attach(model)
    model(**batch(0)).loss.backward()
    with pytest.raises(pstar.InvalidStateError, match=r"grad_accumulation"):
        model(**batch(1)).loss.backward()


def test_accumulation_through_the_optimizer_is_the_engine_loop():
    def run(use_optimizer):
        model = gpt2()
        pm = attach(model, grad_accumulation=1)
        for s in range(2):
            for mb in range(2):
                (model(**batch(2 * s + mb)).loss / 2).backward()
            if use_optimizer:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
                pm.optimizer.step()
            else:
                pm.engine.set_hparam("clip_norm", 0.1)
                pm.step()
        return weights(pm)

    assert same(run(True), run(False))


def test_clipping_holds_for_one_step_only():
    # clip_grad_norm_ at step 0 only: step 1 is not clipped, whether the
    # optimizer is kept, dropped and made anew, or the step is pm.step().
    def second_clip_coef(how):
        model = gpt2()
        pm = attach(model, "f32")
        held = pm.optimizer if how == "kept" else None
        model(**batch(0)).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        pm.optimizer.step()
        assert pm.engine.hparam("clip_norm") == pytest.approx(1e-3)
        model(**batch(1)).loss.backward()
        if how == "pm.step":
            return pm.step().clip_coef
        opt = pm.optimizer
        opt.step()
        del held
        return opt.last_result.clip_coef

    for how in ("kept", "dropped", "pm.step"):
        assert second_clip_coef(how) == 1.0, how


def test_the_engines_own_clip_norm_is_kept_as_the_base():
    model = gpt2()
    pm = attach(model, "f32", clip_norm=1e-3)
    opt = pm.optimizer
    model(**batch(0)).loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e6)  # this step: no clipping in effect
    opt.step()
    assert opt.last_result.clip_coef == 1.0
    model(**batch(1)).loss.backward()
    opt.step()                                               # back to the option's 1e-3
    assert opt.last_result.clip_coef < 1.0
    pm.engine.set_hparam("clip_norm", 0.0)                   # the user's own setting
    model(**batch(2)).loss.backward()
    opt.step()
    assert opt.last_result.clip_coef == 1.0


def test_resume_after_a_clipped_step_before_an_unclipped_one():
    def run(resume):
        model = gpt2()
        pm = attach(model, "f32")
        opt = pm.optimizer
        model(**batch(0)).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        opt.step()
        if resume:
            buf = io.BytesIO()
            torch.save({"m": model.state_dict(), "o": opt.state_dict()}, buf)
            buf.seek(0)
            saved = torch.load(buf, weights_only=True)
            model = gpt2()
            pm = attach(model, "f32")
            opt = pm.optimizer
            model.load_state_dict(saved["m"])
            opt.load_state_dict(saved["o"])
        model(**batch(1)).loss.backward()
        opt.step()                                           # no clipping asked
        assert opt.last_result.clip_coef == 1.0
        return weights(pm)

    assert same(run(False), run(True))


def test_requires_grad_after_a_forward_without_backward():
    model = gpt2()
    pm = attach(model)
    model(**batch(0))
    with pytest.warns(RuntimeWarning, match="no backward followed"):
        model.transformer.wpe.weight.requires_grad_(False)
    assert not pm._in_iteration


def test_accelerate_imported_after_pstar_torch_is_wrapped():
    pytest.importorskip("accelerate")
    import subprocess
    import sys
    code = ("import pstar.torch, sys; assert 'accelerate' not in sys.modules; "
            "from accelerate import Accelerator; from accelerate.optimizer import AcceleratedOptimizer; "
            "from pstar import _torch_optim as o; "
            "assert Accelerator.clip_grad_norm_.__wrapped__ is o._ACCELERATE_CLIP; "
            "assert AcceleratedOptimizer.__init__.__wrapped__ is not None; print('wrapped')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "wrapped" in out.stdout, out.stderr
