"""The VLA backbone: a SigLIP vision encoder and a causal language model. The sequence the LM reads is

    [image patch features, projected to the LM width] [prompt tokens, padded] [proprio token] (+ the policy's tokens)

Padding sits inside the sequence; the attention mask hides it and the position ids skip it, so a padded
and an unpadded prompt give the same features. Tiny configs build from the sizes in `VLASpec`; real
checkpoints load from local directories (`from_pretrained(path, local_files_only=True)`); a policy
saved by `policies.vla.io.save_pretrained` rebuilds from the configs and tokenizer saved beside it.
"""
from __future__ import annotations

import contextlib
import inspect
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GemmaConfig,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    SiglipVisionConfig,
    SiglipVisionModel,
)

from roborl.policies.normalizer import RunningNormalizer
from roborl.policies.vla.spec import VLASpec
from roborl.policies.vla.tokenizer import TOKENIZERS, load_tokenizer

LANGUAGE_CONFIGS = {"qwen2": Qwen2Config, "llama": LlamaConfig, "gemma": GemmaConfig}


def require_checkpoint(path: str | Path, key: str, what: str) -> Path:
    """`path` as a local checkpoint directory, or a one-line error naming it and the files expected."""
    p = Path(path).expanduser()
    weights = list(p.glob("*.safetensors")) + list(p.glob("*.bin")) if p.is_dir() else []
    if not (p / "config.json").is_file() or not weights:
        raise FileNotFoundError(f"{key} '{path}' is not a local checkpoint directory: it needs config.json and "
                                f"*.safetensors weights of {what} (save_pretrained output)")
    return p


def tiny_vision_config(spec: VLASpec) -> SiglipVisionConfig:
    return SiglipVisionConfig(hidden_size=spec.vision_hidden, intermediate_size=2 * spec.vision_hidden,
                              num_hidden_layers=spec.vision_layers, num_attention_heads=spec.vision_heads,
                              image_size=spec.image_size, patch_size=spec.patch_size, vision_use_head=False)


def tiny_language_config(spec: VLASpec, tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    return LANGUAGE_CONFIGS[spec.language_model](
        hidden_size=spec.hidden, intermediate_size=2 * spec.hidden, num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads, num_key_value_heads=spec.heads, head_dim=spec.hidden // spec.heads,
        vocab_size=len(tokenizer), max_position_embeddings=1024, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)


def load_parts(spec: VLASpec, saved: Path | None = None
               ) -> tuple[SiglipVisionModel, PreTrainedModel, PreTrainedTokenizerBase]:
    """Vision encoder, language model and tokenizer: from a saved policy's configs (`saved`, weights
    loaded afterwards), from the checkpoint paths of `spec`, or tiny ones built from its sizes."""
    if saved is not None:
        vision = SiglipVisionModel(SiglipVisionConfig.from_pretrained(saved / "vision", local_files_only=True))
        lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(saved / "language", local_files_only=True))
        return vision, lm, load_tokenizer(saved / "tokenizer")
    if spec.vision_path:
        path = require_checkpoint(spec.vision_path, "policy.vla.vision_path", "a SigLIP vision encoder")
        vision = SiglipVisionModel.from_pretrained(str(path), local_files_only=True)
    else:
        vision = SiglipVisionModel(tiny_vision_config(spec))
    if spec.language_path:
        path = require_checkpoint(spec.language_path, "policy.vla.language_path", "a causal language model")
        return vision, AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True), load_tokenizer(path)
    tokenizer = TOKENIZERS[spec.tokenizer](spec.action_tokens)
    return vision, AutoModelForCausalLM.from_config(tiny_language_config(spec, tokenizer)), tokenizer


def untie_state_dict(module: nn.Module, state: dict, prefix: str, local_metadata: dict) -> None:
    """Give tied weights (embeddings shared with the LM head) their own tensor in the state dict:
    safetensors refuses to save two names for one memory, and roborl checkpoints save the state dict.
    Loading copies the same values into the one shared parameter."""
    seen: set[int] = set()
    for key, value in state.items():
        if key.startswith(prefix) and isinstance(value, torch.Tensor):
            if value.data_ptr() in seen:
                state[key] = value.detach().clone()
            seen.add(value.data_ptr())


def cache_argument(decoder: nn.Module) -> str:
    """transformers 5.x renamed the decoders' `past_key_values` argument to `cache` (the old name warns and
    goes in 5.40); whichever this version's forward takes."""
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


