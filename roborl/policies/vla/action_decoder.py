"""An action-token decoder for the token VLA (`policy.vla.action_head: decoder`). With `lm` the language
model itself predicts the action tokens, so its weights are the actor and a frozen backbone leaves nothing
to train. The decoder is a small causal transformer over the action tokens whose every layer also attends
to the backbone's last hidden states over the [image, prompt, proprio] prefix: the tokens are still
predicted one bin at a time and log π is still the sum over them, but a pretrained backbone can stay
frozen under it, as under the flow VLA's new expert (its hidden states are stored at `act`, so PPO's
epochs skip the backbone).

`forward` is the teacher-forced pass (training, log-probs); `generate` decodes one token at a time on a
key/value cache with the same weights: each step runs the new token alone and the prefix's cross-attention
keys and values are projected once per decision, not once per token. With `pooled` every token's input also
carries a projection of the pooled prefix (the last token ⊕ the mean, what the flow expert reads)."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from roborl.policies.vla.backbone import VLABackbone


class ActionTokenDecoder(nn.Module):
    """Logits over `bins` for each of `num_tokens` action tokens, position t given the bins before it."""

    def __init__(self, memory_width: int, bins: int, num_tokens: int, width: int, layers: int, heads: int,
                 pooled: bool = False) -> None:
        super().__init__()
        self.start = bins  # the id of the start token, after the bins
        self.heads = heads
        self.memory = nn.Sequential(nn.LayerNorm(memory_width), nn.Linear(memory_width, width))
        self.embed = nn.Embedding(bins + 1, width)
        self.position = nn.Parameter(torch.randn(num_tokens, width) * 0.02)
        # the flow expert's condition (the last prefix token ⊕ the prefix mean), added to every token's input
        self.condition = (nn.Sequential(nn.LayerNorm(2 * memory_width), nn.Linear(2 * memory_width, width))
                          if pooled else None)
        layer = nn.TransformerDecoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.layers = nn.TransformerDecoder(layer, layers, norm=nn.LayerNorm(width))
        self.out = nn.Linear(width, bins)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """`hidden` N×S×D and `mask` N×S: the prefix; `previous` N×t: the bins of the first t tokens.
        Returns float32 logits N×(t+1)×bins: of token 0 given none, …, of token t given all of `previous`."""
        n, t = previous.shape
        tokens = torch.cat([previous.new_full((n, 1), self.start), previous], 1)
        x = self.embed(tokens) + self._positions(hidden, mask)[..., :t + 1, :]
        causal = nn.Transformer.generate_square_subsequent_mask(t + 1, device=x.device, dtype=x.dtype)
        y = self.layers(x, self.memory(hidden.float()), tgt_mask=causal, tgt_is_causal=True,
                        memory_key_padding_mask=mask == 0)
        return self.out(y).float()

    @torch.no_grad()
    def generate(self, hidden: torch.Tensor, mask: torch.Tensor,
                 pick: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Bins N×T (T action tokens, one per learned position), token t chosen by `pick(logits N×bins)`
        given the tokens before it. The logits equal `forward`'s at every position (up to float rounding):
        the same layers, run incrementally."""
        n = hidden.shape[0]
        memory = self.memory(hidden.float())
        visible = (mask != 0)[:, None, None, :]  # N×1×1×S: which prefix tokens each head may attend to
        cross = [self._heads(F.linear(memory, *self._projection(layer.multihead_attn, 1, 3)), 2)
                 for layer in self.layers.layers]
        cache: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(cross)
        token = hidden.new_full((n,), self.start, dtype=torch.long)
        positions = self._positions(hidden, mask)
        bins = []
        for t in range(len(self.position)):  # one learned position per action token
            x = (self.embed(token) + positions[..., t, :])[:, None]
            for i, layer in enumerate(self.layers.layers):
                q, k, v = self._heads(F.linear(layer.norm1(x), layer.self_attn.in_proj_weight,
                                               layer.self_attn.in_proj_bias), 3)
                if cache[i] is not None:
                    k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
                cache[i] = (k, v)
                x = x + layer.self_attn.out_proj(self._merge(F.scaled_dot_product_attention(q, k, v)))
                q = self._heads(F.linear(layer.norm2(x), *self._projection(layer.multihead_attn, 0, 1)), 1)[0]
                attended = F.scaled_dot_product_attention(q, *cross[i], attn_mask=visible)
                x = x + layer.multihead_attn.out_proj(self._merge(attended))
                x = x + layer.linear2(layer.activation(layer.linear1(layer.norm3(x))))
            token = pick(self.out(self.layers.norm(x))[:, 0].float())
            bins.append(token)
        return torch.stack(bins, 1)

    def _positions(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """What every action token's input adds to its bin's embedding: the learned positions T×W, plus,
        with `pooled`, the projected pooled prefix (N×T×W)."""
        if self.condition is None:
            return self.position
        return self.position + self.condition(VLABackbone.pooled(hidden, mask))[:, None]

    @staticmethod
    def _projection(attention: nn.MultiheadAttention, first: int, last: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of the packed [query; key; value] input projection: parts first..last-1 of 3."""
        width = attention.embed_dim
        return (attention.in_proj_weight[first * width:last * width],
                attention.in_proj_bias[first * width:last * width])

    def _heads(self, packed: torch.Tensor, parts: int) -> list[torch.Tensor]:
        """N×L×(parts·W) -> `parts` tensors N×heads×L×(W/heads)."""
        n, length, _ = packed.shape
        return list(packed.view(n, length, parts, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0))

    @staticmethod
    def _merge(heads: torch.Tensor) -> torch.Tensor:
        n, _, length, _ = heads.shape
        return heads.transpose(1, 2).reshape(n, length, -1)
