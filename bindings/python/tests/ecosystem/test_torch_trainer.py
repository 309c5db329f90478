"""transformers' Trainer driving the engine through pm.optimizer (issue 44):
written as its docs write it, with optimizers=(pm.optimizer, scheduler).
Against the same loop written with the engine directly (the same batches,
the same loss normalisation), bit for bit; its schedule, clipping, logged
gradient norm and gradient accumulation take effect (controls); a run
interrupted at a checkpoint and resumed gives exactly the uninterrupted
run's losses and weights; Trainer's default optimizer is refused with the
fix named."""
import math
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # Trainer needs it
import pstar  # noqa: E402
import pstar.torch as ptorch  # noqa: E402
from common import same, weights  # noqa: E402

transformers.logging.set_verbosity_error()
LR, WD, CLIP = 1e-2, 0.1, 0.5
STEPS, BATCH, ACCUM = 4, 2, 2


def gpt2():
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
                                  eos_token_id=0, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


def attach(model, accumulation=True):
    return ptorch.attach(model, device="emulated", compute_dtype="f32", chunk_elems=4096, lr=LR, weight_decay=WD,
                         adamw=1, grad_accumulation=1 if accumulation else 0)


class Tokens(torch.utils.data.Dataset):
    """Fixed token rows; remembers the order Trainer reads them in."""

    def __init__(self, n=32):
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(1, 64, (n, 12), generator=g)
        self.read = []

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        self.read.append(i)
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def losses_of(model):
    """The training losses of each forward, as the model returned them
    (a forward hook: Trainer is used unchanged)."""
    seen = []

    def hook(_module, _args, out):
        if torch.is_grad_enabled() and getattr(out, "loss", None) is not None:
            seen.append(out.loss.item())

    model.register_forward_hook(hook)
    return seen


def train_with_trainer(out_dir, steps=STEPS, accum=ACCUM, clip=CLIP, schedule=True, save_steps=None,
                       resume=None, max_steps=None):
    model = gpt2()
    losses = losses_of(model)
    pm = attach(model)
    ds = Tokens()
    total = max_steps or steps
    scheduler = transformers.get_linear_schedule_with_warmup(pm.optimizer, 1, total) if schedule else \
        torch.optim.lr_scheduler.LambdaLR(pm.optimizer, lambda s: 1.0)
    args = transformers.TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=BATCH, gradient_accumulation_steps=accum, max_steps=total,
        max_grad_norm=clip, logging_steps=1, report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
        save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=ds, optimizers=(pm.optimizer, scheduler))
    if resume is None and steps < total:
        # Interrupted: Trainer stops after `steps` optimizer steps.
        class Stop(transformers.TrainerCallback):
            def on_step_end(self, args, state, control, **kw):
                if state.global_step >= steps:
                    control.should_training_stop = True
        trainer.add_callback(Stop())
    trainer.train(resume_from_checkpoint=resume)
    return trainer, pm, ds, losses


def train_with_engine(order, steps=STEPS, accum=ACCUM, clip=CLIP, schedule=True):
    """Trainer's arithmetic with the engine's own calls: per micro-batch
    the model's loss normalised by the tokens of the whole step
    (num_items_in_batch), the step's lr and clipping set after backward."""
    model = gpt2()
    pm = attach(model)
    ds = Tokens()
    base = pm.engine.hparam("lr")
    losses, norms = [], []
    for s in range(steps):
        micro = [order[(s * accum + m) * BATCH:(s * accum + m + 1) * BATCH] for m in range(accum)]
        # Trainer's count (transformers 5.25 counts every label here, the
        # unshifted ones included).
        items = sum(ds.ids[idx].ne(-100).sum() for idx in micro)
        with pm.train_iteration():
            for idx in micro:
                out = model(input_ids=ds.ids[idx], labels=ds.ids[idx], num_items_in_batch=items)
                out.loss.backward()
                losses.append(out.loss.item())
            norms.append(pm.engine.grad_norm())
            factor = (min(s, 1) * max(0.0, (steps - s) / (steps - 1))) if schedule else 1.0
            pm.engine.set_hparam("lr", base * factor)
            pm.engine.set_hparam("clip_norm", clip)
            pm.step()
    return pm, losses, norms




