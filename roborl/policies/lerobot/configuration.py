"""The settings of a LeRobot policy run by roborl (config section `policy.lerobot`; the policy: policy.py):
a local LeRobot policy directory, or the type and sizes of a small one built here, where its Hub downloads
go instead, and the heads roborl adds for RL."""
from __future__ import annotations

from dataclasses import dataclass, field

LEROBOT_TYPES = ("smolvla", "act", "diffusion")


@dataclass
class LeRobotSpec:
    # a local LeRobot policy directory (config.json + model.safetensors, and its policy_preprocessor.json /
    # policy_postprocessor.json), e.g. a copy of lerobot/smolvla_base or one written by `roborl export --format
    # pretrained`; never a hub id. None builds a small policy of `type` from the sizes below
    path: str | None = None
    # the policy built when path is None: smolvla | act | diffusion
    type: str = field(default="smolvla", metadata={"choices": LEROBOT_TYPES})
    # SmolVLA's vision-language model as a local directory (config, processor, tokenizer), replacing the
    # checkpoint's hub id (HuggingFaceTB/SmolVLM2-500M-Video-Instruct); None: the checkpoint's own, or for a
    # small SmolVLA one written by roborl
    vlm_path: str | None = None
    # SmolVLA: train its VLM too (SmolVLA's train_expert_only and freeze_vision_encoder off), as an SFT of a small
    # SmolVLA from scratch needs; off: the VLM stays frozen and the action expert, projections and heads train
    train_vlm: bool = False
    value_hidden: list[int] = field(default_factory=lambda: [64], metadata={"ge": 1})  # value head
    noise_hidden: list[int] = field(default_factory=lambda: [64], metadata={"ge": 1})  # flow-noise std head
    # a small policy built here (path None): the width of its transformers (SmolVLA: the VLM, the expert is half
    # as wide; ACT: encoder and decoder; Diffusion Policy: the U-Net's first level)
    hidden: int = field(default=64, metadata={"ge": 8})
    layers: int = field(default=2, metadata={"ge": 1})  # transformer layers (SmolVLA: VLM and expert; ACT: encoder)
    heads: int = field(default=2, metadata={"ge": 1})  # attention heads of each transformer layer
    image_size: int = field(default=64, metadata={"ge": 16})  # SmolVLA: the image side its vision tower reads
