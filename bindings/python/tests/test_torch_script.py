"""pstar.torch as a training script uses PyTorch and Hugging Face: every
case here once failed or trained silently wrong (issue 17).  Each test names
the behaviour it holds."""
import copy
import gc
import warnings
import weakref

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import pstar  # noqa: E402
import pstar.torch as ptorch  # noqa: E402

transformers.logging.set_verbosity_error()
LR, WD = 1e-2, 0.1


def gpt2():
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
                                  eos_token_id=0, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).to(torch.bfloat16)


def attach(model, **kw):
    fields = dict(device="emulated", compute_dtype="bf16", chunk_elems=4096, lr=LR, weight_decay=WD, adamw=1)
    fields.update(kw)
    return ptorch.attach(model, **fields)


def batch(step=0):
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(1, 64, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    labels = ids.clone()
    labels[mask == 0] = -100
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


def train_step(model, pm, step=0):
    with pm.train_iteration():
        loss = model(**batch(step)).loss
        loss.backward()
        return pm.step()


def weights(pm):
    return {n: v.clone() for n, v in pm.state_dict().items()}


def changed(before, after):
    return {n for n in before if not torch.equal(before[n], after[n])}


# -- gradient checkpointing --------------------------------------------------------

@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_trains_every_tensor(reentrant):
    model = gpt2()
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    pm = attach(model)
    before = weights(pm)
    result = train_step(model, pm)
    assert result.params_updated == len(pm.slots)
    assert changed(before, weights(pm)) == set(before)


# -- a parameter no gradient reaches -----------------------------------------------

class Branchy(torch.nn.Module):
    """`side` is used in forward, but its output never reaches the loss."""

    def __init__(self):
        super().__init__()
        self.main = torch.nn.Linear(4, 4)
        self.side = torch.nn.Linear(4, 4)

    def forward(self, x):
        self.last_side = self.side(x)
        return self.main(x)


def test_parameter_without_gradient_is_left_untouched_like_torch():
    torch.manual_seed(0)
    model = Branchy()
    twin = copy.deepcopy(model)
    pm = attach(model, compute_dtype="f32")
    before = weights(pm)
    opt = torch.optim.AdamW(twin.parameters(), lr=LR, weight_decay=WD)
    for s in range(3):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(s))
        with pm.train_iteration():
            model(x).square().sum().backward()
            result = pm.step()
        opt.zero_grad()
        twin(x).square().sum().backward()
        opt.step()
        assert result.params_updated == 2
    after = weights(pm)
    assert changed(before, after) == {"main.weight", "main.bias"}
    assert twin.side.weight.grad is None
    torch.testing.assert_close(after["side.weight"], twin.side.weight.detach())   # torch left it too
    torch.testing.assert_close(after["main.weight"], twin.main.weight.detach(), rtol=1e-5, atol=1e-6)


# -- metadata ------------------------------------------------------------------

def test_metadata_answers_the_compute_device_and_dtype():
    model = gpt2()
    pm = attach(model)
    p = model.transformer.wte.weight
    assert p.device == torch.device("cpu") and not p.is_meta and p.get_device() == -1
    assert p.dtype == torch.bfloat16 and p.is_floating_point()
    assert model.device == torch.device("cpu")
    assert model.dtype == torch.bfloat16
    inputs = {k: v.to(model.device) for k, v in batch().items()}     # the everyday idiom
    with pm.eval_iteration():
        assert model(**inputs).logits.shape == (2, 12, 64)
    with pytest.raises(pstar.UnsupportedError, match=r"\.data of a PstarParameter.*p\.detach\(\)"):
        p.data


# -- exceptions and abandoned iterations -----------------------------------------

class Boom(Exception):
    pass


