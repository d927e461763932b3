"""Token sampling from logits: greedy, temperature, top-k, top-p, per-request seeds (torch)."""

from __future__ import annotations

import torch

from pearl.engine.sequence import SamplingParams


def sample(
    logits: torch.Tensor,  # [n, vocab] float32
    params: list[SamplingParams],
    positions: list[int],  # index in the sequence of each token being sampled
    generator: torch.Generator,
) -> tuple[list[int], list[float]]:
    """Pick one token per row; return the tokens and their log-probabilities.

    The log-probability is taken under ``softmax(logits / temperature)`` before
    top-k/top-p truncation (under ``softmax(logits)`` for greedy rows), which is
    what an RL trainer recomputes from the same weights.
    """
    n = logits.shape[0]
    if n == 0:
        return [], []
    temps = [p.temperature if p.temperature > 0 else 1.0 for p in params]
    if all(t == 1.0 for t in temps):  # x / 1.0 == x: skip a pass over [n, vocab]
        logprobs_all = torch.log_softmax(logits, dim=-1)
    else:
        scale = torch.tensor(temps, dtype=logits.dtype).unsqueeze(1)
        logprobs_all = torch.log_softmax(logits / scale, dim=-1)
    if all(p.greedy for p in params):
        tokens = torch.argmax(logits, dim=-1)
    else:
        tokens = torch.empty(n, dtype=torch.long)
        for i, p in enumerate(params):
            if p.greedy:
                tokens[i] = torch.argmax(logits[i])
                continue
            probs = _truncated_probs(logprobs_all[i], p.top_k, p.top_p)
            gen = generator
            if p.seed is not None:
                gen = torch.Generator().manual_seed(
                    (p.seed * 1_000_003 + positions[i]) & 0x7FFF_FFFF_FFFF_FFFF
                )
            tokens[i] = torch.multinomial(probs, 1, generator=gen)
    chosen = logprobs_all.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return tokens.tolist(), chosen.tolist()


def _truncated_probs(logprobs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    probs = logprobs.exp()
    if top_k and top_k < probs.shape[0]:
        kth = torch.topk(probs, top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=0) / sorted_probs.sum()
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = cumulative - sorted_probs / sorted_probs.sum() >= top_p
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return probs / probs.sum()
