"""Lightning over pm.optimizer (issue 44): a LightningModule whose
configure_optimizers returns pm.optimizer (with a scheduler dict), trained
by pl.Trainer with automatic optimization (gradient_clip_val,
accumulate_grad_batches, checkpoint and resume) and with manual
optimization, against the same loop written with the engine directly (the
same bits), each with a control that fails when the feature is off; and
what Lightning offers that the engine refuses, with its message."""
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pl = pytest.importorskip("pytorch_lightning")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import pstar  # noqa: E402
import pstar.torch as ptorch  # noqa: E402
from common import same, schedule, weights  # noqa: E402

transformers.logging.set_verbosity_error()
LR, WD, CLIP = 1e-2, 0.1, 0.05
BATCHES = 4  # batches of 2 sequences per epoch


def gpt2():
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
                                  eos_token_id=0, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


def attach(model, **kw):
    fields = dict(device="emulated", compute_dtype="bf16", chunk_elems=4096, lr=LR, weight_decay=WD, adamw=1)
    fields.update(kw)
    return ptorch.attach(model, **fields)


def loader():
    # No shuffling: the Trainer and the engine loop read the same batches.
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randint(1, 64, (2 * BATCHES, 12), generator=g)), batch_size=2,
                      shuffle=False)





class GPT2Module(pl.LightningModule):
    """Automatic optimization: training_step returns the loss; Lightning
    calls pm.optimizer.step(closure), clips (gradient_clip_val) inside the
    closure's wrapper, and steps the scheduler every step."""

    def __init__(self, sched=True, **attach_kw):
        super().__init__()
        self.model = gpt2()
        self.pm = attach(self.model, **attach_kw)
        self.sched = sched
        self.losses = []

    def training_step(self, batch, batch_idx):
        (ids,) = batch
        loss = self.model(input_ids=ids, labels=ids).loss
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        opt = self.pm.optimizer
        if not self.sched:
            return opt
        return {"optimizer": opt,
                "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.LambdaLR(opt, schedule), "interval": "step"}}


class ManualGPT2Module(GPT2Module):
    """Manual optimization, as Lightning's docs write it."""

    def __init__(self, clip=True, **kw):
        super().__init__(**kw)
        self.automatic_optimization = False
        self.clip = clip

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        (ids,) = batch
        loss = self.model(input_ids=ids, labels=ids).loss
        self.manual_backward(loss)
        if self.clip:
            self.clip_gradients(opt, gradient_clip_val=CLIP, gradient_clip_algorithm="norm")
        opt.step()
        opt.zero_grad()
        if self.sched:
            self.lr_schedulers().step()
        self.losses.append(loss.item())


def trainer(steps, **kw):
    fields = dict(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False)
    fields.update(kw)
    return pl.Trainer(**fields)


def fit(module, steps, ckpt_path=None, **kw):
    t = trainer(steps, **kw)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|LeafSpec|max_steps|ckpt_path).*")
        t.fit(module, loader(), ckpt_path=ckpt_path)
    return t


def run_engine(steps, clip=CLIP, accumulation=1, **attach_kw):
    """The same with the engine's own calls: `accumulation` micro-batches
    per iteration, each loss divided by it as Lightning does; the step's lr
    and clip set after the backward."""
    model = gpt2()
    pm = attach(model, **attach_kw)
    base = pm.engine.hparam("lr")
    batches = [ids for (ids,) in loader()]
    losses, k = [], 0
    for s in range(steps):
        with pm.train_iteration():
            for _ in range(accumulation):
                ids = batches[k % len(batches)]  # epochs repeat the batches
                k += 1
                loss = model(input_ids=ids, labels=ids).loss
                (loss / accumulation).backward()
                losses.append(loss.item())
            pm.engine.set_hparam("lr", base * schedule(s))
            pm.engine.set_hparam("clip_norm", clip or 0.0)
            pm.step()
    return pm, losses


def test_automatic_optimization_with_scheduler_and_clipping_is_the_engine_loop():
    m = GPT2Module()
    fit(m, 4, gradient_clip_val=CLIP)
    pm_b, losses_b = run_engine(4)
    assert m.pm.engine.hparam("step") == 4
    assert m.losses == losses_b
    assert same(weights(m.pm), weights(pm_b))
    assert m.pm.optimizer.last_result.clip_coef < 1.0  # Lightning's clipping reached the step
    # Controls: without gradient_clip_val, or without the scheduler, the bits differ.
    m_c = GPT2Module()
    fit(m_c, 4)
    assert not same(weights(m.pm), weights(m_c.pm))
    m_d = GPT2Module(sched=False)
    fit(m_d, 4, gradient_clip_val=CLIP)
    assert not same(weights(m.pm), weights(m_d.pm))


