"""A small Mamba language model on linrec.selective_scan, trained on synthetic text.

Each Mamba block is in_proj -> causal depthwise conv -> SiLU -> the selective scan (S6, input-dependent
step sizes, B and C) gated by SiLU(z) -> out_proj, in a residual stream with RMSNorm, as in the Mamba
paper. The text comes from a few fixed random Markov chains ("topics") over a small vocabulary, each
token with a few likely successors; every sequence follows one topic, drawn at its start. The next token
depends on the previous one (which the convolution sees) and on the topic, which only a memory of the
sequence so far reveals: the recurrence. The script prints the training loss (averaged since the
previous print) against three marks: chance, ln(vocab); what the previous token alone allows (the
topics' mixture); and what it allows with the topic known (the topics' entropy rate), which the model
approaches. Then it generates: a prompt in one call, which leaves each layer's conv inputs and scan
state in a cache, then a token at a time with linrec.selective_state_update.

Run from the repository root, on the GPU when there is one (with linrec's CUDA kernels), else on the CPU::

    python examples/mamba_lm.py                      # the defaults: about 15 s on 2 CPU cores
    python examples/mamba_lm.py --device cpu --steps 1000 --seed 1
    python examples/mamba_lm.py --help               # the data's and the model's sizes
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

import linrec


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Mamba(nn.Module):
    """One Mamba mixer over (batch, length, width): the selective scan runs over (batch, d_inner, length)."""

    def __init__(self, width: int, state: int = 8, expand: int = 2, conv: int = 4) -> None:
        super().__init__()
        inner, self.state = expand * width, state
        self.rank = math.ceil(width / 16)  # the low rank of the step sizes' projection
        self.in_proj = nn.Linear(width, 2 * inner, bias=False)
        self.conv = nn.Conv1d(inner, inner, conv, groups=inner)  # its parameters, for linrec.causal_conv1d
        self.x_proj = nn.Linear(inner, self.rank + 2 * state, bias=False)
        self.dt_proj = nn.Linear(self.rank, inner, bias=False)
        # Step sizes start between 0.001 and 0.1 (softplus of the bias), as Mamba initializes them.
        dt = torch.exp(torch.rand(inner) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, state + 1, dtype=torch.float32)).repeat(inner, 1))
        self.D = nn.Parameter(torch.ones(inner))
        self.out_proj = nn.Linear(inner, width, bias=False)

    def forward(self, x: torch.Tensor, cache: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """(batch, length, width) -> (batch, length, width). With ``cache`` (a dict), also leaves in it what
        step() continues from: the conv's last inputs and the scan's last state."""
        u, z = self.in_proj(x).transpose(1, 2).chunk(2, dim=1)  # (batch, inner, length) each
        # The causal conv and SiLU; with a cache, also its last kernel - 1 inputs (zeros before the first).
        u = linrec.causal_conv1d(u, self.conv.weight.squeeze(1), self.conv.bias, "silu",
                                 return_final_states=cache is not None)
        if cache is not None:
            u, cache["conv"] = u
        dt, B, C = self.x_proj(u.transpose(1, 2)).split([self.rank, self.state, self.state], dim=-1)
        delta = self.dt_proj(dt).transpose(1, 2)  # (batch, inner, length)
        y = linrec.selective_scan(u, delta, -torch.exp(self.A_log), B.transpose(1, 2), C.transpose(1, 2), self.D, z,
                                  delta_bias=self.dt_bias, delta_softplus=True, return_last_state=cache is not None)
        if cache is not None:
            y, cache["ssm"] = y
        return self.out_proj(y.transpose(1, 2))

    def step(self, x: torch.Tensor, cache: dict[str, torch.Tensor]) -> torch.Tensor:
        """One token, (batch, width) -> (batch, width), continuing from ``cache`` and updating it in place: the conv
        by linrec.causal_conv1d_update, the scan by linrec.selective_state_update."""
        u, z = self.in_proj(x).chunk(2, dim=-1)  # (batch, inner) each
        u = linrec.causal_conv1d_update(u, cache["conv"], self.conv.weight.squeeze(1), self.conv.bias, "silu")
        dt, B, C = self.x_proj(u).split([self.rank, self.state, self.state], dim=-1)
        y = linrec.selective_state_update(cache["ssm"], u, self.dt_proj(dt), -torch.exp(self.A_log), B, C, self.D, z,
                                          dt_bias=self.dt_bias, dt_softplus=True)
        return self.out_proj(y)


class Model(nn.Module):
    """Tokens (batch, length) -> next-token logits (batch, length, vocab)."""

    def __init__(self, vocab: int, width: int, layers: int, state: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.norms = nn.ModuleList(RMSNorm(width) for _ in range(layers))
        self.mixers = nn.ModuleList(Mamba(width, state) for _ in range(layers))
        self.norm = RMSNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, caches: list[dict] | None = None) -> torch.Tensor:
        """With ``caches`` (a dict per layer), also leaves in them what step() continues from."""
        x = self.embed(tokens)
        for layer, (norm, mixer) in enumerate(zip(self.norms, self.mixers)):
            x = x + mixer(norm(x), None if caches is None else caches[layer])
        return self.head(self.norm(x))

    def step(self, token: torch.Tensor, caches: list[dict]) -> torch.Tensor:
        """The next-token logits (batch, vocab) after one more token (batch,), from and into ``caches``."""
        x = self.embed(token)
        for norm, mixer, cache in zip(self.norms, self.mixers, caches):
            x = x + mixer.step(norm(x), cache)
        return self.head(self.norm(x))

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, tokens: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples ``tokens`` more tokens after ``prompt`` (batch, length): the prompt in one call (the prefill),
        then a step per token. Returns the tokens (batch, length + tokens) and the steps' logits."""
        caches = [{} for _ in self.mixers]
        logits = self(prompt, caches)[:, -1]
        sequence, step_logits = [prompt], []
        for _ in range(tokens):
            probabilities = torch.softmax(logits.float(), dim=-1).cpu()
            token = torch.multinomial(probabilities, 1, generator=generator).to(prompt.device)
            sequence.append(token)
            logits = self.step(token[:, 0], caches)
            step_logits.append(logits)
        return torch.cat(sequence, dim=1), torch.stack(step_logits, dim=1)


