"""pi0 as a roborl policy: transformers' own `PI0ForConditionalGeneration` (a PaliGemma prefix over the image
and the instruction, a Gemma action expert that attends to the prefix's key/value cache, flow matching over
chunks of actions), loaded from a local checkpoint or built tiny, and fine-tuned by PPO or GRPO through the
flow chains of `policies/flow_rl.py` (flow-noise, flow-SDE), as πRL does.

Conventions: pi0's flow time t runs from 1 (noise) to 0 (actions) and its network predicts noise − actions;
roborl's flow chains run τ = 1 − t from 0 to 1 with velocity actions − noise. `velocity` converts, so the
deterministic chain from zero noise is exactly pi0's `sample_actions` with zero noise. The chain lives in
pi0's padded action space (chunk_size × max_action_dim); the env executes the first `execute` actions of its
first `action_dim` dimensions, and only those enter the log-probabilities.

roborl adds a value head and (flow-noise) a noise-std head on the prefix's pooled features; the state is
standardized by a normalizer fitted on demonstrations. `save_pretrained(dir)` writes the model as
transformers writes it (LoRA merged), so `PI0ForConditionalGeneration.from_pretrained(dir)` loads it alone, and
roborl's heads beside it.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_model
from torch import nn

from roborl.policies import flow_rl
from roborl.policies.act import Act
from roborl.policies.base import Policy
from roborl.policies.configuration_pi0 import Pi0Spec
from roborl.policies.executed import ExecutedChunk
from roborl.policies.gaussian import mlp
from roborl.policies.normalizer import RunningNormalizer
from roborl.policies.pretrained_heads import HEADS_FILE, read_meta, write_heads
from roborl.policies.value_head import ValueHead

RL_MODES = ("flow_noise", "flow_sde")  # policy.rl_mode of pi0
META_FILE = "roborl_pi0.json"


@dataclasses.dataclass
class Pi0Prefix(flow_rl.PooledCondition):
    """The condition of the flow: the prefix's key/value cache, the padded state and the masks the action
    expert reads beside it, and the prefix's pooled features (the value and noise heads' input)."""
    cache: object = None
    length: int = 0
    state: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    pixel_attention_mask: torch.Tensor | None = None


def tiny_pi0(spec: Pi0Spec, vocab_size: int, state_dim: int, action_dim: int, horizon: int, steps: int):
    """A pi0 of `spec`'s tiny sizes, its image token the last id of the vocabulary."""
    from transformers import PI0Config, PI0ForConditionalGeneration

    def gemma(width: int) -> dict:
        return {"hidden_size": width, "num_hidden_layers": spec.layers, "intermediate_size": 2 * width,
                "num_attention_heads": spec.heads, "num_key_value_heads": 1, "head_dim": width // spec.heads}

    config = PI0Config(
        vlm_config={"text_config": {"model_type": "gemma", **gemma(spec.vlm_hidden), "vocab_size": vocab_size + 1},
                    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": spec.vision_hidden,
                                      "intermediate_size": 2 * spec.vision_hidden, "patch_size": spec.patch_size,
                                      "image_size": spec.image_size, "num_hidden_layers": spec.layers,
                                      "num_attention_heads": spec.heads, "vision_use_head": False},
                    "projection_dim": spec.vlm_hidden, "image_token_id": vocab_size},
        dit_config=gemma(spec.expert_hidden), chunk_size=horizon, max_state_dim=state_dim, max_action_dim=action_dim,
        num_inference_steps=steps)
    return PI0ForConditionalGeneration(config)


def load_pi0(spec: Pi0Spec, state_dim: int, action_dim: int, horizon: int, steps: int):
    """The model and its tokenizer: from `spec.path` (and `spec.tokenizer_path`), or tiny ones built here."""
    from transformers import PI0ForConditionalGeneration

    from roborl.policies.vla.tokenizer import load_tokenizer, word_tokenizer

    if spec.path is None:
        tokenizer = load_tokenizer(spec.tokenizer_path) if spec.tokenizer_path else word_tokenizer(0)
        return tiny_pi0(spec, len(tokenizer), state_dim, action_dim, horizon, steps), tokenizer
    path = Path(spec.path).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(f"policy.pi0.path '{spec.path}' is not a local pi0 checkpoint (no config.json): point it at "
                         "a directory written by PI0ForConditionalGeneration.save_pretrained (hub ids are not fetched)")
    model = PI0ForConditionalGeneration.from_pretrained(str(path), local_files_only=True)
    tokenizer_dir = Path(spec.tokenizer_path).expanduser() if spec.tokenizer_path else path
    try:
        tokenizer = load_tokenizer(tokenizer_dir)
    except (OSError, ValueError) as exc:
        raise ValueError(f"no tokenizer in '{tokenizer_dir}': set policy.pi0.tokenizer_path to a local copy of pi0's "
                         "tokenizer (PaliGemma's, google/paligemma-3b-pt-224)") from exc
    return model, tokenizer