class VLABackbone(nn.Module):
    def __init__(self, spec: VLASpec, state_dim: int, vision: SiglipVisionModel, lm: PreTrainedModel,
                 tokenizer: PreTrainedTokenizerBase) -> None:
        super().__init__()
        spec.check()
        self.spec, self.tokenizer = spec, tokenizer
        self.dtype = getattr(torch, spec.dtype)
        width = lm.get_input_embeddings().weight.shape[1]
        self.hidden_size = width
        self.vision = vision
        self.projector = nn.Sequential(nn.Linear(vision.config.hidden_size, width), nn.GELU(), nn.Linear(width, width))
        self.proprio = nn.Linear(state_dim, width)
        self.normalizer = RunningNormalizer(state_dim)
        self.register_buffer("normalizer_fitted", torch.tensor(False))
        for module in (vision, self.projector, self.proprio, lm):
            module.to(self.dtype)
        self.lm = self._finetune(lm)
        self.cache_argument = cache_argument(self.lm.get_decoder())  # read once, not per decoded token
        self.register_state_dict_post_hook(untie_state_dict)

    def _finetune(self, lm: PreTrainedModel) -> nn.Module:
        """frozen: nothing of the backbone trains (it runs without autograd); lora: LoRA adapters on the
        LM's attention projections plus the new projectors; full: everything."""
        mode = self.spec.finetune
        if mode == "frozen":
            self.requires_grad_(False)
            return lm.requires_grad_(False)
        if mode == "full":
            return lm
        from peft import LoraConfig, get_peft_model

        self.vision.requires_grad_(False)
        config = LoraConfig(r=self.spec.lora_rank, lora_alpha=self.spec.lora_alpha,
                            lora_dropout=self.spec.lora_dropout, target_modules=list(self.spec.lora_targets))
        try:
            return get_peft_model(lm, config)
        except ValueError as exc:
            raise ValueError(f"policy.vla.lora_targets {self.spec.lora_targets} do not fit this language model: "
                             f"{str(exc).splitlines()[0]}") from exc

    # ---- parts ---------------------------------------------------------------------------------
    @property
    def trainable(self) -> bool:
        return self.spec.finetune != "frozen"

    def grad_context(self) -> contextlib.AbstractContextManager:
        """A frozen backbone runs without autograd: no activations kept for a backward that never comes."""
        return contextlib.nullcontext() if self.trainable else torch.no_grad()

    @property
    def vocab_size(self) -> int:
        return self.lm.get_output_embeddings().weight.shape[0]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm.get_input_embeddings()(ids)

    def language_config(self) -> PretrainedConfig:
        return self.lm.get_base_model().config if hasattr(self.lm, "get_base_model") else self.lm.config

    # ---- inputs --------------------------------------------------------------------------------
    def encode_text(self, instructions: list[str], device: torch.device) -> torch.Tensor:
        """Prompt token ids N×max_text_tokens, −1 where padded (a fixed width, so rollouts store them)."""
        prompts = [self.spec.prompt.format(instruction=text) for text in instructions]
        batch = self.tokenizer(prompts, padding="max_length", truncation=True, max_length=self.spec.max_text_tokens,
                               return_tensors="pt")
        ids = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -1)
        return ids.to(device)

    def pixels(self, rgb: torch.Tensor) -> torch.Tensor:
        """uint8 N×H×W×3 -> N×3×S×S in [−1, 1] (SigLIP's normalization), resized to the encoder's size."""
        x = rgb.permute(0, 3, 1, 2).float() / 255.0
        size = self.vision.config.image_size
        if x.shape[-2:] != (size, size):
            x = nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        return ((x - 0.5) / 0.5).to(self.dtype)

    def prefix(self, obs: dict, text_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Input embeddings N×S×D of [image, prompt, proprio] and their attention mask N×S."""
        if "rgb" not in obs:
            raise ValueError("a VLA policy needs `rgb` observations (env.obs_mode rgb or rgb+state)")
        image = self.projector(self.vision(pixel_values=self.pixels(obs["rgb"])).last_hidden_state)
        text = self.embed(text_ids.clamp(min=0))
        state = self.proprio(self.normalizer(obs["state"].float()).to(self.dtype))[:, None]
        ones = torch.ones(image.shape[0], image.shape[1], dtype=torch.long, device=image.device)
        mask = torch.cat([ones, (text_ids >= 0).long(), ones[:, :1]], 1)
        return torch.cat([image, text, state], 1), mask

    def run(self, embeds: torch.Tensor, mask: torch.Tensor, cache=None, use_cache: bool = False):
        """The LM decoder on `embeds` (the last embeds.shape[1] positions of `mask`), returning its output
        (last_hidden_state and its KV cache, read by `kv_cache`); position ids count only unmasked tokens."""
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -embeds.shape[1]:]
        decoder = self.lm.get_decoder()
        return decoder(inputs_embeds=embeds, attention_mask=mask, position_ids=positions,
                       use_cache=use_cache or cache is not None, **{self.cache_argument: cache})

    @staticmethod
    def kv_cache(output):
        """The KV cache of a `run` output, under either of transformers' names for it."""
        return output.cache if hasattr(output, "cache") else output.past_key_values

    def hidden_states(self, obs: dict, text_ids: torch.Tensor,
                      stored: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The LM's last hidden states over the prefix N×S×D and its mask N×S. A frozen backbone's, stored
        at `act` under `hidden` and `prefix_mask`, are reused: PPO's epochs then skip the backbone."""
        if stored is not None and "hidden" in stored and not self.trainable:
            return stored["hidden"], stored["prefix_mask"]
        with self.grad_context():
            embeds, mask = self.prefix(obs, text_ids)
            return self.run(embeds, mask).last_hidden_state, mask

    @staticmethod
    def pooled(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[last token's features, mean over the unmasked tokens] in float32: N×2D."""
        m = mask[..., None].to(hidden.dtype)
        mean = (hidden * m).sum(1) / m.sum(1)
        return torch.cat([hidden[:, -1], mean], -1).float()

    # ---- proprio normalization (fixed once fitted on demonstrations, like the generative policies) ----
    @torch.no_grad()
    def fit_normalizer(self, states: torch.Tensor) -> None:
        self.normalizer.fit(states)
        self.normalizer_fitted.fill_(True)

    def update_normalizer(self, obs: dict) -> None:
        if not bool(self.normalizer_fitted):
            self.normalizer.update(obs["state"])


def build_backbone(spec: VLASpec, state_dim: int, saved: Path | None = None) -> VLABackbone:
    spec.check()
    return VLABackbone(spec, state_dim, *load_parts(spec, saved))


def instructions(obs: dict) -> list[str]:
    """The batch's instructions; an empty one for each env of a task without language."""
    texts = obs.get("instruction")
    return list(texts) if texts is not None else [""] * obs["state"].shape[0]