def test_trainer_is_the_engine_loop_bit_for_bit(tmp_path):
    trainer, pm, ds, losses = train_with_trainer(str(tmp_path / "a"))
    order = ds.read
    ref, ref_losses, ref_norms = train_with_engine(order)
    assert losses == ref_losses
    assert same(weights(pm), weights(ref))
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == STEPS
    # The logged gradient norm is the engine's (before clipping), and the
    # schedule's learning rates are the ones used.
    assert [h["grad_norm"] for h in logged] == pytest.approx(ref_norms, rel=1e-6)
    assert all(n > CLIP for n in ref_norms)  # clipping took effect at every step
    assert [h["learning_rate"] for h in logged] == pytest.approx([0.0, LR, LR * 2 / 3, LR / 3], rel=1e-6)
    # Controls: the loop without clipping, or without the schedule, ends elsewhere.
    no_clip, _, _ = train_with_engine(order, clip=0.0)
    assert not same(weights(pm), weights(no_clip))
    no_sched, _, _ = train_with_engine(order, schedule=False)
    assert not same(weights(pm), weights(no_sched))


def test_trainer_evaluates_and_saves(tmp_path):
    trainer, pm, ds, _ = train_with_trainer(str(tmp_path / "a"), steps=2)
    metrics = trainer.evaluate(eval_dataset=Tokens(8))
    assert math.isfinite(metrics["eval_loss"])
    trainer.save_model(str(tmp_path / "saved"))
    loaded = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "saved"))
    got = dict(loaded.named_parameters())
    for name, value in weights(pm).items():
        assert torch.equal(got[name].detach(), value), name


def test_resume_from_checkpoint_gives_the_uninterrupted_run(tmp_path):
    total = 4
    _, pm_full, _, losses_full = train_with_trainer(str(tmp_path / "full"), steps=total)
    # Interrupted after 2 steps (a checkpoint every 2), then resumed.
    _, pm_cut, _, losses_cut = train_with_trainer(str(tmp_path / "cut"), steps=2, save_steps=2, max_steps=total)
    ckpt = os.path.join(str(tmp_path / "cut"), "checkpoint-2")
    assert os.path.isfile(os.path.join(ckpt, "optimizer.pt"))
    _, pm_res, _, losses_res = train_with_trainer(str(tmp_path / "cut"), steps=total, save_steps=2, resume=ckpt,
                                                  max_steps=total)
    assert losses_cut + losses_res == losses_full
    assert same(weights(pm_res), weights(pm_full))


def test_resume_without_the_optimizer_state_differs(tmp_path):
    # Control for the resume test: the checkpoint's optimizer.pt removed, the
    # model's weights alone do not give the uninterrupted run.
    total = 4
    _, pm_full, _, _ = train_with_trainer(str(tmp_path / "full"), steps=total)
    train_with_trainer(str(tmp_path / "cut"), steps=2, save_steps=2, max_steps=total)
    ckpt = os.path.join(str(tmp_path / "cut"), "checkpoint-2")
    os.remove(os.path.join(ckpt, "optimizer.pt"))
    _, pm_res, _, _ = train_with_trainer(str(tmp_path / "cut"), steps=total, save_steps=2, resume=ckpt,
                                         max_steps=total)
    assert not same(weights(pm_res), weights(pm_full))


def test_the_default_trainer_fails_at_once_naming_the_fix(tmp_path):
    model = gpt2()
    attach(model)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=2,
                                          report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(8))
    with pytest.raises(pstar.UnsupportedError, match=r"optimizers=\(pm\.optimizer, scheduler\)"):
        trainer.train()


def test_accumulation_without_the_engine_option_says_so(tmp_path):
    model = gpt2()
    pm = ptorch.attach(model, device="emulated", compute_dtype="f32", chunk_elems=4096)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2,
                                          gradient_accumulation_steps=2, max_steps=2, report_to=[], use_cpu=True,
                                          disable_tqdm=True, save_strategy="no")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(8), optimizers=(pm.optimizer, None))
    with pytest.raises(pstar.InvalidStateError, match=r"grad_accumulation=1"):
        trainer.train()
