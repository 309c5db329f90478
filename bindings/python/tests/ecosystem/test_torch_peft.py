"""PEFT over pstar.torch (issue 44): get_peft_model(gpt2, LoraConfig(...)),
then attach.  Only the adapters train: as plain torch trains the same PEFT
model with torch.optim.AdamW (within a stated tolerance: torch's AdamW
arithmetic is not the engine's), and bit for bit as the engine loop; the
frozen base weights do not change; save_pretrained writes the adapter with
pm's weights.  The engine's bytes per frozen and per trainable element are
measured from pm.engine.stats (printed; run with -s to see them) and
checked against what the engine documents: a frozen parameter keeps only
its compute copy, no fp32 master and no Adam state (PSTAR_PARAM_FROZEN in
pstar.h; docs/user-guide.md, "14 bytes per element")."""
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402

import pstar.torch as ptorch  # noqa: E402
from common import batch, same, schedule, weights  # noqa: E402

transformers.logging.set_verbosity_error()
# transformers' own deprecation, raised through PEFT.
pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
LR, WD, CLIP, CHUNK = 1e-2, 0.1, 0.05, 4096  # the adapters' norms are 0.07-0.11: every step clips
STEPS = 5


def gpt2():
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
                                  eos_token_id=0, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


def lora_config():
    # GPT-2's c_attn is a Conv1D: fan_in_fan_out=True.  lora_B starts at
    # zero, so the first forward is the base model's.
    return LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0, fan_in_fan_out=True,
                      task_type="CAUSAL_LM")


def lora_gpt2(peft_init=False):
    model = get_peft_model(gpt2(), lora_config())
    if peft_init:
        return model
    # B = 0 makes the adapters' first gradients degenerate (A gets none);
    # give B small values so that both train from the first step.
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return model


def attach(model, dtype="bf16", **kw):
    fields = dict(device="emulated", compute_dtype=dtype, chunk_elems=CHUNK, lr=LR, weight_decay=WD, adamw=1)
    fields.update(kw)
    return ptorch.attach(model, **fields)





def adapters(names):
    return [n for n in names if "lora_" in n]



def run_optimizer(dtype="bf16", clip=CLIP):
    model = lora_gpt2()
    pm = attach(model, dtype)
    opt = pm.optimizer
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    losses = []
    for s in range(STEPS):
        loss = model(**batch(s)).loss
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
    return model, pm, losses


def run_engine(dtype="bf16"):
    model = lora_gpt2()
    pm = attach(model, dtype)
    base = pm.engine.hparam("lr")
    losses = []
    for s in range(STEPS):
        with pm.train_iteration():
            loss = model(**batch(s)).loss
            loss.backward()
            pm.engine.set_hparam("lr", base * schedule(s))
            pm.engine.set_hparam("clip_norm", CLIP)
            pm.step()
        losses.append(loss.item())
    return pm, losses


