"""A LeRobot policy as a roborl policy: LeRobot's own model class and its own pre/post processors, loaded
from a local LeRobot policy directory or built small from LeRobot's config classes.

- SmolVLA is fine-tuned by PPO or GRPO through the flow chains of `policies/flow_rl.py` (flow-noise,
  flow-SDE), on its own `embed_prefix` / `denoise_step` (smolvla_flow.py).
- ACT predicts deterministic chunks: it acts (evaluation, `roborl bc`) and serves as the frozen base of a
  residual policy (`residual.base: <LeRobot dir>`), which is how RL fine-tunes it.
- Diffusion Policy is fine-tuned by DPPO (`policy.rl_mode: dppo`): its U-Net on the DDIM chain of
  `policies/dppo.py` over its own noise schedule.

Observations map onto LeRobot's features: the env's `state` is `observation.state` (or ACT's
`observation.environment_state`), its `rgb` frame every `observation.images.*` camera, its instruction
`task`. LeRobot's processors normalize them (and unnormalize actions) with statistics that roborl keeps as
buffers of this module, so they travel in roborl's checkpoints, and `fit_normalizer` sets the state's from
demonstrations. roborl adds a value head and (flow-noise) a noise-std head. `save_pretrained(dir)` writes
a LeRobot policy directory (config.json, model.safetensors, the processors) that LeRobot's own
`from_pretrained` loads, with roborl's heads beside it.
"""
from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_model
from torch import nn

from roborl.policies import flow_rl
from roborl.policies.act import Act
from roborl.policies.base import Policy
from roborl.policies.dppo import DPPOChain
from roborl.policies.executed import ExecutedChunk
from roborl.policies.gaussian import mlp
from roborl.policies.lerobot import compat, smolvla_flow
from roborl.policies.lerobot.configuration import LeRobotSpec
from roborl.policies.pretrained_heads import HEADS_FILE, read_meta, write_heads
from roborl.policies.value_head import ValueHead

RL_MODES = {"smolvla": ("flow_noise", "flow_sde"), "act": (), "diffusion": ("dppo",)}  # policy.rl_mode per type
META_FILE = "roborl_lerobot.json"
STATE_KEYS = ("observation.state", "observation.environment_state")
TEXT_PAD = -1  # padding of stored instruction tokens (their attention mask is `ids != TEXT_PAD`)


def is_policy_dir(path: str | Path) -> bool:
    """Whether `path` is a LeRobot policy directory (its config.json names a policy type)."""
    config = Path(path).expanduser() / "config.json"
    try:
        return config.is_file() and "type" in json.loads(config.read_text())
    except (OSError, ValueError):
        return False


def load_config(spec: LeRobotSpec, steps: int | None):
    """The config of the LeRobot policy directory `spec.path`, with what would reach a hub replaced:
    SmolVLA's VLM by `spec.vlm_path`, pretrained ResNet weights dropped (the checkpoint holds them); `steps`
    denoising steps (None: the checkpoint's)."""
    from lerobot.configs.policies import PreTrainedConfig

    path = Path(spec.path).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(f"policy.lerobot.path '{spec.path}' is not a local LeRobot policy directory (no config.json); "
                         "point it at a copy of the checkpoint (hub ids are not fetched)")
    try:
        config = PreTrainedConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # draccus' parse errors have no common base
        raise ValueError(f"policy.lerobot.path '{spec.path}': LeRobot cannot read its config.json ({exc})") from exc
    if config.type not in RL_MODES:
        raise ValueError(f"policy.lerobot.path '{spec.path}' holds a LeRobot '{config.type}' policy; roborl runs "
                         f"{', '.join(RL_MODES)}")
    config.device = "cpu"
    if config.type == "smolvla":
        config.load_vlm_weights = False  # the checkpoint's model.safetensors holds the VLM's weights
        vlm = Path(spec.vlm_path).expanduser() if spec.vlm_path else Path(config.vlm_model_name)
        if not (vlm / "config.json").is_file():
            raise ValueError(f"this SmolVLA reads its VLM from '{config.vlm_model_name}', which is not a local directory: "
                             "set policy.lerobot.vlm_path to a copy of it (config, processor and tokenizer files)")
        config.vlm_model_name = str(vlm)
        config.num_steps = steps or config.num_steps
    else:
        config.pretrained_backbone_weights = None
    if config.type == "diffusion":
        config.num_inference_steps = steps or config.num_inference_steps
    return config


