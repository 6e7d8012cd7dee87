"""An action-token decoder for the token VLA (`policy.vla.action_head: decoder`). With `lm` the language
model itself predicts the action tokens, so its weights are the actor and a frozen backbone leaves nothing
to train. The decoder is a small causal transformer over the action tokens whose every layer also attends
to the backbone's last hidden states over the [image, prompt, proprio] prefix: the tokens are still
predicted one bin at a time and log π is still the sum over them, but a pretrained backbone can stay
frozen under it, as under the flow VLA's new expert (its hidden states are stored at `act`, so PPO's
epochs skip the backbone)."""
from __future__ import annotations

import torch
from torch import nn


class ActionTokenDecoder(nn.Module):
    """Logits over `bins` for each of `num_tokens` action tokens, position t given the bins before it."""

    def __init__(self, memory_width: int, bins: int, num_tokens: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.start = bins  # the id of the start token, after the bins
        self.memory = nn.Sequential(nn.LayerNorm(memory_width), nn.Linear(memory_width, width))
        self.embed = nn.Embedding(bins + 1, width)
        self.position = nn.Parameter(torch.randn(num_tokens, width) * 0.02)
        layer = nn.TransformerDecoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.layers = nn.TransformerDecoder(layer, layers, norm=nn.LayerNorm(width))
        self.out = nn.Linear(width, bins)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """`hidden` N×S×D and `mask` N×S: the prefix; `previous` N×t: the bins of the first t tokens.
        Returns float32 logits N×(t+1)×bins: of token 0 given none, …, of token t given all of `previous`."""
        n, t = previous.shape
        tokens = torch.cat([previous.new_full((n, 1), self.start), previous], 1)
        x = self.embed(tokens) + self.position[:t + 1]
        causal = nn.Transformer.generate_square_subsequent_mask(t + 1, device=x.device, dtype=x.dtype)
        y = self.layers(x, self.memory(hidden.float()), tgt_mask=causal, tgt_is_causal=True,
                        memory_key_padding_mask=mask == 0)
        return self.out(y).float()
