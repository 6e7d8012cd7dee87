"""The settings of a pi0 policy (config section `policy.pi0`; the model: pi0.py): a local checkpoint of
transformers' `PI0ForConditionalGeneration` or the sizes of a tiny one built from scratch, how much of it
RL moves, and the heads roborl adds."""
from __future__ import annotations

from dataclasses import dataclass, field

PI0_FINETUNE = ("frozen", "lora", "full")


@dataclass
class Pi0Spec:
    # a local directory written by PI0ForConditionalGeneration.save_pretrained (never a hub id); None builds a
    # tiny pi0 from the sizes below
    path: str | None = None
    # a local tokenizer directory (pi0's is PaliGemma's); None: the checkpoint's own, or a word tokenizer for a tiny pi0
    tokenizer_path: str | None = None
    # the PaliGemma prefix: frozen | lora (adapters on its language model's attention) | full; the action expert,
    # its projections and roborl's heads always train
    finetune: str = field(default="frozen", metadata={"choices": PI0_FINETUNE})
    lora_rank: int = field(default=8, metadata={"ge": 1})  # r of the LoRA adapters (finetune: lora)
    lora_alpha: int = field(default=16, metadata={"ge": 1})  # their scale α (the update is scaled by α / r)
    # the frozen prefix's storage and every forward pass's autocast dtype; what trains stays float32
    dtype: str = field(default="float32", metadata={"choices": ("float32", "bfloat16")})
    max_text_tokens: int = field(default=16, metadata={"ge": 1})  # instruction tokens after the image tokens
    value_hidden: list[int] = field(default_factory=lambda: [64], metadata={"ge": 1})  # value head on the prefix
    noise_hidden: list[int] = field(default_factory=lambda: [64], metadata={"ge": 1})  # flow-noise std head
    # a tiny pi0 built from scratch (path None): image side, patch, widths, layers and heads of each part
    image_size: int = field(default=64, metadata={"ge": 8})
    patch_size: int = field(default=16, metadata={"ge": 1})  # pixels per side of a SigLIP patch
    vision_hidden: int = field(default=64, metadata={"ge": 8})  # SigLIP width
    vlm_hidden: int = field(default=64, metadata={"ge": 8})  # Gemma (prefix) width
    expert_hidden: int = field(default=64, metadata={"ge": 8})  # Gemma action expert width
    layers: int = field(default=2, metadata={"ge": 1})  # transformer layers of each of the three parts
    heads: int = field(default=2, metadata={"ge": 1})  # attention heads of each part
