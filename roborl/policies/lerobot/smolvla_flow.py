"""SmolVLA's flow in roborl's convention, for `policies/flow_rl.py`: LeRobot's `VLAFlowMatching` runs its
prefix (images, instruction, state) once into a key/value cache and then `denoise_step` per Euler step,
from t = 1 (noise) to 0, predicting noise − actions; roborl's chains run τ = 1 − t with velocity
actions − noise. So the deterministic chain from zero noise is exactly SmolVLA's `sample_actions`."""
from __future__ import annotations

import dataclasses

import torch

from roborl.policies.flow_rl import PooledCondition


@dataclasses.dataclass
class SmolVLAPrefix(PooledCondition):
    """The prefix's key/value cache and padding mask (what every denoising step reads) beside its pooled
    hidden states (the value and noise heads' input)."""
    cache: dict | None = None
    pad_masks: torch.Tensor | None = None


def prefix(policy, batch: dict) -> SmolVLAPrefix:
    """`policy` is LeRobot's SmolVLAPolicy and `batch` its preprocessed input, as its `sample_actions` reads them."""
    from lerobot.policies.smolvla.modeling_smolvla import make_att_2d_masks
    from lerobot.utils.constants import OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS

    model = policy.model
    images, image_masks = policy.prepare_images(batch)
    embeds, pad_masks, att_masks = model.embed_prefix(images, image_masks, batch[OBS_LANGUAGE_TOKENS],
                                                      batch[OBS_LANGUAGE_ATTENTION_MASK],
                                                      state=policy.prepare_state(batch))
    hidden, cache = model.vlm_with_expert.forward(
        attention_mask=make_att_2d_masks(pad_masks, att_masks), position_ids=pad_masks.cumsum(1) - 1,
        past_key_values=None, inputs_embeds=[embeds, None], use_cache=True, fill_kv_cache=True)
    weights = pad_masks[..., None].float()
    pooled = (hidden[0].float() * weights).sum(1) / weights.sum(1)
    return SmolVLAPrefix(pooled, cache, pad_masks)


def velocity(policy, x: torch.Tensor, tau: torch.Tensor, cond: SmolVLAPrefix) -> torch.Tensor:
    """actions − noise at τ: minus SmolVLA's prediction of noise − actions at its time t = 1 − τ."""
    tau = tau.expand(x.shape[0]) if tau.dim() == 0 else tau
    return -policy.model.denoise_step(cond.pad_masks, cond.cache, x, (1 - tau).float())
