"""Split a local vision-language checkpoint (PaliGemma, the VLM of pi0; SmolVLM / Idefics3, the VLM of
SmolVLA) into the two directories a VLA backbone loads:

    DST/vision    a SiglipVisionModel checkpoint  -> policy.vla.vision_path
    DST/language  a causal LM with its tokenizer  -> policy.vla.language_path

    python -m roborl.policies.vla.convert SRC DST

The VLM's own connector (multi-modal projector, pixel shuffle) is dropped: the backbone trains a new
projector. Everything is read with local_files_only: download SRC on a machine with hub access first.
"""
from __future__ import annotations

import sys
from pathlib import Path

from transformers import (
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoTokenizer,
    SiglipVisionConfig,
    SiglipVisionModel,
)

from roborl.policies.vla.backbone import require_checkpoint


def siglip_from(tower) -> SiglipVisionModel:
    """The VLM's vision tower as a SiglipVisionModel (Idefics3's tower is SigLIP without the wrapper)."""
    if isinstance(tower, SiglipVisionModel):
        return tower
    c = tower.config
    config = SiglipVisionConfig(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                                num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                                image_size=c.image_size, patch_size=c.patch_size, layer_norm_eps=c.layer_norm_eps,
                                hidden_act=c.hidden_act, vision_use_head=False)
    siglip = SiglipVisionModel(config)
    missing, unexpected = siglip.load_state_dict(tower.state_dict(), strict=False)
    if missing or unexpected:
        raise ValueError(f"the vision tower {type(tower).__name__} does not map onto SigLIP "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    return siglip


def split_vlm(src: str | Path, dst: str | Path) -> tuple[Path, Path]:
    """Write DST/vision and DST/language from the VLM checkpoint in SRC; returns the two paths."""
    src = require_checkpoint(src, "the VLM checkpoint", "a vision-language model (e.g. PaliGemma, SmolVLM)")
    vlm = AutoModelForImageTextToText.from_pretrained(str(src), local_files_only=True)
    inner = vlm.model
    tower = getattr(inner, "vision_tower", None) or getattr(inner, "vision_model", None)
    decoder = getattr(inner, "language_model", None) or getattr(inner, "text_model", None)
    if tower is None or decoder is None:
        raise ValueError(f"'{src}' ({type(vlm).__name__}) has no vision_tower / language_model to split")
    lm = AutoModelForCausalLM.from_config(vlm.config.get_text_config())
    lm.get_decoder().load_state_dict(decoder.state_dict())
    lm.get_output_embeddings().load_state_dict(vlm.get_output_embeddings().state_dict())
    vision_dir, language_dir = Path(dst) / "vision", Path(dst) / "language"
    siglip_from(tower).save_pretrained(vision_dir)
    lm.save_pretrained(language_dir)
    AutoTokenizer.from_pretrained(str(src), local_files_only=True).save_pretrained(language_dir)
    return vision_dir, language_dir


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m roborl.policies.vla.convert SRC DST  (SRC: a local VLM checkpoint directory)")
    for path in split_vlm(sys.argv[1], sys.argv[2]):
        print(path)
