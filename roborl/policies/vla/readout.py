"""What the flow VLA's expert reads from the backbone. Pooling (last token ⊕ mean) averages away where
things are in the image: the mean mixes every patch, and the last token sees the patches only through the
LM's attention, trained for cloning. An attention readout gives the expert its own look at every prefix
token, as pi0's expert attends to the prefix, while the expert stays a small MLP: a few learned queries
attend over the backbone's last hidden states. It trains with the expert (by BC and by RL), also on a
frozen backbone."""
from __future__ import annotations

import torch
from torch import nn


class AttentionReadout(nn.Module):
    """`queries` learned queries, one multi-head attention over the unmasked prefix tokens: N×S×D → N×(queries·D)."""

    def __init__(self, width: int, queries: int, heads: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.queries = nn.Parameter(torch.randn(queries, width) * width ** -0.5)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.out_dim = queries * width

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        keys = self.norm(hidden.float())
        queries = self.queries.expand(keys.shape[0], -1, -1)
        out, _ = self.attention(queries, keys, keys, key_padding_mask=mask == 0, need_weights=False)
        return out.flatten(1)