def test_exception_in_an_iteration_leaves_nothing_behind():
    ref, model = gpt2(), gpt2()
    ref_pm, pm = attach(ref, device_capacity_bytes=64 << 10), attach(model, device_capacity_bytes=64 << 10)
    for s in range(2):
        train_step(ref, ref_pm, s)
        train_step(model, pm, s)
    before = weights(pm)
    # Fails in forward, with parameters acquired...
    with pytest.raises(Boom):
        with pm.train_iteration():
            model.transformer.wte(torch.tensor([[1, 2]]))
            raise Boom()
    # ... and half way through backward (some gradients written).
    calls = []

    def fail_once(grad):
        calls.append(1)
        raise Boom()

    with pytest.raises(Boom):
        with pm.train_iteration():
            out = model(**batch(9))
            out.logits.register_hook(lambda g: g)
            model.transformer.h[1].mlp.c_proj.weight  # metadata only
            h = out.loss
            h.register_hook(fail_once)
            h.backward()
    assert calls and changed(before, weights(pm)) == set()
    # Left without step(): a warning, nothing updated.
    with pytest.warns(RuntimeWarning, match="without pm.step"):
        with pm.train_iteration():
            model(**batch(9)).loss.backward()
    assert changed(before, weights(pm)) == set()
    # Training goes on as if the failed iterations had never been.
    for s in range(2, 4):
        r1, r2 = train_step(ref, ref_pm, s), train_step(model, pm, s)
        assert r1.grad_norm == r2.grad_norm and r1.step == r2.step
    assert changed(weights(ref_pm), weights(pm)) == set()
    # step() after a failed forward caught inside the block: no gradient,
    # nothing updated (the engine's step count does advance: docs/python.md).
    before = weights(pm)
    with pm.train_iteration():
        try:
            model(input_ids=torch.tensor([[1, 2, 99]]))   # index out of range
        except IndexError:
            pass
        assert pm.step().params_updated == 0
    assert changed(before, weights(pm)) == set()


# -- a loop without train_iteration() ----------------------------------------------

def test_a_loop_written_for_a_torch_optimizer_needs_only_step():
    ref, model = gpt2(), gpt2()
    ref_pm, pm = attach(ref), attach(model)
    for s in range(3):
        train_step(ref, ref_pm, s)
        loss = model(**batch(s)).loss     # the first use begins a TRAIN iteration
        loss.backward()
        assert pm.step().params_updated == len(pm.slots)
    assert changed(weights(ref_pm), weights(pm)) == set()
    before = weights(pm)
    model(**batch(5)).loss.backward()
    with pytest.raises(pstar.InvalidStateError, match="abandon_iteration"):
        with pm.eval_iteration():
            pass
    pm.abandon_iteration()                # what a loop that caught an exception calls
    assert changed(before, weights(pm)) == set()
    with pytest.raises(pstar.InvalidStateError, match="no pstar.torch TRAIN iteration"):
        pm.step()


# -- outside an iteration --------------------------------------------------------

def test_reads_outside_an_iteration(tmp_path):
    model = gpt2()
    model.eval()
    pm = attach(model)
    train_step(model, pm)
    p = model.transformer.h[0].attn.c_attn.weight
    assert torch.equal(p.detach().float(), pm.read(p).to(torch.bfloat16).float())
    assert p.detach().dtype == torch.bfloat16
    sd = model.state_dict()
    assert sd["lm_head.weight"].dtype == torch.bfloat16 and torch.equal(sd["lm_head.weight"], sd["transformer.wte.weight"])
    torch.save(sd, tmp_path / "sd.pt")
    inputs = batch(3)
    with torch.no_grad():
        outside = model(**inputs).logits
    with pm.eval_iteration():
        inside = model(**inputs).logits
    assert torch.equal(outside, inside)
    prompt = inputs["input_ids"][:1, :4]
    with pm.eval_iteration():
        gen_inside = model.generate(prompt, max_new_tokens=6, do_sample=False)
    assert torch.equal(model.generate(prompt, max_new_tokens=6, do_sample=False), gen_inside)
    # save_pretrained, then from_pretrained into a plain model: the same logits.
    model.save_pretrained(tmp_path / "export")
    plain = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "export", dtype=torch.bfloat16).eval()
    with torch.no_grad():
        assert torch.equal(plain(**inputs).logits, inside)