class Pi0Policy(ExecutedChunk, Policy):
    kind = "pi0"

    def __init__(self, spec: Pi0Spec, state_dim: int, action_dim: int, horizon: int, execute: int = 1, *,
                 steps: int = 10, rl_mode: str | None = None, noise_min: float = 0.08, noise_max: float = 0.16,
                 noise_level: float = 0.5, critic_state_dim: int = 0) -> None:
        super().__init__()
        if rl_mode not in (None, *RL_MODES):
            raise ValueError(f"policy.rl_mode '{rl_mode}' does not apply to pi0; available: {', '.join(RL_MODES)}")
        if not 1 <= execute <= horizon:
            raise ValueError(f"policy.horizon ({horizon}) must be >= env.action_chunk ({execute}) >= 1")
        model, self.tokenizer = load_pi0(spec, state_dim, action_dim, horizon, steps)
        c = model.config
        if c.chunk_size != horizon or c.max_state_dim < state_dim or c.max_action_dim < action_dim:
            raise ValueError(f"the pi0 checkpoint predicts chunks of {c.chunk_size} actions of up to {c.max_action_dim} "
                             f"dims from states of up to {c.max_state_dim}: set policy.horizon to {c.chunk_size} (this "
                             f"env has {action_dim}-dim actions and {state_dim}-dim states)")
        self.spec = spec
        self.init_args = {"state_dim": state_dim, "action_dim": action_dim, "horizon": horizon, "execute": execute,
                          "steps": steps, "rl_mode": rl_mode, "noise_min": noise_min, "noise_max": noise_max,
                          "noise_level": noise_level, "critic_state_dim": critic_state_dim}
        self.env_action_dim, self.action_dim = action_dim, c.max_action_dim  # the chain's dims: pi0's padded ones
        self.state_dim, self.horizon, self.execute = state_dim, horizon, execute
        self.steps, self.rl_mode = steps, rl_mode
        self.noise_min, self.noise_max, self.noise_level = noise_min, noise_max, noise_level
        self.dtype = getattr(torch, spec.dtype)
        self.image_token_id = c.vlm_config.image_token_id
        vision = c.vlm_config.vision_config
        self.image_size, self.image_tokens = vision.image_size, (vision.image_size // vision.patch_size) ** 2
        self.model = self._finetune(self._cast(model))
        width = c.vlm_config.text_config.hidden_size
        self.normalizer = RunningNormalizer(state_dim)
        self.register_buffer("normalizer_fitted", torch.tensor(False))
        self.critic = ValueHead(width, list(spec.value_hidden), False, critic_state_dim)
        if rl_mode == "flow_noise":
            self.noise_head = mlp([horizon * self.action_dim + 1 + width, *spec.noise_hidden, horizon * self.action_dim],
                                  "tanh", 0.01)
            nn.init.zeros_(self.noise_head[-1].weight)
            nn.init.zeros_(self.noise_head[-1].bias)

    def _cast(self, model: nn.Module) -> nn.Module:
        """The prefix is stored in `spec.dtype` where it does not train (frozen, lora: peft keeps its adapters in
        float32); what trains is stored in float32, since a bfloat16 weight rounds away updates below about 1/256
        of itself (RL's learning rates of 1e-5 included). Forward passes run under autocast to `spec.dtype`."""
        kept = [*model.model.dit.get_input_embeddings().parameters(),
                *(model.model.vlm.parameters() if self.spec.finetune != "full" else ())]
        stored = {id(t): self.dtype for t in kept}
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.is_floating_point():
                tensor.data = tensor.data.to(stored.get(id(tensor), torch.float32))
        return model

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        return torch.autocast(device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)

    def _finetune(self, model: nn.Module) -> nn.Module:
        """frozen: the PaliGemma prefix runs without autograd; lora: adapters on its language model's attention;
        full: everything trains. The action expert and its projections train in every mode, except the expert's
        token embedding: pi0 feeds the expert action embeddings, never tokens, so those weights get no gradient."""
        vlm = model.model.vlm
        unused = model.model.dit.get_input_embeddings()
        unused.requires_grad_(False)
        if self.spec.finetune == "full":
            return model
        vlm.requires_grad_(False)
        if self.spec.finetune == "frozen":
            return model
        from peft import LoraConfig, get_peft_model

        targets = r".*model\.vlm\.language_model.*\.(q_proj|k_proj|v_proj|o_proj)"
        peft = get_peft_model(model, LoraConfig(r=self.spec.lora_rank, lora_alpha=self.spec.lora_alpha,
                                                target_modules=targets))
        pi0 = peft.get_base_model()
        for part in (pi0.model.dit, pi0.embed_action_time, pi0.action_out_proj):
            part.requires_grad_(True)
        unused.requires_grad_(False)
        self.register_load_state_dict_pre_hook(Pi0Policy._plain_into_lora)
        return peft

    def _plain_into_lora(self, state: dict, prefix: str, *args) -> None:
        """Loading the weights of a pi0 without adapters (an SFT run, a checkpoint) into one with them: its keys
        move under the LoRA wrapper (`base_layer` for the adapted projections) and the adapters keep their start."""
        plain, wrapped = f"{prefix}model.", f"{prefix}model.base_model.model."
        if any(k.startswith(wrapped) for k in state):
            return
        own = self.state_dict()
        for key in [k for k in state if k.startswith(plain)]:
            name = wrapped + key[len(plain):]
            if name not in own:
                head, _, leaf = name.rpartition(".")
                name = f"{head}.base_layer.{leaf}"
            state[name] = state.pop(key)
        for key, value in own.items():
            if "lora_" in key:
                state.setdefault(prefix + key, value)

    @property
    def pi0(self) -> nn.Module:
        """The PI0ForConditionalGeneration (inside its LoRA wrapper, when it has one)."""
        return self.model.get_base_model() if self.spec.finetune == "lora" else self.model

    def backbone_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.pi0.model.vlm.parameters() if p.requires_grad]

    # ---- observations -> pi0's inputs ----------------------------------------------------------------
    def encode_text(self, instructions: list[str], device: torch.device) -> torch.Tensor:
        """pi0's prompt after the image tokens: BOS, the instruction, a newline; right-padded (N×L)."""
        tok, n = self.tokenizer, self.spec.max_text_tokens
        rows = [[tok.bos_token_id, *tok(f"{text}\n", add_special_tokens=False).input_ids][:n] for text in instructions]
        return torch.tensor([row + [tok.pad_token_id] * (n - len(row)) for row in rows], device=device)

    def text_ids(self, obs: dict) -> torch.Tensor:
        if "text_ids" in obs:
            return obs["text_ids"]
        return self.encode_text(list(obs["instruction"]), obs["state"].device)

    def images(self, rgb: torch.Tensor) -> torch.Tensor:
        """N×H×W×3 uint8 frames -> N×1×3×S×S in [-1, 1] (SigLIP's normalization), one camera."""
        x = rgb.permute(0, 3, 1, 2).float() / 255
        if x.shape[-1] != self.image_size or x.shape[-2] != self.image_size:
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", antialias=True,
                              align_corners=False)
        return ((x - 0.5) / 0.5)[:, None].to(self.dtype)

    def prefix(self, obs: dict) -> Pi0Prefix:
        """The PaliGemma prefix over [image tokens, prompt] run once: its cache serves every denoising step."""
        text = self.text_ids(obs)
        n = text.shape[0]
        image_ids = torch.full((n, self.image_tokens), self.image_token_id, dtype=text.dtype, device=text.device)
        input_ids = torch.cat([image_ids, text], 1)
        mask = torch.cat([torch.ones_like(image_ids), (text != self.tokenizer.pad_token_id).long()], 1)
        pixel_mask = torch.ones(n, 1, dtype=torch.bool, device=text.device)
        model = self.pi0.model
        grad = contextlib.nullcontext() if self.spec.finetune != "frozen" else torch.no_grad()
        with grad, self.autocast(text.device):
            embeds = model.embed_prefix(input_ids, self.images(obs["rgb"]), pixel_mask)
            out = model.vlm(inputs_embeds=embeds, attention_mask=mask, position_ids=mask.cumsum(-1) - 1,
                            token_type_ids=torch.zeros_like(mask), use_cache=True)
        hidden = out.last_hidden_state.float()
        weights = mask[..., None].float()
        pooled = (hidden * weights).sum(1) / weights.sum(1)
        state = self.normalizer(obs["state"].float())
        state = F.pad(state, (0, self.pi0.config.max_state_dim - self.state_dim)).to(self.dtype)
        return Pi0Prefix(pooled, out.cache, out.cache.get_seq_length(), state, mask, pixel_mask)

    # ---- the flow in roborl's convention (what policies/flow_rl.py reads) -----------------------------
    def taus(self, device: torch.device) -> torch.Tensor:
        return torch.linspace(0, 1, self.steps + 1, device=device)

    def velocity(self, x: torch.Tensor, tau: torch.Tensor, cond: Pi0Prefix) -> torch.Tensor:
        """actions − noise at τ = 1 − t: minus pi0's prediction of noise − actions at its time t."""
        tau = tau.expand(x.shape[0]) if tau.dim() == 0 else tau
        with self.autocast(x.device):
            out = self.model(state=cond.state, noise=x, timestep=(1 - tau).float(), attention_mask=cond.attention_mask,
                             pixel_attention_mask=cond.pixel_attention_mask, cache=cond.cache)
        cond.cache.crop(cond.length - cond.cache.get_seq_length())  # back to the prefix alone, as sample_actions does
        return -out.logits.float()

    def noise_std_head(self, x: torch.Tensor, t: torch.Tensor, cond: Pi0Prefix) -> torch.Tensor:
        h = self.noise_head(torch.cat([x.flatten(1), t[:, None] / 1000, cond.pooled], -1))
        return h.view_as(x)

    # ---- the Policy interface --------------------------------------------------------------------------
    def act(self, obs: dict, deterministic: bool = False) -> Act:
        obs = {**obs, "text_ids": self.text_ids(obs)}
        cond = self.prefix(obs)
        value = self.critic(cond.pooled, obs)
        x, log_prob, extras = flow_rl.sample_chunk(self, cond, deterministic)
        extras["text_ids"] = obs["text_ids"]
        action = x[..., :self.env_action_dim].clamp(-1, 1)
        return Act(action[:, 0] if self.horizon == 1 else action, log_prob, value, extras)

    def evaluate(self, obs: dict, act: Act) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.rl_mode is None:
            raise ValueError("pi0 needs policy.rl_mode (flow_noise or flow_sde) to be fine-tuned by PPO or GRPO")
        cond = self.prefix({**obs, "text_ids": act.extras["text_ids"]})
        _, chain_log_prob = flow_rl.RL_MODES[self.rl_mode]
        log_prob, entropy = chain_log_prob(self, cond, act.extras)
        return log_prob, entropy, self.critic(cond.pooled, obs)

    def value(self, obs: dict) -> torch.Tensor:
        return self.critic(self.prefix(obs).pooled, obs)

    def update_normalizer(self, obs: dict) -> None:
        if not bool(self.normalizer_fitted):
            self.normalizer.update(obs["state"])

    @torch.no_grad()
    def fit_normalizer(self, states: torch.Tensor) -> None:
        self.normalizer.fit(states)
        self.normalizer_fitted.fill_(True)

    def bc_loss(self, obs: dict, actions: torch.Tensor) -> torch.Tensor:
        """pi0's own flow-matching loss (its Beta time distribution), on the real action dimensions only."""
        actions = actions[:, None] if actions.dim() == 2 else actions
        cond = self.prefix(obs)
        n, c = actions.shape[0], self.pi0.config
        target = F.pad(actions.float(), (0, self.action_dim - actions.shape[-1]))
        beta = torch.distributions.Beta(torch.tensor(c.time_sampling_beta_alpha), torch.tensor(c.time_sampling_beta_beta))
        t = (beta.sample((n,)) * c.time_sampling_scale + c.time_sampling_offset).to(actions.device)
        noise = torch.randn_like(target)
        x_t = t[:, None, None] * noise + (1 - t[:, None, None]) * target
        predicted = -self.velocity(x_t, 1 - t, cond)  # pi0's noise − actions
        a = self.env_action_dim
        return (predicted[..., :a] - (noise - target)[..., :a]).square().mean()

    # ---- saving ------------------------------------------------------------------------------------------
    def heads(self) -> nn.ModuleDict:
        """What roborl adds to pi0, saved beside the model: the value head, the normalizer, the noise head."""
        return nn.ModuleDict({"critic": self.critic, "normalizer": self.normalizer,
                              **({"noise_head": self.noise_head} if self.rl_mode == "flow_noise" else {})})

    def save_pretrained(self, directory: str | Path) -> None:
        """The model as transformers saves it (LoRA merged into the weights) and its tokenizer, so that
        `PI0ForConditionalGeneration.from_pretrained(directory)` loads it alone; roborl's heads and
        settings beside it."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        model = copy.deepcopy(self.model).merge_and_unload() if self.spec.finetune == "lora" else self.model
        model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        write_heads(out, self.heads(), {"spec": dataclasses.asdict(self.spec), "args": self.init_args,
                                        "normalizer_fitted": bool(self.normalizer_fitted)}, META_FILE)

    @classmethod
    def from_pretrained(cls, directory: str | Path, **overrides) -> Pi0Policy:
        """A policy saved by `save_pretrained`, its model read by transformers from the same directory."""
        src, meta = read_meta(directory, META_FILE, "pi0")
        spec = Pi0Spec(**{**meta["spec"], "path": str(src), "tokenizer_path": None})
        policy = cls(spec, **{**meta["args"], **overrides})
        load_model(policy.heads(), str(src / HEADS_FILE), strict=True)
        policy.normalizer_fitted.fill_(meta["normalizer_fitted"])
        return policy
