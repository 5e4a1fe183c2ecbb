"""Hugging Face transformers generation backend with a KV cache and constrained sampling."""

from __future__ import annotations

import torch

from agentrecipe.agent.decoding import TokenTrie
from agentrecipe.rollout.backend import Generation, SamplingParams


def sample_token(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None):
    """Sample from (V,) logits at `temperature` (0 = greedy); return (token, log-prob under the sampled distribution).

    The log-prob is log softmax(logits / T) (T = 1 when greedy); top-p keeps the
    smallest set of tokens whose probability reaches p, renormalised.
    """
    if temperature == 0:
        logp = torch.log_softmax(logits.float(), -1)
        tok = int(torch.argmax(logp))
        return tok, float(logp[tok])
    logp = torch.log_softmax(logits.float() / temperature, -1)
    if top_p < 1.0:
        sorted_logp, order = torch.sort(logp, descending=True)
        keep = torch.cumsum(sorted_logp.exp(), -1) - sorted_logp.exp() < top_p
        masked = torch.full_like(logp, float("-inf"))
        masked[order[keep]] = logp[order[keep]]
        logp = torch.log_softmax(masked, -1)
    tok = int(torch.multinomial(logp.exp(), 1, generator=generator))
    return tok, float(logp[tok])


class HFBackend:
    """Batched generation with the policy itself (left padding, KV cache within the turn)."""

    def __init__(self, model, pad_id: int, eos_id: int):
        self.model = getattr(model, "module", model)
        self.pad_id = pad_id
        self.eos_id = eos_id

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def update_weights(self, model) -> None:
        """The policy itself generates: nothing to copy, just follow the (possibly new) module."""
        self.model = getattr(model, "module", model)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, tries: list[TokenTrie | None] | None = None
    ) -> list[Generation]:
        if not prompts:
            return []
        tries = tries or [None] * len(prompts)
        gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        was_training = self.model.training
        self.model.eval()
        B, L = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding keeps every row's last token at the end
            input_ids[i, L - len(p):] = torch.tensor(p)
            attn[i, L - len(p):] = 1
        position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
        out = [Generation(ids=[], logprobs=[], allowed=[] if t is not None else None, finished=False) for t in tries]
        live = [True] * B
        past = None
        step_ids, step_pos = input_ids, position_ids
        for _ in range(params.max_new_tokens):
            res = self.model(
                input_ids=step_ids.to(self.device),
                attention_mask=attn.to(self.device),
                position_ids=step_pos.to(self.device),
                past_key_values=past,
                use_cache=True,
            )
            past = res.past_key_values
            logits = res.logits[:, -1, :].float().cpu()  # (B, V)
            next_ids = torch.full((B,), self.pad_id, dtype=torch.long)
            for i in range(B):
                if not live[i]:
                    continue
                row = logits[i]
                if tries[i] is not None:
                    allowed = tries[i].allowed(out[i].ids)
                    mask = torch.full_like(row, float("-inf"))
                    mask[allowed] = 0.0
                    row = row + mask
                    out[i].allowed.append(allowed)
                tok, lp = sample_token(row, params.temperature, params.top_p, gen)
                out[i].ids.append(tok)
                out[i].logprobs.append(lp)
                next_ids[i] = tok
                if tok == self.eos_id:
                    live[i] = False
                    out[i].finished = True
            if not any(live):
                break
            step_ids = next_ids[:, None]
            step_pos = step_pos[:, -1:] + 1
            attn = torch.cat([attn, torch.ones((B, 1), dtype=torch.long)], dim=1)
        if was_training:
            self.model.train()
        return out