def identity_stats(config) -> dict[str, dict[str, torch.Tensor]]:
    """Statistics that change nothing (roborl's actions are already in [-1, 1]; states are fitted later); images
    get ImageNet's for the types that standardize them."""
    from lerobot.configs.types import FeatureType

    stats = {}
    for key, feature in {**config.input_features, **config.output_features}.items():
        shape = feature.shape if feature.type is not FeatureType.VISUAL else (feature.shape[0], 1, 1)
        stats[key] = {"mean": torch.zeros(shape), "std": torch.ones(shape), "min": -torch.ones(shape),
                      "max": torch.ones(shape)}
        if feature.type is FeatureType.VISUAL:
            stats[key]["mean"] = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
            stats[key]["std"] = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    return stats


def normalizer_steps(*pipelines) -> list:
    return [step for pipe in pipelines for step in pipe.steps if hasattr(step, "_tensor_stats")]


class LeRobotPolicy(DPPOChain, ExecutedChunk, Policy):
    kind = "lerobot"

    def __init__(self, spec: LeRobotSpec, state_dim: int, action_dim: int, horizon: int, execute: int = 1, *,
                 image_shape: tuple[int, int] | None = None, steps: int = 10, rl_mode: str | None = None,
                 noise_min: float = 0.08, noise_max: float = 0.16, noise_level: float = 0.5,
                 critic_state_dim: int = 0, dppo: dict | None = None) -> None:
        super().__init__()
        compat.require()
        from lerobot.policies.factory import get_policy_class, make_pre_post_processors

        from roborl.policies.lerobot.small import small_config

        if not 1 <= execute <= horizon:
            raise ValueError(f"policy.horizon ({horizon}) must be >= env.action_chunk ({execute}) >= 1")
        if spec.path:
            config = load_config(spec, steps)
        else:
            config = small_config(spec, state_dim, action_dim, image_shape, horizon, execute, steps)
        self.type, self.spec = config.type, spec
        if rl_mode not in (None, *RL_MODES[self.type]):
            hint = (f"available: {', '.join(RL_MODES[self.type])}" if RL_MODES[self.type] else
                    "its chunks are deterministic: fine-tune it as the base of a residual policy (residual.base)")
            raise ValueError(f"policy.rl_mode '{rl_mode}' does not apply to LeRobot's {self.type}; {hint}")
        self._check_fits(config, state_dim, action_dim, image_shape, horizon)
        config.n_action_steps = execute
        if self.type == "smolvla":
            config.train_expert_only = config.freeze_vision_encoder = not spec.train_vlm
        cls = get_policy_class(self.type)
        path = str(Path(spec.path).expanduser()) if spec.path else None
        self.lerobot = cls.from_pretrained(path, config=config, local_files_only=True) if path else cls(config)
        overrides = {"device_processor": {"device": "cpu"}}
        if self.type == "smolvla":
            overrides["tokenizer_processor"] = {"tokenizer_name": config.vlm_model_name}
        has_processors = path and (Path(path) / "policy_preprocessor.json").is_file()
        self.preprocessor, self.postprocessor = make_pre_post_processors(
            config, pretrained_path=path if has_processors else None, dataset_stats=identity_stats(config),
            preprocessor_overrides=overrides, postprocessor_overrides={"device_processor": {"device": "cpu"}})
        self._stat_names: dict[str, tuple[str, str]] = {}
        for step in normalizer_steps(self.preprocessor, self.postprocessor):
            for key, stats in step._tensor_stats.items():
                for stat, value in stats.items():
                    name = f"stat_{key.replace('.', '_')}_{stat}"
                    if name not in self._stat_names:
                        self.register_buffer(name, value.detach().float().clone())
                        self._stat_names[name] = (key, stat)
        self.register_buffer("normalizer_fitted", torch.tensor(bool(has_processors)))

        self.config = config
        self.init_args = {"state_dim": state_dim, "action_dim": action_dim, "horizon": horizon, "execute": execute,
                          "image_shape": image_shape, "steps": steps, "rl_mode": rl_mode, "noise_min": noise_min,
                          "noise_max": noise_max, "noise_level": noise_level, "critic_state_dim": critic_state_dim,
                          "dppo": dppo}
        self.state_dim, self.env_action_dim, self.horizon, self.execute = state_dim, action_dim, horizon, execute
        self.steps, self.rl_mode = steps, rl_mode
        self.noise_min, self.noise_max, self.noise_level = noise_min, noise_max, noise_level
        self.state_keys = [k for k in STATE_KEYS if k in config.input_features]
        self._tokens: dict[str, torch.Tensor] = {}  # instruction -> its token ids (encode_text), made once each
        if self.type == "smolvla":
            self.action_dim = config.max_action_dim  # the chain's dims: SmolVLA's padded ones
            width = self.lerobot.model.vlm_with_expert.config.text_config.hidden_size
        else:
            self.action_dim, width = action_dim, state_dim
        self.critic = ValueHead(width, list(spec.value_hidden), True, critic_state_dim)
        if rl_mode == "dppo":  # DPPO's chain over the U-Net's own noise schedule; a frozen copy runs its early steps
            settings = {"eta": 1.0, "finetune_steps": 5, "min_sampling_std": 0.1, "min_logprob_std": 0.1,
                        "denoise_discount": 0.99, "clip_base": 1e-3, **(dppo or {})}
            self.setup_chain(self.lerobot.diffusion.noise_scheduler.config, steps, **settings)
            self.reference = copy.deepcopy(self.lerobot.diffusion.unet).requires_grad_(False)
        if rl_mode == "flow_noise":
            self.noise_head = mlp([horizon * self.action_dim + 1 + width, *spec.noise_hidden, horizon * self.action_dim],
                                  "tanh", 0.01)
            nn.init.zeros_(self.noise_head[-1].weight)
            nn.init.zeros_(self.noise_head[-1].bias)

    def _check_fits(self, config, state_dim: int, action_dim: int, image_shape, horizon: int) -> None:
        from lerobot.configs.types import FeatureType

        where = f"the LeRobot {config.type} at '{self.spec.path}'" if self.spec.path else f"LeRobot's {config.type}"
        chunk = config.horizon if config.type == "diffusion" else config.chunk_size
        if chunk != horizon:
            raise ValueError(f"{where} predicts chunks of {chunk} actions: set policy.horizon to {chunk}")
        action = config.output_features.get("action")
        if action is None or action.shape[0] != action_dim:
            raise ValueError(f"{where} predicts {action.shape[0] if action else 'no'}-dim actions; this env's have {action_dim}")
        states = [config.input_features[k].shape[0] for k in STATE_KEYS if k in config.input_features]
        if not states or any(dim != state_dim for dim in states):
            raise ValueError(f"{where} reads {states[0] if states else 'no'}-dim states; this env's have {state_dim}")
        cameras = [k for k, f in config.input_features.items() if f.type is FeatureType.VISUAL]
        if cameras and image_shape is None:
            raise ValueError(f"{where} reads images ({', '.join(cameras)}): set env.obs_mode to rgb")

    # ---- observations -> LeRobot's batch ----------------------------------------------------------------
    def _sync_stats(self) -> None:
        """LeRobot's normalizers read the statistics held by this module's buffers (loaded, fitted, moved)."""
        import numpy as np

        for step in normalizer_steps(self.preprocessor, self.postprocessor):
            for name, (key, stat) in self._stat_names.items():
                if key in step._tensor_stats and stat in step._tensor_stats[key]:
                    value = getattr(self, name)
                    step._tensor_stats[key][stat] = value
                    step.stats.setdefault(key, {})[stat] = value.detach().cpu().numpy().astype(np.float32)

    def lerobot_batch(self, obs: dict, actions: torch.Tensor | None = None) -> dict:
        """The observation (and demonstration actions) through LeRobot's preprocessor, on this module's device."""
        from lerobot.configs.types import FeatureType
        from lerobot.utils.constants import OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS

        self._sync_stats()
        state = obs["state"].float()
        n, device = state.shape[0], state.device
        raw: dict = {key: state.cpu() for key in self.state_keys}
        for key, feature in self.config.input_features.items():
            if feature.type is FeatureType.VISUAL:
                raw[key] = self.image(obs["rgb"], feature.shape[1:]).cpu()
        instructions = obs.get("instruction")
        raw["task"] = list(instructions) if instructions is not None and "text_ids" not in obs else [""] * n
        if actions is not None:
            raw["action"] = actions.float().cpu()
        batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in self.preprocessor(raw).items()}
        if "text_ids" in obs:
            ids = obs["text_ids"]
            batch[OBS_LANGUAGE_TOKENS] = ids.clamp(min=0)
            batch[OBS_LANGUAGE_ATTENTION_MASK] = ids != TEXT_PAD
        return batch

    @staticmethod
    def image(rgb: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """N×H×W×3 uint8 -> N×3×h×w in [0, 1] (LeRobot's image convention) at the feature's size."""
        x = rgb.permute(0, 3, 1, 2).float() / 255
        if tuple(x.shape[-2:]) != tuple(size):
            x = F.interpolate(x, size=tuple(size), mode="bilinear", antialias=True, align_corners=False)
        return x

    def encode_text(self, instructions: list[str], device: torch.device) -> torch.Tensor:
        """SmolVLA's instruction tokens as its preprocessor makes them, padded to its tokenizer_max_length with
        TEXT_PAD (N×L; fixed L, so rollouts of different instructions stack). A task has a few instructions and
        a rollout repeats them at every step, so each is tokenized once and kept."""
        from lerobot.utils.constants import OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS

        if self.type != "smolvla":
            return torch.zeros(len(instructions), 0, dtype=torch.long, device=device)
        new = [text for text in dict.fromkeys(instructions) if text not in self._tokens]
        if new:
            raw = {key: torch.zeros(len(new), self.state_dim) for key in self.state_keys}
            raw["task"] = new
            batch = self.preprocessor(raw)
            ids = batch[OBS_LANGUAGE_TOKENS].long().masked_fill(~batch[OBS_LANGUAGE_ATTENTION_MASK].bool(), TEXT_PAD)
            length = self.config.tokenizer_max_length
            ids = F.pad(ids[:, :length], (0, max(0, length - ids.shape[1])), value=TEXT_PAD).cpu()
            self._tokens.update(zip(new, ids))
        return torch.stack([self._tokens[text] for text in instructions]).to(device)

    def text_ids(self, obs: dict) -> torch.Tensor:
        if "text_ids" in obs:
            return obs["text_ids"]
        instructions = obs.get("instruction")
        n = obs["state"].shape[0]
        return self.encode_text(list(instructions) if instructions is not None else [""] * n, obs["state"].device)

    def unnormalize(self, chunk: torch.Tensor) -> torch.Tensor:
        """LeRobot's postprocessor on normalized actions (N×H×A), back on their device, clamped to [-1, 1]."""
        return self.postprocessor(chunk).to(chunk.device).clamp(-1, 1)

    # ---- the flow in roborl's convention (SmolVLA; what policies/flow_rl.py reads) --------------------------
    def taus(self, device: torch.device) -> torch.Tensor:
        return torch.linspace(0, 1, self.steps + 1, device=device)

    def velocity(self, x: torch.Tensor, tau: torch.Tensor, cond: smolvla_flow.SmolVLAPrefix) -> torch.Tensor:
        return smolvla_flow.velocity(self.lerobot, x, tau, cond)

    def noise_std_head(self, x: torch.Tensor, t: torch.Tensor, cond: smolvla_flow.SmolVLAPrefix) -> torch.Tensor:
        return self.noise_head(torch.cat([x.flatten(1), t[:, None] / 1000, cond.pooled], -1)).view_as(x)

    # ---- the Policy interface ------------------------------------------------------------------------------
    def features(self, obs: dict, batch: dict) -> torch.Tensor:
        """The value head's input for the deterministic types: the normalized state."""
        return batch[self.state_keys[0]].float()

    def with_history(self, batch: dict) -> dict:
        """Diffusion Policy reads `n_obs_steps` observations (B×n×...): the current one repeated, as LeRobot's
        queues hold it at an episode's start, and its cameras stacked under `observation.images`."""
        n = self.config.n_obs_steps
        out = {k: v[:, None].expand(-1, n, *v.shape[1:]) if k.startswith("observation.") and torch.is_tensor(v) else v
               for k, v in batch.items()}
        if self.config.image_features:
            out["observation.images"] = torch.stack([out[key] for key in self.config.image_features], dim=-4)
        return out

    def predict_chunk(self, batch: dict) -> torch.Tensor:
        """The deterministic types' whole chunk of normalized actions (N×H×A)."""
        if self.type == "diffusion":
            model = self.lerobot.diffusion
            batch = self.with_history(batch)
            return model.conditional_sample(batch[self.state_keys[0]].shape[0],
                                            global_cond=model._prepare_global_conditioning(batch))
        return self.lerobot.predict_action_chunk(batch)

    @property
    def denoiser(self) -> nn.Module:
        """DPPO's trainable network: the Diffusion Policy's own U-Net."""
        return self.lerobot.diffusion.unet

    def eps(self, net: nn.Module, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """The U-Net's noise prediction, called as LeRobot's `conditional_sample` calls it."""
        return net(x, t.long(), global_cond=cond)

    def global_cond(self, batch: dict) -> torch.Tensor:
        return self.lerobot.diffusion._prepare_global_conditioning(self.with_history(batch))

    def act(self, obs: dict, deterministic: bool = False) -> Act:
        if self.rl_mode == "dppo":
            batch = self.lerobot_batch(obs)
            cond = self.global_cond(batch)
            n = cond.shape[0]
            x, chain = self.sample_chain(cond, (n, self.horizon, self.action_dim), cond.device, deterministic)
            action = self.unnormalize(x)
            return Act(action[:, 0] if self.horizon == 1 else action, self.chain_log_prob(cond, chain),
                       self.critic(self.features(obs, batch), obs), {"chain": chain})
        if self.type != "smolvla":
            batch = self.lerobot_batch(obs)
            with torch.no_grad():
                chunk = self.predict_chunk(batch)
            value = self.critic(self.features(obs, batch), obs)
            n = chunk.shape[0]
            action = self.unnormalize(chunk)
            return Act(action[:, 0] if self.horizon == 1 else action, torch.zeros(n, device=chunk.device), value, {})
        obs = {**obs, "text_ids": self.text_ids(obs)}
        cond = smolvla_flow.prefix(self.lerobot, self.lerobot_batch(obs))
        value = self.critic(cond.pooled, obs)
        x, log_prob, extras = flow_rl.sample_chunk(self, cond, deterministic)
        extras["text_ids"] = obs["text_ids"]
        action = self.unnormalize(x[..., :self.env_action_dim])
        return Act(action[:, 0] if self.horizon == 1 else action, log_prob, value, extras)

    def evaluate(self, obs: dict, act: Act) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.rl_mode == "dppo":
            batch = self.lerobot_batch(obs)
            cond = self.global_cond(batch)
            return (self.chain_log_prob(cond, act.extras["chain"]), self.chain_entropy(cond.shape[0], cond.device),
                    self.critic(self.features(obs, batch), obs))
        if self.rl_mode is None:
            raise ValueError(f"LeRobot's {self.type} needs policy.rl_mode (flow_noise or flow_sde) to be fine-tuned "
                             "by PPO or GRPO" if self.type == "smolvla" else
                             f"LeRobot's {self.type} has no log-probability: fine-tune it as a residual's base")
        cond = smolvla_flow.prefix(self.lerobot, self.lerobot_batch({**obs, "text_ids": act.extras["text_ids"]}))
        _, chain_log_prob = flow_rl.RL_MODES[self.rl_mode]
        log_prob, entropy = chain_log_prob(self, cond, act.extras)
        return log_prob, entropy, self.critic(cond.pooled, obs)

    def value(self, obs: dict) -> torch.Tensor:
        batch = self.lerobot_batch({**obs, "text_ids": self.text_ids(obs)})
        if self.type == "smolvla":
            return self.critic(smolvla_flow.prefix(self.lerobot, batch).pooled, obs)
        return self.critic(self.features(obs, batch), obs)

    def ratio_clip(self, clip: float) -> float | torch.Tensor:
        return DPPOChain.ratio_clip(self, clip) if self.rl_mode == "dppo" else clip

    def advantage_weights(self) -> torch.Tensor | None:
        return DPPOChain.advantage_weights(self) if self.rl_mode == "dppo" else None

    def start_finetuning(self) -> None:
        """DPPO: the loaded (pretrained) U-Net becomes the frozen copy that runs the early denoising steps."""
        if self.rl_mode == "dppo":
            self.reference.load_state_dict(self.denoiser.state_dict())

    @torch.no_grad()
    def fit_normalizer(self, states: torch.Tensor) -> None:
        """The state's statistics from demonstrations (mean, std, min, max, and quantiles where LeRobot keeps them)."""
        states = states.float()
        values = {"mean": states.mean(0), "std": states.std(0).clamp(min=1e-6), "min": states.min(0).values,
                  "max": states.max(0).values, "q01": states.quantile(0.01, 0), "q99": states.quantile(0.99, 0)}
        for name, (key, stat) in self._stat_names.items():
            if key in self.state_keys and stat in values:
                getattr(self, name).copy_(values[stat])
        self.normalizer_fitted.fill_(True)

    def bc_loss(self, obs: dict, actions: torch.Tensor) -> torch.Tensor:
        """LeRobot's own training loss of the policy (flow matching, L1 on chunks, or denoising)."""
        actions = actions[:, None] if actions.dim() == 2 else actions
        batch = self.lerobot_batch(obs, actions)
        batch["action_is_pad"] = torch.zeros(actions.shape[:2], dtype=torch.bool, device=actions.device)
        if self.type == "diffusion":
            batch = {**self.with_history(batch), "action_is_pad": batch["action_is_pad"]}
        loss, _ = self.lerobot.forward(batch)
        return loss

    # ---- saving --------------------------------------------------------------------------------------------
    def heads(self) -> nn.ModuleDict:
        """What roborl adds to the LeRobot policy, saved beside it: the value head and the noise head."""
        return nn.ModuleDict({"critic": self.critic, **({"noise_head": self.noise_head}
                                                        if self.rl_mode == "flow_noise" else {})})

    def save_pretrained(self, directory: str | Path) -> None:
        """A LeRobot policy directory (LeRobot's `save_pretrained` of the model and of both processors, the
        fitted statistics in them), loadable by LeRobot alone; roborl's heads and settings beside it."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self._sync_stats()
        if self.rl_mode == "dppo":  # LeRobot then samples the chain DPPO tuned (DDIM over the same schedule)
            self.config.noise_scheduler_type, self.config.num_inference_steps = "DDIM", self.steps
        self.lerobot.save_pretrained(out)
        self.preprocessor.save_pretrained(out)
        self.postprocessor.save_pretrained(out)
        write_heads(out, self.heads(), {"spec": dataclasses.asdict(self.spec), "args": self.init_args}, META_FILE)

    @classmethod
    def from_directory(cls, path: str | Path, state_dim: int, action_dim: int,
                       image_shape: tuple[int, int] | None = None) -> LeRobotPolicy:
        """Any LeRobot policy directory with the chunk, executed steps and denoising steps it was saved with
        (e.g. a residual policy's base)."""
        compat.require("residual.base <LeRobot policy directory>")
        spec = LeRobotSpec(path=str(path))
        config = load_config(spec, None)
        horizon = config.horizon if config.type == "diffusion" else config.chunk_size
        steps = {"smolvla": getattr(config, "num_steps", 10), "diffusion": getattr(config, "num_inference_steps", None)}
        return cls(spec, state_dim, action_dim, horizon, config.n_action_steps, image_shape=image_shape,
                   steps=steps.get(config.type) or 10)

    @classmethod
    def from_pretrained(cls, directory: str | Path, **overrides) -> LeRobotPolicy:
        """A policy saved by `save_pretrained`, its model and processors read by LeRobot from the same directory."""
        src, meta = read_meta(directory, META_FILE, "LeRobot")
        spec = LeRobotSpec(**{**meta["spec"], "path": str(src)})
        args = {**meta["args"], **overrides}
        if args.get("image_shape") is not None:
            args["image_shape"] = tuple(args["image_shape"])
        policy = cls(spec, **args)
        load_model(policy.heads(), str(src / HEADS_FILE), strict=True)
        return policy
