"""Selective copying with linrec.nn.MinGRU: a small recurrent model learns to copy, in order, the few data
tokens scattered among noise tokens, once it reads a delimiter.

An example sequence (``.`` is noise, ``|`` the delimiter, ``_`` a blank to answer on)::

    input   . 3 . . . 7 . . 1 . . . . 5 . . | _ _ _ _
    target                                    3 7 1 5

The model is an embedding, a few residual blocks (LayerNorm -> MinGRU, LayerNorm -> MLP) and a linear
head; each MinGRU layer runs over the whole sequence in one linrec call. Trained with AdamW on fresh
random batches, it prints the training loss (averaged since the previous print) and the accuracy on the
copied tokens; both must clearly improve.

Run from the repository root, on the GPU when there is one (with linrec's CUDA kernels), else on the CPU::

    python examples/selective_copying.py                      # the defaults: well under a minute on 2 CPU cores
    python examples/selective_copying.py --device cpu --steps 2000 --seed 1
    python examples/selective_copying.py --help               # the task's and the model's sizes
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import linrec


class Block(nn.Module):
    """``x + MinGRU(norm(x))``, then ``x + MLP(norm(x))``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm_rnn = nn.LayerNorm(width)
        self.rnn = linrec.nn.MinGRU(width, width)
        self.norm_mlp = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.norm_rnn(x))
        x = x + h
        return x + self.mlp(self.norm_mlp(x))


class Model(nn.Module):
    """Tokens (batch, time) -> logits (batch, time, vocab)."""

    def __init__(self, vocab: int, width: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def make_batch(batch: int, length: int, copies: int, data_tokens: int, generator: torch.Generator):
    """Token ids: 0 noise, 1..data_tokens data, data_tokens + 1 the delimiter, data_tokens + 2 the blank.
    Returns the inputs (batch, length + 1 + copies) and the targets (batch, copies): the data tokens in order,
    to predict on the blanks."""
    positions = torch.rand(batch, length, generator=generator).argsort(dim=1)[:, :copies].sort(dim=1).values
    targets = torch.randint(1, data_tokens + 1, (batch, copies), generator=generator)
    region = torch.zeros(batch, length, dtype=torch.long).scatter_(1, positions, targets)
    delimiter = torch.full((batch, 1), data_tokens + 1)
    blanks = torch.full((batch, copies), data_tokens + 2)
    return torch.cat([region, delimiter, blanks], dim=1), targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600, help="training steps (default 600)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() and linrec.HAS_CUDA_KERNELS else "cpu",
                        help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the model and the data (default 0)")
    parser.add_argument("--batch", type=int, default=64, help="sequences per step (default 64)")
    parser.add_argument("--length", type=int, default=32, help="positions holding data and noise (default 32)")
    parser.add_argument("--copies", type=int, default=4, help="data tokens to copy (default 4)")
    parser.add_argument("--data-tokens", type=int, default=8, help="distinct data tokens (default 8)")
    parser.add_argument("--width", type=int, default=64, help="model width (default 64)")
    parser.add_argument("--layers", type=int, default=2, help="residual MinGRU blocks (default 2)")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (default 3e-3)")
    parser.add_argument("--log-every", type=int, default=50, help="steps between printed losses (default 50)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)  # the data, on the CPU: the same batches on any device
    device = torch.device(args.device)
    model = Model(args.data_tokens + 3, args.width, args.layers).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.steps, pct_start=0.1)
    print(f"selective copying: {args.copies} of {args.length} positions, {args.data_tokens} data tokens; "
          f"{sum(p.numel() for p in model.parameters())} parameters, {args.layers} MinGRU layers, on {device}")

    start = time.perf_counter()
    total_loss = total_correct = count = 0.0
    for step in range(1, args.steps + 1):
        tokens, targets = make_batch(args.batch, args.length, args.copies, args.data_tokens, generator)
        tokens, targets = tokens.to(device), targets.to(device)
        logits = model(tokens)[:, -args.copies:]  # the predictions on the blanks
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()

        total_loss += loss.item()
        total_correct += (logits.argmax(-1) == targets).float().mean().item()
        count += 1
        if step == 1 or step % args.log_every == 0 or step == args.steps:
            print(f"step {step:5d}  loss {total_loss / count:.4f}  accuracy {total_correct / count:.3f}", flush=True)
            total_loss = total_correct = count = 0.0
    print(f"done: {args.steps} steps in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
