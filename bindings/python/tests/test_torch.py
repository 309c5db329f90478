"""pstar.torch: any nn.Module's parameters in libpstar chunks, against plain
PyTorch AdamW in fp32 on the same steps."""
import copy
import gc
import weakref

import pytest

torch = pytest.importorskip("torch")
import pstar  # noqa: E402
import pstar.torch as ptorch  # noqa: E402
from pstar import _dlpack  # noqa: E402

LR, BETAS, EPS, WD = 1e-2, (0.9, 0.999), 1e-8, 0.01


class TinyLM(torch.nn.Module):
    """Tied embedding and head, a block called twice per step, a parameter
    used outside any module's forward (``scale``, in the loss), optional
    activation checkpointing of the block."""

    def __init__(self, vocab=11, dim=8, checkpoint=False):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.block = torch.nn.Sequential(torch.nn.Linear(dim, dim), torch.nn.Tanh(), torch.nn.Linear(dim, dim))
        self.norm = torch.nn.LayerNorm(dim)
        self.scale = torch.nn.Parameter(torch.tensor(0.5))
        self.checkpoint = checkpoint

    def run_block(self, h):
        if self.checkpoint:
            return torch.utils.checkpoint.checkpoint(self.block, h, use_reentrant=False)
        return self.block(h)

    def forward(self, tokens):
        h = self.emb(tokens)
        h = h + self.run_block(h)
        h = h + self.run_block(h)          # the same module again
        h = self.norm(h)
        return h @ self.emb.weight.t()     # tied head: the embedding's weight


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, 11, (4, 6), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(model, logits, targets):
    # model.scale is used here, outside every module's forward.
    return torch.nn.functional.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1)) * model.scale.abs() * 2


def reference(model, steps):
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    losses = []
    for s in range(steps):
        x, y = batch(s)
        opt.zero_grad()
        loss = loss_of(model, model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def with_pstar(model, steps, capacity=0):
    pm = ptorch.attach(model, device="emulated", compute_dtype="f32", chunk_elems=128, device_capacity_bytes=capacity,
                       lr=LR, beta1=BETAS[0], beta2=BETAS[1], eps=EPS, weight_decay=WD, adamw=1)
    losses = []
    for s in range(steps):
        x, y = batch(s)
        with pm.train_iteration():
            loss = loss_of(model, model(x), y)
            loss.backward()
            pm.step()
        losses.append(loss.item())
    return losses, pm


@pytest.mark.parametrize("checkpoint", [False, True])
def test_training_matches_torch_adamw_in_fp32(checkpoint):
    torch.manual_seed(0)
    model = TinyLM(checkpoint=checkpoint)
    twin = copy.deepcopy(model)
    ref_losses, ref_params = reference(twin, steps=8)
    losses, pm = with_pstar(model, steps=8)
    # The same losses and parameters as PyTorch's AdamW, to within what the
    # two implementations' rounding allows (libpstar computes its update
    # with explicit fused multiply-adds; tests/torch/adamw_vs_torch.py).
    assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    state = pm.state_dict()
    names = {n for n, _ in twin.named_parameters()}
    assert set(state) == names  # the tied weight once
    for n in names:
        torch.testing.assert_close(state[n], ref_params[n], rtol=1e-5, atol=1e-6, msg=n)
    stats = pm.engine.stats
    assert stats["steps"] == 8


def test_chunks_move_and_results_do_not_change():
    torch.manual_seed(0)
    free_model = TinyLM()
    tight_model = copy.deepcopy(free_model)
    free_losses, free_pm = with_pstar(free_model, steps=4)
    # Room for about two 128-element chunks and the gradient buffers.
    tight_losses, tight_pm = with_pstar(tight_model, steps=4, capacity=2 * 128 * 4 + 4 * 128 * 4)
    assert tight_pm.engine.stats["evictions"] > 0
    assert tight_losses == free_losses
    for n, v in free_pm.state_dict().items():
        assert torch.equal(v, tight_pm.state_dict()[n]), n


def test_an_abandoned_forward_leaves_nothing_alive():
    # A forward with autograd on that no backward follows (a notebook's
    # model(x)) is abandoned by the next eval_iteration().  Its graph is
    # never walked: what it saved must not hold the ParameterModel, its
    # engine or the chunk views once the model is dropped.
    gc.collect()
    before = _dlpack.live_exports()
    torch.manual_seed(0)
    model = TinyLM()
    pm = ptorch.attach(model, device="emulated", compute_dtype="f32", chunk_elems=128)
    x, _ = batch(0)
    model(x)
    with pytest.warns(RuntimeWarning, match="no backward followed"):
        with pm.eval_iteration():
            pass
    alive = weakref.ref(pm)
    del model, pm
    gc.collect()
    assert alive() is None
    assert _dlpack.live_exports() == before


def test_eval_iteration_and_misuse():
    torch.manual_seed(0)
    model = TinyLM()
    pm = ptorch.attach(model, device="emulated", compute_dtype="f32", chunk_elems=128)
    x, _ = batch(0)
    model(x)                                  # with autograd: begins a TRAIN iteration
    with pytest.warns(RuntimeWarning, match="no backward followed"):
        with pm.eval_iteration():             # no backward came: abandoned
            pass
    model(x).sum().backward()                 # its backward began: the iteration is the user's
    with pytest.raises(pstar.InvalidStateError, match="begun implicitly"):
        with pm.eval_iteration():
            pass
    pm.abandon_iteration()
    with torch.no_grad():                     # outside an iteration: the current weights, copied
        plain = model(x)
    with pm.eval_iteration():
        logits = model(x)
    assert logits.shape == (4, 5, 11)
    assert torch.equal(logits, plain)
    assert model.emb.weight.shape == (11, 8)            # metadata without an acquire
    assert model.emb.weight.dtype == torch.float32
    assert isinstance(model.emb.weight, ptorch.PstarParameter)
    assert model.emb.weight is model.emb.weight          # tied stays tied