def test_load_state_dict_writes_the_engine_and_other_writes_are_refused(tmp_path):
    model = gpt2()
    pm = attach(model)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save(saved, tmp_path / "sd.pt")
    train_step(model, pm)
    assert changed({k: saved[k] for k in saved}, model.state_dict())
    model.load_state_dict(torch.load(tmp_path / "sd.pt"))
    assert not changed(saved, model.state_dict())
    p = model.transformer.wpe.weight
    p.copy_(torch.zeros(p.shape))
    assert torch.count_nonzero(pm.read(p)) == 0
    for write in (lambda: p.add_(1), lambda: torch.nn.init.zeros_(p), lambda: p.__setitem__(0, 1.0),
                  lambda: torch.add(p, 1, out=p)):
        with pytest.raises(pstar.UnsupportedError, match=r"pm\.write"):
            write()
    with pm.train_iteration():
        with pytest.raises(pstar.UnsupportedError, match="inside an iteration"):
            p.copy_(torch.ones(p.shape))
        pm.abandon_iteration()


# -- freezing ------------------------------------------------------------------

def test_freezing_and_unfreezing_between_iterations():
    model = gpt2()
    pm = attach(model)
    block = model.transformer.h[0]
    block.requires_grad_(False)
    assert not block.attn.c_attn.weight.requires_grad
    before = weights(pm)
    result = train_step(model, pm)
    frozen = {n for n in before if n.startswith("transformer.h.0.")}
    assert len(frozen) == 12 and result.params_updated == len(pm.slots) - 12
    assert changed(before, weights(pm)) == set(before) - frozen
    block.requires_grad_(True)
    before = weights(pm)
    assert train_step(model, pm, 1).params_updated == len(pm.slots)
    assert changed(before, weights(pm)) == set(before)
    with pm.train_iteration():
        with pytest.raises(pstar.InvalidStateError, match="between iterations"):
            block.ln_1.weight.requires_grad_(False)
        pm.abandon_iteration()


def test_frozen_at_attach_cannot_be_unfrozen():
    model = gpt2()
    model.transformer.wpe.weight.requires_grad_(False)
    pm = attach(model)
    assert train_step(model, pm).params_updated == len(pm.slots) - 1
    with pytest.raises(pstar.UnsupportedError, match="before attach"):
        model.transformer.wpe.weight.requires_grad = True


# -- moving, converting, copying, compiling ------------------------------------

def test_moving_converting_and_copying_are_refused_with_what_to_do():
    model = gpt2()
    pm = attach(model)
    assert model.to(model.device) is model and model.to("cpu") is model          # no-ops stay no-ops
    for move in (lambda: model.to(torch.float32), lambda: model.float(), lambda: model.cuda(),
                 lambda: model.to("meta")):
        with pytest.raises(pstar.UnsupportedError, match="before attach"):
            move()
    with pm.train_iteration():
        with pytest.raises(pstar.UnsupportedError, match="before attach"):
            model.to(torch.float64)
        pm.abandon_iteration()
    with pytest.raises(pstar.UnsupportedError, match="deep-copied"):
        copy.deepcopy(model)
    assert train_step(model, pm).params_updated == len(pm.slots)


def test_torch_compile_is_refused():
    model = gpt2()
    pm = attach(model)
    compiled = torch.compile(model, backend="eager")
    with pm.eval_iteration():
        with pytest.raises(Exception, match="torch.compile of a model attached to pstar.torch is not supported"):
            compiled(**batch())


# -- lifetime and silent no-ops --------------------------------------------------

def test_dropping_the_model_frees_the_engine_without_gc():
    gc.disable()
    try:
        model = gpt2()
        pm = attach(model)
        train_step(model, pm)
        engine = weakref.ref(pm.engine)
        del pm
        assert engine() is not None          # the model's parameters keep it
        del model
        assert engine() is None
    finally:
        gc.enable()