def run_torch():
    """Plain PyTorch, the same PEFT model and recipe, fp32."""
    model = lora_gpt2()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=WD, betas=(0.9, 0.999), eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    losses = []
    for s in range(STEPS):
        loss = model(**batch(s)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {n: p.detach().clone() for n, p in model.named_parameters()}, losses


def test_only_the_adapters_train_and_the_base_is_unchanged_bit_for_bit():
    model = lora_gpt2(peft_init=True)  # as get_peft_model leaves it: lora_B = 0
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and trainable == set(adapters(n for n, _ in model.named_parameters()))
    pm = attach(model)
    assert {s.name for s in pm.slots if not s.frozen_at_attach} == trainable
    assert {p._pstar.name for p in pm.optimizer.param_groups[0]["params"]} == trainable
    before = weights(pm)
    for s in range(STEPS):
        model(**batch(s)).loss.backward()
        pm.optimizer.step()
    after = weights(pm)
    frozen = [n for n in before if n not in trainable]
    assert all(torch.equal(before[n], after[n]) for n in frozen)
    assert all(not torch.equal(before[n], after[n]) for n in trainable)
    # Control: the same model with the base trainable changes the base.
    model_c = lora_gpt2(peft_init=True)
    model_c.requires_grad_(True)
    pm_c = attach(model_c)
    b = weights(pm_c)
    for s in range(STEPS):
        model_c(**batch(s)).loss.backward()
        pm_c.optimizer.step()
    a = weights(pm_c)
    assert all(not torch.equal(b[n], a[n]) for n in frozen)


def test_pm_optimizer_is_the_engine_loop_bit_for_bit():
    _, pm_a, losses_a = run_optimizer()
    pm_b, losses_b = run_engine()
    assert losses_a == losses_b
    assert same(weights(pm_a), weights(pm_b))
    assert pm_a.engine.hparam("step") == STEPS
    # Control: clipping ignored: the bits differ.
    _, pm_c, _ = run_optimizer(clip=None)
    assert not same(weights(pm_a), weights(pm_c))


def test_adapters_train_as_plain_torch_within_tolerance():
    # f32 compute: the forward and backward are torch's; only the AdamW
    # arithmetic differs (the engine's fused update vs torch's), so the
    # adapters agree to float32 rounding accumulated over 5 steps.
    _, pm, losses = run_optimizer("f32")
    want, want_losses = run_torch()
    got = weights(pm)
    assert losses[0] == want_losses[0]  # the same model, the same first forward
    assert losses == pytest.approx(want_losses, rel=1e-5)
    worst = 0.0
    for n in adapters(got):
        # atol: 1e-4 of the learning rate (each step moves a weight by up
        # to about lr); rtol: float32's rounding over a few steps.
        torch.testing.assert_close(got[n], want[n], rtol=1e-5, atol=1e-6)
        worst = max(worst, (got[n] - want[n]).abs().max().item())
    print(f"\nLoRA adapters, pstar f32 vs torch.optim.AdamW after {STEPS} steps: max |diff| {worst:.3g}")
    for n in got:
        if n not in adapters(got):
            assert torch.equal(got[n], want[n])  # the frozen base: the same bits in both
    # Control: without the clipping the torch run's adapters are out of tolerance.
    _, pm_c, _ = run_optimizer("f32", clip=None)
    assert any(not torch.allclose(weights(pm_c)[n], want[n], rtol=1e-5, atol=1e-6) for n in adapters(got))


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_save_pretrained_writes_the_adapter_with_pms_weights(tmp_path, dtype):
    from safetensors.torch import load_file
    model, pm, _ = run_optimizer(dtype)
    model.save_pretrained(str(tmp_path))
    assert sorted(f for f in os.listdir(tmp_path) if f.startswith("adapter_")) == \
        ["adapter_config.json", "adapter_model.safetensors"]
    saved = load_file(str(tmp_path / "adapter_model.safetensors"))
    names = adapters(s.name for s in pm.slots)
    assert len(saved) == len(names) == 4
    compute = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    untrained = dict(lora_gpt2().named_parameters())
    for n in names:
        key = n.replace(".default.", ".")  # PEFT drops the adapter's name
        assert saved[key].dtype == compute
        # The adapter holds the compute copy: the fp32 masters rounded.
        assert torch.equal(saved[key], pm.read(n).to(compute)), n
        # Control: the trained values, not those get_peft_model made.
        assert not torch.equal(saved[key], untrained[n].detach().to(compute)), n
    # Loaded into plain PyTorch, the adapter gives the attached model's
    # logits (autocast_adapter_dtype=False: PEFT would otherwise upcast a
    # bf16 model's adapters to fp32 and compute them in fp32).
    base = gpt2().to(compute).eval()
    plain = PeftModel.from_pretrained(base, str(tmp_path), autocast_adapter_dtype=False).eval()
    with torch.no_grad():
        ids = batch(99)["input_ids"]
        assert torch.equal(plain(input_ids=ids).logits, model(input_ids=ids).logits)


def test_bytes_per_frozen_and_trainable_element():
    chunk = 1 << 12  # larger parameters get jumbo chunks of their own size: little padding
    cfg = dict(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4)

    def measure(dtype, mode):
        torch.manual_seed(0)
        model = get_peft_model(transformers.GPT2LMHeadModel(transformers.GPT2Config(**cfg)), lora_config())
        if mode == "all trainable":
            model.requires_grad_(True)
        elif mode == "all frozen":
            model.requires_grad_(False)
        n = sum(p.numel() for p in model.parameters())
        n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
        pm = attach(model, dtype, chunk_elems=chunk)
        if n_train:  # Adam's moments exist from the first step on
            ids = torch.arange(1, 17)[None]
            model(input_ids=ids, labels=ids).loss.backward()
            pm.optimizer.step()
        return n, n_train, pm.engine.stats

    size = {"bf16": 2, "f32": 4}
    print()
    for dtype in ("bf16", "f32"):
        lora_n, lora_train, lora = measure(dtype, "LoRA")
        all_n, all_train, full = measure(dtype, "all trainable")
        none_n, _, frozen = measure(dtype, "all frozen")
        assert lora_n == all_n == none_n and all_train == all_n and 0 < lora_train < all_n // 20
        for name, n_train, st in (("LoRA (base frozen)", lora_train, lora), ("all trainable", all_train, full),
                                  ("all frozen", 0, frozen)):
            print(f"{dtype} {name:19s}: {all_n} elements, {n_train} trainable; host_bytes {st['host_bytes']}, "
                  f"compute_list_bytes {st['compute_list_bytes']} ({st['compute_chunks']} chunks), "
                  f"optimizer_list_bytes {st['optimizer_list_bytes']} ({st['optimizer_chunks']} chunks), "
                  f"{st['host_bytes'] / all_n:.2f} host bytes per element, fill {st['fill_ratio']:.3f}")
        # Elements of chunk capacity (parameters, alignment, chunk tails):
        # the compute list's bytes over the dtype's size.
        frozen_per_slot = frozen["host_bytes"] / (frozen["compute_list_bytes"] / size[dtype])
        train_per_slot = full["host_bytes"] / (full["compute_list_bytes"] / size[dtype])
        marginal = (full["host_bytes"] - lora["host_bytes"]) / (all_n - lora_train)
        per_adapter = (lora["host_bytes"] - frozen["host_bytes"]) / lora_train
        print(f"{dtype}: per element of chunk capacity: frozen {frozen_per_slot:.2f} bytes, trainable "
              f"{train_per_slot:.2f} bytes; per parameter element (alignment and chunk tails included): all "
              f"frozen {frozen['host_bytes'] / all_n:.2f}, all trainable {full['host_bytes'] / all_n:.2f}; LoRA "
              f"saves {marginal:.2f} bytes per frozen base element, and costs {per_adapter:.2f} bytes per adapter "
              f"element ({lora_train} elements in {lora['optimizer_chunks']} chunk(s) of {chunk})")
        # Documented (pstar.h: PSTAR_PARAM_FROZEN, pstar_stats; docs/design.md,
        # "Chunks"): a frozen parameter keeps its compute copy alone, no fp32
        # master and no Adam state; the fp32 lists (master, m, v) twin the
        # trainable chunks only, with identical offsets.
        assert frozen["optimizer_chunks"] == 0 and frozen["optimizer_list_bytes"] == 0
        assert frozen["host_bytes"] <= frozen["compute_list_bytes"]
        assert full["optimizer_chunks"] == full["compute_chunks"]
        assert full["optimizer_list_bytes"] == full["compute_list_bytes"] // size[dtype] * 4
        # With LoRA, only the adapters' chunk has fp32 lists (the adapters
        # are smaller than a chunk: one chunk of chunk_elems).
        assert lora["optimizer_chunks"] == 1 and lora["optimizer_list_bytes"] == 4 * chunk
        assert lora["compute_chunks"] == frozen["compute_chunks"] + 1
        assert lora["compute_list_bytes"] == frozen["compute_list_bytes"] + size[dtype] * chunk
