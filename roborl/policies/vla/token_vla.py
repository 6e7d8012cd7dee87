"""Token VLA (OpenVLA-style): each action dimension is discretized into `bins` uniform bins over [−1, 1],
bin b being the vocabulary id V − bins + b (the last ids: dedicated action tokens in the tiny tokenizer,
the least used text tokens of a real one, as OpenVLA does). After the [image, prompt, proprio] prefix the
LM predicts the H·A action tokens autoregressively, one token per step with a KV cache.

The policy is the categorical distribution over the `bins` action ids only (logits of other ids are
masked out), at `temperature`; log π(a) is the sum of the executed tokens' log-softmax and the entropy
the sum of their categorical entropies. Rollout log-probs come from one teacher-forced pass over the
sampled tokens, the very computation `evaluate` repeats, so PPO's ratio starts at exactly 1.

With `vla.action_head: decoder` a small decoder attending to the prefix predicts the tokens instead of
the LM (`policies/vla/action_decoder.py`), so the backbone can stay frozen; `act` then stores its hidden
states and PPO's epochs run the decoder alone.

With `vla.ratio: token` log π is returned per executed token (N×T) instead of summed, so PPO and GRPO
take and clip one ratio per token (RLinf's token-level mode) rather than one over their product.
"""
from __future__ import annotations

import torch
from torch import nn

from roborl.policies.act import Act
from roborl.policies.base import Policy
from roborl.policies.value_head import ValueHead
from roborl.policies.vla.action_decoder import ActionTokenDecoder
from roborl.policies.vla.backbone import VLABackbone, build_backbone, instructions
from roborl.policies.vla.io import BackbonePolicy
from roborl.policies.vla.spec import VLASpec