def test_manual_optimization_is_the_engine_loop():
    m = ManualGPT2Module()
    fit(m, 4)
    pm_b, losses_b = run_engine(4)
    assert m.pm.engine.hparam("step") == 4
    assert m.losses == losses_b
    assert same(weights(m.pm), weights(pm_b))
    # Controls: without self.clip_gradients, or without the scheduler's step, the bits differ.
    m_c = ManualGPT2Module(clip=False)
    fit(m_c, 4)
    assert not same(weights(m.pm), weights(m_c.pm))
    m_d = ManualGPT2Module(sched=False)
    fit(m_d, 4)
    assert not same(weights(m.pm), weights(m_d.pm))


def test_accumulate_grad_batches_is_the_engine_accumulation():
    m = GPT2Module(grad_accumulation=1)
    fit(m, 3, accumulate_grad_batches=2, gradient_clip_val=CLIP)  # 3 steps: over an epoch's end
    pm_b, losses_b = run_engine(3, accumulation=2, grad_accumulation=1)
    assert m.pm.engine.hparam("step") == 3
    assert m.losses == losses_b
    assert same(weights(m.pm), weights(pm_b))
    # Control: a step at every micro-batch (what a Trainer that did not
    # accumulate would do over the same batches) differs.
    m_c = GPT2Module(grad_accumulation=1)
    fit(m_c, 6, gradient_clip_val=CLIP)
    assert m_c.losses[0] == m.losses[0] and not same(weights(m.pm), weights(m_c.pm))


def test_accumulate_grad_batches_without_the_engine_option_says_what_to_set():
    m = GPT2Module()
    with pytest.raises(pstar.InvalidStateError,
                       match=r"accumulate_grad_batches.*attach\(\.\.\., grad_accumulation=1\)"):
        fit(m, 2, accumulate_grad_batches=2)


def test_checkpoint_and_fit_with_ckpt_path_resume_bit_for_bit(tmp_path):
    # Uninterrupted: two epochs, with a ModelCheckpoint callback writing a
    # checkpoint at each epoch's end (optimizer state included).
    m_full = GPT2Module()
    every_epoch = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, filename="{epoch}", save_top_k=-1)
    fit(m_full, -1, max_epochs=2, gradient_clip_val=CLIP, enable_checkpointing=True, callbacks=[every_epoch])
    want = weights(m_full.pm)
    pm_b, losses_b = run_engine(2 * BATCHES)
    assert m_full.losses == losses_b and same(want, weights(pm_b))  # checkpointing changed nothing
    path = str(tmp_path / "epoch=0.ckpt")
    # Resumed from the first epoch's checkpoint in a new module and Trainer.
    m_r = GPT2Module()
    fit(m_r, -1, max_epochs=2, ckpt_path=path, gradient_clip_val=CLIP)
    assert m_r.pm.engine.hparam("step") == 2 * BATCHES
    assert m_r.losses == m_full.losses[BATCHES:]
    assert same(want, weights(m_r.pm))
    # Control: the model's weights from the checkpoint alone (no optimizer,
    # scheduler or loop state), then an epoch: differs.
    m_c = GPT2Module()
    m_c.load_state_dict(torch.load(path, weights_only=True)["state_dict"])
    fit(m_c, -1, max_epochs=1, gradient_clip_val=CLIP)
    assert not same(want, weights(m_c.pm))


def test_clipping_by_value_is_refused_with_the_fix():
    # gradient_clip_algorithm="value" calls torch.nn.utils.clip_grad_value_,
    # which reads p.grad: the engine clips by the global L2 norm only, and a
    # PstarParameter's p.grad is None, so it would clip nothing.
    m = GPT2Module()
    with pytest.raises(pstar.UnsupportedError, match=r"clip_grad_value_ read p\.grad.*clip_grad_norm_"):
        fit(m, 1, gradient_clip_val=CLIP, gradient_clip_algorithm="value")


def test_precision_plugins():
    # precision="bf16-true" converts the module to bf16 (module.to): on a
    # bf16 engine nothing changes (the same bits as "32-true"); on an f32
    # engine it is refused, naming the fix.
    m = GPT2Module()
    fit(m, 2, precision="bf16-true", gradient_clip_val=CLIP)
    ref = GPT2Module()
    fit(ref, 2, gradient_clip_val=CLIP)
    assert m.losses == ref.losses and same(weights(m.pm), weights(ref.pm))
    m_f32 = GPT2Module(compute_dtype="f32")
    with pytest.raises(pstar.UnsupportedError,
                       match=r"converting them to torch\.bfloat16.*before attach.*compute_dtype"):
        fit(m_f32, 1, precision="bf16-true")
