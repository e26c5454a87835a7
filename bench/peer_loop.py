"""The training loop the PyTorch peers of row 11 share: what a plain eager script does, written once.

Per step: the schedule's rate, forward, cross-entropy, backward, optional clipping, the optimizer's step and an
optional hook (an EMA update); the first step's time from the process's start. Per epoch (or every
``eval_every``): the validation score, a checkpoint of every state given and the best one. At the end: the best
checkpoint's states loaded back, and ``first step at S s`` printed for ``bench.end_to_end``.
"""
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, Optional, Sequence, Tuple

import torch
from torch import nn

Batches = Callable[[int], Iterable[Tuple[torch.Tensor, torch.Tensor]]]


def fit(model: nn.Module, optimizer: torch.optim.Optimizer, batches: Batches, epochs: int, rates: Sequence[float],
        validate: Callable[[], float], out: Path, start: float, states: Optional[Dict[str, object]] = None,
        after_step: Optional[Callable[[int], None]] = None, clip: Optional[float] = None,
        eval_every: int = 1) -> float:
    """Train `epochs` epochs of `batches(epoch)`; returns the first step's seconds from `start`.

    `states` are saved beside the model and optimizer (e.g. an EMA copy) and loaded back from the best checkpoint.
    """
    out.mkdir(parents=True, exist_ok=True)
    states = {"model": model, "optimizer": optimizer, **(states or {})}
    step, best, first, loss = 0, -1.0, None, None
    for epoch in range(1, epochs + 1):
        for x, y in batches(epoch):
            for group in optimizer.param_groups:
                group["lr"] = rates[step] if rates else group["lr"]
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            if after_step is not None:
                with torch.no_grad():
                    after_step(step)
            step += 1
            if first is None:
                loss.item()
                first = time.time() - start
        saved = {name: part.state_dict() for name, part in states.items()}
        torch.save(saved, out / f"epoch-{epoch}.pt")
        if epoch % eval_every == 0 or epoch == epochs:
            score = validate()
            if score > best:
                best = score
                torch.save(saved, out / "best.pt")
            print(f"epoch {epoch}: loss {loss.item():.4f}, validation {score:.4f}", flush=True)
    for name, state in torch.load(out / "best.pt").items():
        states[name].load_state_dict(state)
    print(f"first step at {first:.3f} s")
    return first


def shuffled_batches(x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int = 0) -> Batches:
    """A new permutation each epoch, the last incomplete batch dropped (as trainkit's training pipelines)."""
    generator = torch.Generator().manual_seed(seed)

    def batches(epoch: int):
        order = torch.randperm(len(y), generator=generator)
        for index in range(len(y) // batch_size):
            batch = order[index * batch_size:(index + 1) * batch_size]
            yield x[batch], y[batch]

    return batches
