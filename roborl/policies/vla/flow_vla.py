"""Flow VLA (pi0-style): the backbone's [image, prompt, proprio] features condition a flow-matching
action expert that produces chunks of `horizon` actions. It is a `FlowPolicy` whose condition is the
pooled backbone output (last token ⊕ mean over the prefix) instead of the state, so behaviour cloning
(conditional flow matching), deterministic ODE sampling and the RL log-probs (flow_noise, flow_sde,
fpo in `policies/flow_rl.py`) are the flow policy's own code, unchanged.

The expert is one of `policies/denoisers` (MLP or 1-D U-Net) on the pooled features; with
`vla.readout: attention` it also reads every prefix token through learned queries (`policies/vla/readout.py`),
which is how pi0's expert, a transformer attending to the prefix, sees the image; that transformer itself is
not built here.
"""
from __future__ import annotations

import torch

from roborl.policies.act import Act
from roborl.policies.flow import FlowPolicy
from roborl.policies.value_head import ValueHead
from roborl.policies.vla.backbone import VLABackbone, build_backbone, instructions
from roborl.policies.vla.io import BackbonePolicy
from roborl.policies.vla.readout import AttentionReadout
from roborl.policies.vla.spec import VLASpec


class FlowVLAPolicy(BackbonePolicy, FlowPolicy):
    kind = "flow_vla"
    # what `act` keeps in extras for `evaluate`; a frozen backbone's output too: its pooled `features`, or, for
    # a readout that trains, its last `hidden` states and their `prefix_mask`
    stored = ("text_ids", "features", "hidden", "prefix_mask")

    def __init__(self, spec: VLASpec, state_dim: int, action_dim: int, horizon: int = 4, execute: int = 1, *,
                 steps: int = 4, rl_mode: str | None = None, noise_min: float = 0.08, noise_max: float = 0.16,
                 noise_level: float = 0.5, fpo_samples: int = 8, critic_state_dim: int = 0,
                 backbone: VLABackbone | None = None) -> None:
        backbone = backbone or build_backbone(spec, state_dim)
        readout = None
        if spec.readout == "attention":
            heads = backbone.language_config().num_attention_heads
            readout = AttentionReadout(backbone.hidden_size, spec.readout_queries, heads)
        cond_dim = 2 * backbone.hidden_size + (readout.out_dim if readout else 0)
        super().__init__(cond_dim, action_dim, horizon, execute, denoiser=spec.expert, hidden=list(spec.expert_hidden),
                         critic_hidden=list(spec.value_hidden), normalize_obs=False, steps=steps, rl_mode=rl_mode,
                         noise_min=noise_min, noise_max=noise_max, noise_level=noise_level, fpo_samples=fpo_samples)
        self.spec = spec
        self.init_args = {"state_dim": state_dim, "action_dim": action_dim, "horizon": horizon, "execute": execute,
                          "steps": steps, "rl_mode": rl_mode, "noise_min": noise_min, "noise_max": noise_max,
                          "noise_level": noise_level, "fpo_samples": fpo_samples, "critic_state_dim": critic_state_dim}
        self.backbone = backbone
        self.readout = readout
        self.critic = ValueHead(cond_dim, list(spec.value_hidden), spec.detach_value, critic_state_dim)

    def critic_value(self, cond: torch.Tensor, obs: dict) -> torch.Tensor:
        return self.critic(cond, obs)

    # ---- the condition: pooled backbone features (⊕ the attention readout) ---------------------------
    def text_ids(self, obs: dict) -> torch.Tensor:
        if "text_ids" in obs:
            return obs["text_ids"]
        return self.backbone.encode_text(instructions(obs), obs["state"].device)

    def cond(self, obs: dict) -> torch.Tensor:
        """Pooled backbone features (⊕ the attention readout); a frozen backbone's pooled features, stored
        at `act` (`features`), are reused."""
        if "features" in obs and not self.backbone.trainable:
            return obs["features"]
        hidden, mask = self.backbone.hidden_states(obs, self.text_ids(obs), stored=obs)
        pooled = self.backbone.pooled(hidden, mask)
        return pooled if self.readout is None else torch.cat([pooled, self.readout(hidden, mask)], -1)

    @staticmethod
    def with_stored(obs: dict, extras: dict) -> dict:
        """Rollout buffers keep tensors only: the prompt tokens stored at `act` stand in for the text, and
        a frozen backbone's features stored there spare PPO's epochs a backbone pass per minibatch."""
        return {**obs, **{k: extras[k] for k in FlowVLAPolicy.stored if k in extras}}

    # ---- the Policy interface (FlowPolicy's, with prompt tokens and frozen features in extras) -------
    def act(self, obs: dict, deterministic: bool = False) -> Act:
        obs = {**obs, "text_ids": self.text_ids(obs)}
        if not self.backbone.trainable and self.readout is None:
            obs["features"] = self.cond(obs)
        elif not self.backbone.trainable:
            obs["hidden"], obs["prefix_mask"] = self.backbone.hidden_states(obs, obs["text_ids"])
        out = super().act(obs, deterministic)
        out.extras.update({k: obs[k] for k in self.stored if k in obs})
        if self.horizon == 1:
            out.action = out.action[:, 0]
        return out

    def evaluate(self, obs: dict, act: Act) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return super().evaluate(self.with_stored(obs, act.extras), act)

    def bc_regularizer(self, obs: dict, act: Act) -> torch.Tensor:
        if act.action.dim() == 2:
            act = Act(act.action[:, None], act.log_prob, act.value, act.extras)
        return super().bc_regularizer(self.with_stored(obs, act.extras), act)

    def bc_loss(self, obs: dict, actions: torch.Tensor) -> torch.Tensor:
        """Conditional flow matching with `bc_samples` (τ, ε) pairs per demonstration on one backbone pass."""
        actions = actions[:, None] if actions.dim() == 2 else actions
        m = self.spec.bc_samples
        tau = torch.rand(actions.shape[0], m, device=actions.device)
        eps = torch.randn(actions.shape[0], m, *actions.shape[1:], device=actions.device)
        return self.cfm_loss(self.cond(obs), actions, tau, eps).mean()