class TokenVLAPolicy(BackbonePolicy, Policy):
    kind = "token_vla"

    def __init__(self, spec: VLASpec, state_dim: int, action_dim: int, horizon: int = 1, execute: int = 1,
                 critic_state_dim: int = 0, backbone: VLABackbone | None = None) -> None:
        super().__init__()
        if not 1 <= execute <= horizon:
            raise ValueError(f"policy.horizon ({horizon}) must be >= env.action_chunk ({execute}) >= 1")
        self.spec = spec
        self.init_args = {"state_dim": state_dim, "action_dim": action_dim, "horizon": horizon, "execute": execute,
                          "critic_state_dim": critic_state_dim}
        self.action_dim, self.horizon, self.execute = action_dim, horizon, execute
        self.backbone = backbone or build_backbone(spec, state_dim)
        self.decoder = None
        if spec.action_head == "decoder":
            self.decoder = ActionTokenDecoder(self.backbone.hidden_size, spec.bins, self.num_tokens,
                                              spec.decoder_width, spec.decoder_layers, spec.decoder_heads,
                                              spec.decoder_pooled)
        elif spec.bins >= self.backbone.vocab_size:
            raise ValueError(f"policy.vla.bins ({spec.bins}) must be smaller than the vocabulary "
                             f"({self.backbone.vocab_size})")
        self.first_action_id = self.backbone.vocab_size - spec.bins
        self.critic = ValueHead(self.backbone.hidden_size, list(spec.value_hidden), spec.detach_value, critic_state_dim)
        self.register_buffer("centers", torch.linspace(-1, 1, 2 * spec.bins + 1)[1::2].clone())

    # ---- actions <-> tokens ---------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return self.horizon * self.action_dim

    def discretize(self, actions: torch.Tensor) -> torch.Tensor:
        """Actions (N×A or N×H×A) in [−1, 1] -> bin indices N×(H·A)."""
        bins = ((actions.clamp(-1, 1) + 1) / 2 * self.spec.bins).long().clamp(max=self.spec.bins - 1)
        return bins.reshape(bins.shape[0], -1)

    def to_actions(self, bins: torch.Tensor) -> torch.Tensor:
        a = self.centers[bins].view(bins.shape[0], self.horizon, self.action_dim)
        return a[:, 0] if self.horizon == 1 else a

    def action_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the action bins (the last `bins` rows of the LM head), float32, temperature 1."""
        weight = self.backbone.lm.get_output_embeddings().weight[self.first_action_id:]
        return nn.functional.linear(hidden.to(weight.dtype), weight).float()

    def embed_bins(self, bins: torch.Tensor) -> torch.Tensor:
        return self.backbone.embed(bins + self.first_action_id)

    # ---- forward passes -------------------------------------------------------------------------
    def text_ids(self, obs: dict, extras: dict | None = None) -> torch.Tensor:
        """The prompt tokens: stored at `act` (extras), given with the observations, or tokenized here."""
        for source in (extras or {}, obs):
            if "text_ids" in source:
                return source["text_ids"]
        return self.backbone.encode_text(instructions(obs), obs["state"].device)

    def teacher_forced(self, obs: dict, text_ids: torch.Tensor, bins: torch.Tensor,
                       extras: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits N×T×bins of every action token given the tokens before it, and features N×D at the
        proprio token (the value head's input), in one LM pass (or one of the decoder's)."""
        bb = self.backbone
        if self.decoder is not None:
            hidden, mask = bb.hidden_states(obs, text_ids, extras)
            return self.decoder(hidden, mask, bins[:, :-1]), hidden[:, -1].float()
        with bb.grad_context():
            embeds, mask = bb.prefix(obs, text_ids)
            n, s = mask.shape
            seq = torch.cat([embeds, self.embed_bins(bins[:, :-1])], 1)
            mask = torch.cat([mask, mask.new_ones(n, bins.shape[1] - 1)], 1)
            hidden = bb.run(seq, mask).last_hidden_state
            logits = self.action_logits(hidden[:, s - 1:])
        return logits, hidden[:, s - 1].float()

    @torch.no_grad()
    def generate(self, obs: dict, text_ids: torch.Tensor, deterministic: bool,
                 extras: dict | None = None) -> torch.Tensor:
        """Bin indices N×T, one token per LM step on the KV cache: argmax, or sampled at `temperature`."""
        if self.decoder is not None:
            return self.decode(obs, text_ids, deterministic, extras)
        bb = self.backbone
        embeds, mask = bb.prefix(obs, text_ids)
        out = bb.run(embeds, mask, use_cache=True)
        bins = []
        for t in range(self.num_tokens):
            logits = self.action_logits(out.last_hidden_state[:, -1])
            token = self.pick(logits, deterministic)
            bins.append(token)
            if t < self.num_tokens - 1:
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
                out = bb.run(self.embed_bins(token)[:, None], mask, cache=bb.kv_cache(out))
        return torch.stack(bins, 1)

    @torch.no_grad()
    def decode(self, obs: dict, text_ids: torch.Tensor, deterministic: bool, extras: dict | None) -> torch.Tensor:
        """The decoder's bin indices N×T, one token at a time on its cache, on one backbone pass."""
        hidden, mask = self.backbone.hidden_states(obs, text_ids, extras)
        return self.decoder.generate(hidden, mask, lambda logits: self.pick(logits, deterministic))

    def pick(self, logits: torch.Tensor, deterministic: bool) -> torch.Tensor:
        if deterministic:
            return logits.argmax(-1)
        return torch.distributions.Categorical(logits=logits / self.spec.temperature).sample()

    def score(self, obs: dict, text_ids: torch.Tensor, bins: torch.Tensor,
              extras: dict | None = None) -> tuple[torch.Tensor, ...]:
        """log π (summed over the executed actions' tokens, or N×T per token with `ratio: token`), the
        entropy summed over them, and V."""
        logits, features = self.teacher_forced(obs, text_ids, bins, extras)
        log_probs = torch.log_softmax(logits / self.spec.temperature, -1)
        executed = self.execute * self.action_dim
        token_lp = log_probs.gather(-1, bins[..., None]).squeeze(-1)[:, :executed]
        entropy = -(log_probs.exp() * log_probs).sum(-1)[:, :executed]
        log_prob = token_lp if self.spec.ratio == "token" else token_lp.sum(-1)
        return log_prob, entropy.sum(-1), self.critic(features, obs)

    # ---- the Policy interface -------------------------------------------------------------------
    def act(self, obs: dict, deterministic: bool = False) -> Act:
        text_ids = self.text_ids(obs)
        extras = {"text_ids": text_ids}
        if self.decoder is not None and not self.backbone.trainable:
            extras["hidden"], extras["prefix_mask"] = self.backbone.hidden_states(obs, text_ids)
        bins = self.generate(obs, text_ids, deterministic, extras)
        log_prob, _, value = self.score(obs, text_ids, bins, extras)
        return Act(self.to_actions(bins), log_prob, value, {"tokens": bins, **extras})

    def evaluate(self, obs: dict, act: Act) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        bins = act.extras["tokens"] if "tokens" in act.extras else self.discretize(act.action)
        return self.score(obs, self.text_ids(obs, act.extras), bins, act.extras)

    def value(self, obs: dict) -> torch.Tensor:
        hidden, _ = self.backbone.hidden_states(obs, self.text_ids(obs))
        return self.critic(hidden[:, -1].float(), obs)

    def bc_loss(self, obs: dict, actions: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the demonstrated actions' bins under teacher forcing (temperature 1)."""
        if not self.backbone.trainable and self.decoder is None:
            raise ValueError("a token VLA with policy.vla.finetune frozen has no actor weights to clone into; "
                             "use lora or full, or policy.vla.action_head decoder")
        bins = self.discretize(actions)
        logits, _ = self.teacher_forced(obs, self.text_ids(obs), bins)
        return nn.functional.cross_entropy(logits.flatten(0, 1), bins.flatten())
