"""Helpers shared by the ecosystem tests: the weights of an attached model
as fp32 copies, their bit-for-bit comparison, a batch of tokens, a
learning-rate schedule."""
import torch


def weights(pm):
    """Every parameter's fp32 master, copied, by name."""
    return {n: v.clone() for n, v in pm.state_dict().items()}


def same(a, b):
    """The same bits in every tensor of two weights() dicts."""
    return all(torch.equal(a[n], b[n]) for n in a)


def batch(step=0, vocab=64, rows=2, tokens=12):
    """Tokens of step `step` (the same for every run), labels = inputs."""
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(1, vocab, (rows, tokens), generator=g)
    return dict(input_ids=ids, labels=ids.clone())


def schedule(step):
    """A learning-rate factor that changes every step."""
    return 1.0 / (1 + step)
