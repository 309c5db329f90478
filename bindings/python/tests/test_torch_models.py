"""pstar.torch on real models as their users build them: a Hugging Face
GPT-2 (tied embeddings, padding with attention_mask, -100 labels, both
gradient checkpointing modes) and a torchvision VisionTransformer (class
token and position embedding used outside any submodule's forward), trained
through an emulated device small enough that chunks are evicted, against
plain PyTorch with the same precision recipe: a bf16 model whose fp32
master copies torch's AdamW updates."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
torchvision = pytest.importorskip("torchvision")
import pstar.torch as ptorch  # noqa: E402

LR, BETAS, EPS, WD = 3e-3, (0.9, 0.999), 1e-8, 0.01
STEPS = 20
transformers.logging.set_verbosity_error()


def gpt2(seed=0):
    cfg = transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
                                  eos_token_id=0, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0)
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(cfg).to(torch.bfloat16)


def gpt2_batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    # A learnable sequence: each token follows from the one before.
    ids = torch.empty(4, 24, dtype=torch.long)
    ids[:, 0] = torch.randint(1, 96, (4,), generator=g)
    for t in range(1, 24):
        ids[:, t] = (ids[:, t - 1] * 7 + 3) % 95 + 1
    mask = torch.ones_like(ids)
    mask[1, 18:] = 0            # right padding
    mask[3, 10:] = 0
    ids[mask == 0] = 0
    labels = ids.clone()
    labels[mask == 0] = -100    # padding takes no loss
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


def gpt2_loss(model, step):
    return model(**gpt2_batch(step)).loss


def vit(seed=0):
    torch.manual_seed(seed)
    return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                                hidden_dim=32, mlp_dim=64, num_classes=10,
                                                dropout=0.0, attention_dropout=0.0).to(torch.bfloat16)


def vit_loss(model, step):
    g = torch.Generator().manual_seed(2000 + step)
    images = torch.randn(4, 3, 32, 32, generator=g).to(torch.bfloat16)
    labels = torch.randint(0, 10, (4,), generator=g)
    return torch.nn.functional.cross_entropy(model(images).float(), labels)


def train_reference(model, loss_fn, steps):
    """Plain PyTorch: bf16 forward and backward, fp32 masters, torch AdamW."""
    params = list(model.parameters())
    masters = [p.detach().float().clone().requires_grad_(True) for p in params]
    opt = torch.optim.AdamW(masters, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    losses = []
    for s in range(steps):
        model.zero_grad(set_to_none=True)
        loss = loss_fn(model, s)
        loss.backward()
        for m, p in zip(masters, params):
            m.grad = None if p.grad is None else p.grad.float()
        opt.step()
        with torch.no_grad():
            for m, p in zip(masters, params):
                p.copy_(m.to(p.dtype))
        losses.append(loss.item())
    return losses


def attach(model, capacity):
    return ptorch.attach(model, device="emulated", compute_dtype="bf16", chunk_elems=4096,
                         device_capacity_bytes=capacity, lr=LR, beta1=BETAS[0], beta2=BETAS[1], eps=EPS,
                         weight_decay=WD, adamw=1)


def train_pstar(model, loss_fn, steps, capacity):
    pm = attach(model, capacity)
    losses = []
    for s in range(steps):
        with pm.train_iteration():
            loss = loss_fn(model, s)
            loss.backward()
            result = pm.step()
        assert result.params_updated == len(pm.slots), (s, result)
        losses.append(loss.item())
    return losses, pm


# About three 4096-element bf16 chunks and the largest gradient buffers:
# every step evicts.
CAPACITY = 3 * 4096 * 2 + 2 * 4096 * 4


@pytest.mark.parametrize("checkpointing", [None, "non-reentrant", "reentrant"])
def test_gpt2_trains_like_pytorch(checkpointing):
    ref = gpt2()
    model = gpt2()
    for m in (ref, model):
        m.train()
        if checkpointing:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": checkpointing == "reentrant"})
    ref_losses = train_reference(ref, gpt2_loss, STEPS)
    losses, pm = train_pstar(model, gpt2_loss, STEPS, CAPACITY)
    assert pm.engine.stats["evictions"] > 0
    assert max(abs(a - b) for a, b in zip(losses, ref_losses)) < 1e-2, (losses, ref_losses)
    assert losses[-1] < losses[0] - 0.1


def test_vit_trains_like_pytorch():
    ref_losses = train_reference(vit(), vit_loss, STEPS)
    model = vit()
    losses, pm = train_pstar(model, vit_loss, STEPS, CAPACITY)
    names = [s.name for s in pm.slots]
    assert "class_token" in names and "encoder.pos_embedding" in names
    assert pm.engine.stats["evictions"] > 0
    assert max(abs(a - b) for a, b in zip(losses, ref_losses)) < 1e-2, (losses, ref_losses)
    assert losses[-1] < losses[0]


def test_gpt2_built_on_the_meta_device_trains_as_the_same_model_built_on_the_cpu():
    # attach(init=...): the parameters have no values until the engine is
    # built; init fills each one, here from a model built on the CPU with
    # the same seed, so the two runs must give the same losses bit for bit.
    cpu = gpt2()
    values = {name: p.detach().float().clone() for name, p in cpu.named_parameters()}
    cfg = cpu.config
    with torch.device("meta"):
        meta = transformers.GPT2LMHeadModel(cfg).to(torch.bfloat16)
    assert all(p.device.type == "meta" for p in meta.parameters())
    seen = []

    def init(name, t):
        assert t.device.type == "cpu" and t.dtype == torch.float32 and t.shape == values[name].shape
        seen.append(name)
        t.copy_(values[name])

    pm = ptorch.attach(meta, device="emulated", compute_dtype="bf16", chunk_elems=4096,
                       device_capacity_bytes=CAPACITY, lr=LR, beta1=BETAS[0], beta2=BETAS[1], eps=EPS,
                       weight_decay=WD, adamw=1, init=init)
    assert sorted(seen) == sorted(values), "init called once per parameter (tied ones once)"
    meta.train()
    losses = []
    for s in range(5):
        with pm.train_iteration():
            loss = gpt2_loss(meta, s)
            loss.backward()
            pm.step()
        losses.append(loss.item())
    ref_losses, _ = train_pstar(cpu, gpt2_loss, 5, CAPACITY)
    assert losses == ref_losses


def test_a_meta_parameter_without_init_is_refused():
    with torch.device("meta"):
        model = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match="meta device"):
        ptorch.attach(model, device="emulated", compute_dtype="bf16")
