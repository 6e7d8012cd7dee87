"""Small LeRobot policies built from LeRobot's own config classes, for CPU runs and tests: SmolVLA on a
small vision-language model that roborl writes to disk (SmolVLA reads its VLM by path), ACT and Diffusion
Policy without pretrained ResNet weights. Their processors come from LeRobot's `make_pre_post_processors`."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from roborl.files import atomic_write
from roborl.policies.lerobot.configuration import LeRobotSpec

VLM_SPECIALS = {"image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
                "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>"}


def cache_dir() -> Path:
    return Path(os.environ.get("ROBORL_CACHE", Path.home() / ".cache" / "roborl"))


def small_vlm_dir(spec: LeRobotSpec) -> Path:
    """A SmolVLM of `spec`'s sizes as SmolVLA loads one (config, processor, a word tokenizer with SmolVLM's
    special tokens), written once per size under the roborl cache; only its config is read: SmolVLA builds
    the VLM from it and its weights live in the policy's own checkpoint."""
    sizes = {"hidden": spec.hidden, "layers": spec.layers, "heads": spec.heads, "image_size": spec.image_size}
    out = cache_dir() / f"smolvlm-{hashlib.sha1(json.dumps(sizes, sort_keys=True).encode()).hexdigest()[:10]}"
    if (out / "config.json").is_file():
        return out
    from transformers import AutoTokenizer, SmolVLMConfig, SmolVLMImageProcessor, SmolVLMProcessor, SmolVLMVideoProcessor

    from roborl.policies.vla.tokenizer import word_tokenizer

    try:
        with atomic_write(out) as tmp:
            tmp.mkdir()
            tokenizer = word_tokenizer(0)
            tokenizer.add_special_tokens({"additional_special_tokens": list(VLM_SPECIALS.values())})
            tokenizer.save_pretrained(tmp)
            config_file = tmp / "tokenizer_config.json"
            config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "extra_special_tokens": VLM_SPECIALS}))
            tokenizer = AutoTokenizer.from_pretrained(str(tmp), local_files_only=True)
            width, side = spec.hidden, spec.image_size
            config = SmolVLMConfig(
                text_config={"model_type": "llama", "hidden_size": width, "intermediate_size": 2 * width,
                             "num_hidden_layers": spec.layers, "num_attention_heads": spec.heads,
                             "num_key_value_heads": 1, "head_dim": width // spec.heads, "vocab_size": len(tokenizer)},
                vision_config={"hidden_size": width, "intermediate_size": 2 * width, "num_hidden_layers": spec.layers,
                               "num_attention_heads": spec.heads, "image_size": side, "patch_size": side // 4},
                scale_factor=2, image_token_id=tokenizer.convert_tokens_to_ids(VLM_SPECIALS["image_token"]))
            config.save_pretrained(tmp)
            images = SmolVLMImageProcessor(do_resize=False, do_image_splitting=False, size={"longest_edge": side},
                                           max_image_size={"longest_edge": side})
            SmolVLMProcessor(image_processor=images, tokenizer=tokenizer, video_processor=SmolVLMVideoProcessor(),
                             image_seq_len=4).save_pretrained(tmp)
    except OSError:  # another process wrote it first
        if not (out / "config.json").is_file():
            raise
    return out


def features(kind: str, state_dim: int, action_dim: int, image_shape: tuple[int, int] | None) -> tuple[dict, dict]:
    """LeRobot's input and output features for an env's `state` (and `rgb`). ACT needs images or an
    environment state beside the robot's, and so does Diffusion Policy: on a state-only task the state is both."""
    from lerobot.configs.types import FeatureType, PolicyFeature

    inputs = {"observation.state": PolicyFeature(FeatureType.STATE, (state_dim,))}
    if image_shape is not None:
        inputs["observation.images.camera"] = PolicyFeature(FeatureType.VISUAL, (3, *image_shape))
    elif kind in ("act", "diffusion"):
        inputs["observation.environment_state"] = PolicyFeature(FeatureType.ENV, (state_dim,))
    return inputs, {"action": PolicyFeature(FeatureType.ACTION, (action_dim,))}


def small_config(spec: LeRobotSpec, state_dim: int, action_dim: int, image_shape: tuple[int, int] | None,
                 horizon: int, execute: int, steps: int):
    """The config of a small LeRobot policy of `spec.type` for this env."""
    inputs, outputs = features(spec.type, state_dim, action_dim, image_shape)
    common = {"input_features": inputs, "output_features": outputs, "device": "cpu"}
    if spec.type == "smolvla":
        from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig

        if image_shape is None:
            raise ValueError("a SmolVLA reads images: set env.obs_mode to rgb")
        vlm = Path(spec.vlm_path).expanduser() if spec.vlm_path else small_vlm_dir(spec)
        return SmolVLAConfig(vlm_model_name=str(vlm), load_vlm_weights=False, chunk_size=horizon,
                             n_action_steps=execute, num_steps=steps, max_state_dim=max(32, state_dim),
                             max_action_dim=max(8, action_dim), resize_imgs_with_padding=(spec.image_size,) * 2,
                             num_vlm_layers=spec.layers, tokenizer_max_length=16, pad_language_to="max_length",
                             **common)
    if spec.type == "act":
        from lerobot.policies.act.configuration_act import ACTConfig

        return ACTConfig(chunk_size=horizon, n_action_steps=execute, dim_model=spec.hidden, n_heads=spec.heads,
                         dim_feedforward=2 * spec.hidden, n_encoder_layers=spec.layers, n_decoder_layers=1,
                         use_vae=False, pretrained_backbone_weights=None, **common)
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig

    return DiffusionConfig(horizon=horizon, n_action_steps=execute, n_obs_steps=1, num_inference_steps=steps,
                           down_dims=(spec.hidden, 2 * spec.hidden), pretrained_backbone_weights=None,
                           crop_shape=None, **common)