def markov_chains(topics: int, vocab: int, successors: int, generator: torch.Generator) -> torch.Tensor:
    """(topics, vocab, vocab) transition probabilities: in each topic, each token goes to `successors`
    random tokens, with random weights, and to any token with a little probability."""
    logits = torch.full((topics * vocab, vocab), -4.0)
    chosen = torch.rand(topics * vocab, vocab, generator=generator).argsort(dim=1)[:, :successors]
    logits.scatter_(1, chosen, torch.randn(topics * vocab, successors, generator=generator))
    return logits.softmax(dim=1).view(topics, vocab, vocab)


def entropy(probabilities: torch.Tensor) -> torch.Tensor:
    return -(probabilities * probabilities.clamp_min(1e-30).log()).sum(-1)


def lowest_losses(transitions: torch.Tensor) -> tuple[float, float]:
    """The loss per token of predicting from the previous token alone, and from it and the topic: the
    entropy rates of the topics' mixture and of the topics themselves, under their stationary
    distributions (topics equally likely)."""
    chains = transitions.double()
    stationary = torch.linalg.matrix_power(chains, 256)[:, 0]  # (topics, vocab)
    known = (stationary * entropy(chains)).sum(1).mean()
    weights = stationary / stationary.sum(0)  # P(topic | previous token)
    mixture = (weights.unsqueeze(-1) * chains).sum(0)  # P(next | previous token)
    return float((stationary.mean(0) * entropy(mixture)).sum()), float(known)


def sample(transitions: torch.Tensor, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """(batch, length) token ids, each row from one random topic and a random first token."""
    topics, vocab, _ = transitions.shape
    chains = transitions[torch.randint(0, topics, (batch,), generator=generator)]  # (batch, vocab, vocab)
    tokens = [torch.randint(0, vocab, (batch,), generator=generator)]
    for _ in range(length - 1):
        rows = chains[torch.arange(batch), tokens[-1]]
        tokens.append(torch.multinomial(rows, 1, generator=generator).squeeze(1))
    return torch.stack(tokens, dim=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() and linrec.HAS_CUDA_KERNELS else "cpu",
                        help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the model, the chain and the data (default 0)")
    parser.add_argument("--vocab", type=int, default=32, help="vocabulary size (default 32)")
    parser.add_argument("--topics", type=int, default=4, help="Markov chains the sequences follow (default 4)")
    parser.add_argument("--successors", type=int, default=2, help="likely successors of each token (default 2)")
    parser.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    parser.add_argument("--length", type=int, default=64, help="tokens per sequence (default 64)")
    parser.add_argument("--width", type=int, default=64, help="model width (default 64)")
    parser.add_argument("--layers", type=int, default=2, help="Mamba blocks (default 2)")
    parser.add_argument("--state", type=int, default=8, help="state size n of each channel (default 8)")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (default 3e-3)")
    parser.add_argument("--log-every", type=int, default=50, help="steps between printed losses (default 50)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)  # the chain and the data, on the CPU
    transitions = markov_chains(args.topics, args.vocab, args.successors, generator)
    previous_only, topic_known = lowest_losses(transitions)
    device = torch.device(args.device)
    model = Model(args.vocab, args.width, args.layers, args.state).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.steps, pct_start=0.1)
    print(f"Mamba LM: {sum(p.numel() for p in model.parameters())} parameters, {args.layers} layers, on {device}; "
          f"loss at chance {math.log(args.vocab):.4f}, from the previous token {previous_only:.4f}, "
          f"and the topic too {topic_known:.4f}")

    start = time.perf_counter()
    total_loss = count = 0.0
    for step in range(1, args.steps + 1):
        tokens = sample(transitions, args.batch, args.length + 1, generator).to(device)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()

        total_loss += loss.item()
        count += 1
        if step == 1 or step % args.log_every == 0 or step == args.steps:
            print(f"step {step:5d}  loss {total_loss / count:.4f}", flush=True)
            total_loss = count = 0.0
    print(f"{args.steps} steps in {time.perf_counter() - start:.1f} s")

    # Generation: a prompt of 16 tokens of one topic, then 32 tokens sampled step by step. The steps' logits
    # match those of the whole sequence in one call (they differ by the conv's and the sums' rounding).
    model.eval()
    prompt = sample(transitions, 2, 16, generator).to(device)
    sequence, step_logits = model.generate(prompt, 32, generator)
    with torch.no_grad():
        full_logits = model(sequence)[:, prompt.shape[1]:]  # after each generated token
    print(f"generated: {sequence[0].tolist()}")
    print(f"decode steps against one call over the sequence: logits differ by at most "
          f"{(step_logits - full_logits).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
