"""Token sampling from logits: greedy, temperature, top-k, top-p, per-request seeds (torch).

A token's log-probability is taken under the distribution it was drawn from: softmax of
the logits over the temperature, truncated by top-k then top-p and renormalized
(``truncated_log_softmax``; vLLM's ``logprobs_mode=processed_logprobs`` returns the same).
The trainer recomputes it with the same function, so its importance ratio is 1 on the
weights that sampled.
"""

from __future__ import annotations

import torch

from pearl.engine.sequence import SamplingParams


def sample(
    logits: torch.Tensor,  # [n, vocab] float32
    params: list[SamplingParams],
    positions: list[int],  # index in the sequence of each token being sampled
    generator: torch.Generator,
) -> tuple[list[int], list[float]]:
    """Pick one token per row; return the tokens and their log-probabilities (under
    ``softmax(logits)`` for greedy rows)."""
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
        return tokens.tolist(), logprobs_all.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
    tokens_out: list[int] = []
    logprobs_out: list[float] = []
    for i, p in enumerate(params):
        row = logprobs_all[i]
        if p.greedy:
            token = int(torch.argmax(logits[i]))
        else:
            if p.top_k or p.top_p < 1.0:
                row = truncated_log_softmax(row.unsqueeze(0), p.top_k, p.top_p)[0]
            gen = generator
            if p.seed is not None:
                gen = torch.Generator().manual_seed(
                    (p.seed * 1_000_003 + positions[i]) & 0x7FFF_FFFF_FFFF_FFFF
                )
            probs = row.exp()
            token = int(torch.multinomial(probs / probs.sum(), 1, generator=gen))
        tokens_out.append(token)
        logprobs_out.append(float(row[token]))
    return tokens_out, logprobs_out


def truncated_log_softmax(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``log_softmax`` of each row of ``logits`` [n, vocab] (already over the temperature)
    restricted to its top-k tokens (ties with the k-th kept; 0 disables), then to the
    smallest set of the most probable of those whose mass reaches ``top_p`` (a token is
    kept while the tokens more probable than it hold less than ``top_p``; the most probable
    always stays); -inf elsewhere. Differentiable in the kept logits (the trainer's ratio)."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits.detach(), top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits.detach() < kth, float("-inf"))
    if top_p < 1.0:
        with torch.no_grad():
            sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            before = torch.cumsum(probs, dim=-1) - probs  # mass of the more probable tokens
            drop_sorted = before >= top_p
            drop_sorted[..., 0] = False
            drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.log_softmax(logits, dim=-1)
