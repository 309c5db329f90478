"""pstar.torch and torch.distributed in the same processes, on torchrun's store.

Started by torchrun (tests/launchers/CMakeLists.txt: 2 ranks, --standalone):

    torchrun --standalone --nproc-per-node 2 torchrun_pstar_torch.py

Each rank calls torch.distributed.init_process_group("gloo"), which joins
torchrun's agent store, and attaches a small model to a libpstar engine
that takes its ranks from the same environment and joins the same store
(libpstar's keys under "libpstar/attempt_<N>/").  The ranks train on
their own halves of each batch with libpstar averaging the gradients, while
torch.distributed all-reduces the loss after every step.  Checks:
  - the parameters are the same on both ranks, and equal (to fp32 rounding)
    to one process training on the whole batch;
  - torch.distributed's collectives and libpstar's interleave without either
    disturbing the other;
  - libpstar's keys sit under its prefix in torchrun's store, read through
    a plain torch.distributed.TCPStore client.
"""
import os
import sys

import torch
import torch.distributed as dist

import pstar.torch as ptorch

STEPS = 12
BATCH = 32


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def batches():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(8, 1, generator=g)
    for _ in range(STEPS):
        x = torch.randn(BATCH, 8, generator=g)
        yield x, torch.tanh(x @ w)


def train(world_size, rank, from_environment):
    """Trains on this rank's slice; from_environment: the engine takes its
    ranks from torchrun's variables (world_size=0), else it is one process."""
    model = make_model()
    pm = ptorch.attach(model, device="emulated", compute_dtype="f32", chunk_elems=256, lr=1e-2,
                       world_size=0 if from_environment else 1)
    losses = []
    for x, y in batches():
        half = BATCH // world_size
        xs, ys = x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half]
        with pm.train_iteration():
            loss = torch.nn.functional.mse_loss(model(xs), ys)
            loss.backward()
            pm.step()
        if world_size > 1:
            # torch.distributed between libpstar's steps, in the same processes.
            t = torch.tensor([loss.item()])
            dist.all_reduce(t)
            losses.append(t.item() / world_size)
        else:
            losses.append(loss.item())
    params = {s.name: pm.read(s.name) for s in pm.slots}
    return params, losses


def main():
    assert os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True", "run me under torchrun"
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 2, world

    params, losses = train(world, rank, from_environment=True)

    gathered = [None] * world
    dist.all_gather_object(gathered, {k: v.tolist() for k, v in params.items()})
    for name in params:
        assert gathered[0][name] == gathered[1][name], f"{name} differs between the ranks"
    assert losses[-1] < losses[0] * 0.9, losses

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    live = [f"libpstar/attempt_{attempt}/pstar/group/0/live/{r}" for r in range(world)]
    assert store.check(live), f"libpstar's heartbeat keys {live} are not in torchrun's store"
    assert not store.check(["pstar/group/0/live/0"]), "a libpstar key outside its prefix"

    if rank == 0:
        # One process on the whole batch: the same training up to the order
        # of the fp32 sums (gradients averaged over two halves).
        alone, alone_losses = train(1, 0, from_environment=False)
        for name, v in params.items():
            err = (v - alone[name]).abs().max().item()
            assert torch.allclose(v, alone[name], rtol=1e-4, atol=1e-5), f"{name}: max difference {err}"
        print(f"rank 0: loss {losses[0]:.4f} -> {losses[-1]:.4f} over {STEPS} steps; parameters equal on both "
              f"ranks and within 1e-4 of one process (loss {alone_losses[-1]:.4f})")
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: torchrun_pstar_torch passed")


if __name__ == "__main__":
    sys.exit(main())
