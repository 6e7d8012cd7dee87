"""Typed run configuration: YAML file + `key=value` overrides, validated against dataclasses.

Unknown keys are rejected with their dotted path and the closest valid names; wrong types name the
expected type. Everything a run does is decided here, so a config file reproduces a run.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from roborl.errors import UserError
from roborl.policies.vla.spec import VLASpec
from roborl.sim.randomization import Randomization


@dataclass
class RMConfig:
    machine: str | None = None  # a reward-machine file (tasks/*.rm) or module:function returning one
    ltlf: str | None = None  # or an LTLf formula over the task's labels, e.g. "F(at_a & F(at_b))"
    reward: str = "replace"  # replace the task's reward by the machine's, or add them
    shaping_gamma: float | None = None  # potential-based shaping with Φ = V_RM and this γ (= algo.gamma); None: off


@dataclass
class ShieldConfig:
    workspace: list[float] = field(default_factory=list)  # [x0, y0, z0, x1, y1, z1]: box for the TCP target
    max_speed: float | None = None  # m/s of the commanded TCP motion (ee_delta_pos)
    action_rate: float | None = None  # max change of each action dimension per step
    joint_margin: float | None = None  # joint_delta_pos: keep joint targets this far (rad) inside the limits
    keep_out: list[list[float]] = field(default_factory=list)  # spheres [x, y, z, r] the TCP stays out of (CBF)
    cbf_alpha: float = 0.5
    cbf_margin: float = 0.02  # metres added to every keep-out radius
    automaton: str | None = None  # module:factory returning an AutomatonShield (e.g. roborl.shields.presets:pick_place_gripper)
    penalty: float = 0.0  # subtracted from the reward of a step where the shield intervened


@dataclass
class EnvConfig:
    id: str = "mujoco/Reach"
    num_envs: int = 64
    controller: str = "ee_delta_pos"
    control_freq: int = 20
    episode_length: int | None = None  # None: the task's default
    obs_mode: str = "state"
    render_size: list[int] = field(default_factory=lambda: [128, 128])
    backend: str = "mujoco"  # physics of the mujoco/ tasks: mujoco (CPU threads) | warp (MuJoCo Warp, GPU)
    action_chunk: int = 1  # K: one policy decision executes K actions of its chunk (sim/chunking.py)
    obs_history: int = 1  # n: `state` holds the last n states of the episode (sim/history.py)
    # asymmetric actor-critic: the task's privileged state (objects, goal) as `critic_state`, which a VLA's
    # value head reads beside the backbone features and the policy never does (embedded mujoco/ tasks that have it)
    critic_state: bool = False
    # training resets of a multi-task env sample each task in proportion to its weight (unnamed tasks weigh 1),
    # e.g. {push: 2}; evaluation keeps every task equally often
    task_weights: dict[str, float] = field(default_factory=dict)
    rm: RMConfig = field(default_factory=RMConfig)  # a reward machine over the task's labels (roborl/rm)
    shield: ShieldConfig = field(default_factory=ShieldConfig)  # action shields (roborl/shields)
    randomize: Randomization = field(default_factory=Randomization)  # domain randomization (sim/randomization.py)

    def for_evaluation(self) -> EnvConfig:
        """The env evaluations run in: every task of a multi-task env equally often (no task_weights)."""
        return dataclasses.replace(self, task_weights={})


@dataclass
class DPPOConfig:
    finetune_steps: int = 5  # K': the last K' denoising steps are fine-tuned, earlier ones use a frozen copy
    min_sampling_std: float = 0.1
    min_logprob_std: float = 0.1
    denoise_discount: float = 0.99  # γ_d: advantage of denoising step j scaled by γ_d^(K'-1-j)
    clip_base: float = 0.001  # ε_b: clip range of the first fine-tuned step, growing to algo.clip at the last


@dataclass
class FlowNoiseConfig:
    min_std: float = 0.08
    max_std: float = 0.16


@dataclass
class FlowSDEConfig:
    noise_level: float = 0.5  # a in σ_t = a·sqrt(t / (1 − t))


@dataclass
class FPOConfig:
    samples: int = 8  # (τ, ε) pairs per action; each pair's ratio is clipped on its own


@dataclass
class PolicyConfig:
    # gaussian | diffusion | flow | residual (a correction of `residual.base`) | token_vla | flow_vla (policies/vla)
    kind: str = "gaussian"
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    activation: str = "tanh"
    init_log_std: float = -0.5
    normalize_obs: bool = True
    init: str | None = None  # start from this checkpoint's weights (a BC policy, for RL fine-tuning)
    # take only these submodules from `init` (e.g. [backbone]: a VLA's pretrained backbone, a new expert)
    init_modules: list[str] = field(default_factory=list)
    horizon: int = 1  # H: actions predicted per decision (diffusion / flow); env.action_chunk of them run
    denoiser: str = "mlp"  # mlp | unet (diffusion / flow network)
    critic_hidden: list[int] = field(default_factory=lambda: [256, 256])
    steps: int = 10  # denoising steps (diffusion, DDIM) or Euler steps (flow) per action
    train_timesteps: int = 100  # DDPM training timesteps (diffusion)
    eta: float = 1.0  # DDIM η (diffusion); > 0 keeps sampling stochastic
    rl_mode: str | None = None  # diffusion: dppo; flow: flow_noise | flow_sde | fpo
    dppo: DPPOConfig = field(default_factory=DPPOConfig)
    flow_noise: FlowNoiseConfig = field(default_factory=FlowNoiseConfig)
    flow_sde: FlowSDEConfig = field(default_factory=FlowSDEConfig)
    fpo: FPOConfig = field(default_factory=FPOConfig)
    vla: VLASpec = field(default_factory=VLASpec)  # token_vla / flow_vla: backbone, fine-tuning, heads


    def __post_init__(self) -> None:
        if self.init_modules and not self.init:
            raise UserError(f"policy.init_modules {self.init_modules} takes parts of policy.init, which is unset: "
                            "set policy.init to a checkpoint (or leave policy.init_modules empty)")

@dataclass
class PPOConfig:
    lr: float = 3e-4
    gamma: float = 0.8
    gae_lambda: float = 0.9
    clip: float = 0.2
    clip_high: float | None = None  # the ratio's upper clip range, 1 + clip_high (None: algo.clip); DAPO's clip-higher
    group_size: int = 1  # G > 1: each iteration starts groups of G envs from one state; advantages centered per group
    epochs: int = 4
    minibatches: int = 4
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    clip_value_loss: bool = True
    norm_adv: bool = True
    norm_adv_by_task: bool = False  # standardize each task's advantages (obs["task_id"]) over the rollout
    target_kl: float | None = None  # stop the epochs early once the approximate KL exceeds this
    adaptive_lr: bool = False  # rsl_rl's schedule: lr ÷1.5 when KL > 2·desired_kl, ×1.5 when < ½·desired_kl
    desired_kl: float = 0.01
    anneal_lr: bool = False  # decay the policy's lr linearly to 0 over train.total_steps (CleanRL)
    critic_lr: float | None = None  # a learning rate of the critic's own (None: algo.lr for everything)
    backbone_lr: float | None = None  # a VLA backbone's own learning rate (None: algo.lr), e.g. slow under a fast expert
    value_clip: float | None = None  # clip range of the value loss (None: algo.clip)
    critic_warmup: int = 0  # iterations that fit only the critic before the policy moves
    bc_coef: float = 0.0  # weight of the pull toward the pretrained policy (diffusion / flow)
    cost_limit: float | None = None  # PPO-Lagrangian: keep the mean episode cost (info["cost"]) under this
    lagrange_ki: float = 0.01  # PID-Lagrangian gains on (episode cost − cost_limit); ki alone = gradient ascent on λ
    lagrange_kp: float = 0.0
    lagrange_kd: float = 0.0

    def __post_init__(self) -> None:
        if self.clip_high is not None and self.clip_high <= 0:
            raise UserError(f"algo.clip_high must be positive (the ratio's upper bound is 1 + clip_high), got "
                            f"{self.clip_high}; leave it unset for PPO's symmetric clip")
        if not isinstance(self.group_size, int) or self.group_size < 1:
            raise UserError(f"algo.group_size must be a positive integer (1: no group resets), got {self.group_size!r}")


@dataclass
class SACConfig:
    lr: float = 3e-4  # actor and critics
    gamma: float = 0.9
    tau: float = 0.005  # Polyak rate of the target critics
    batch_size: int = 256
    buffer_size: int = 1_000_000  # transitions, kept on train.device
    utd_ratio: float = 0.5  # gradient updates per environment transition (N envs step → round(N·utd) updates)
    seed_steps: int = 10000  # env steps of base-policy rollouts (no residual) before the first update
    progressive_steps: int = 0  # Policy Decorator: the residual is on per episode with prob min(t/H, 1); 0: always on
    init_alpha: float = 0.1  # entropy temperature, learned toward target_entropy
    target_entropy: float | None = None  # None: −action_dim
    critic_hidden: list[int] = field(default_factory=lambda: [256, 256])
    actor_delay: int = 1  # critic updates per actor update
    crm: bool = False  # with env.rm: store each transition as seen from every machine state (CRM)


GRPO_REWARDS = ("success", "success_at_end", "return", "return_to_go")
GRPO_LOSS_AGG = ("token_mean", "seq_mean_token_mean")


@dataclass
class GRPOConfig:
    """Critic-free group-relative PPO (roborl/grpo.py); optimizer, epochs and minibatches come from `algo`."""
    group_size: int = 8  # G: consecutive envs started from one initial state (env.num_envs must be a multiple)
    reward: str = "success"  # episode outcome: success (at any step) | success_at_end | return | return_to_go
    # (return_to_go: each step's return from there on, against the group's at that step; roborl/algos/grpo.py)
    std_normalize: bool = True  # A = (R − mean) / (std + eps) per group; false: Dr.GRPO's A = R − mean
    eps: float = 1.0e-6
    clip_low: float = 0.2  # ratio clipped to [1 − clip_low, 1 + clip_high] (DAPO's clip-higher)
    clip_high: float = 0.28
    dynamic_sampling: bool = True  # drop groups whose rewards all agree (zero variance, no signal; DAPO)
    resample_rounds: int = 0  # extra rollout rounds that refill the batch with groups that have signal (DAPO)
    loss_agg: str = "token_mean"  # token_mean: every step weighs alike (DAPO) | seq_mean_token_mean: every episode

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise UserError(f"grpo.group_size must be at least 2 (a group compares episodes), got {self.group_size}")
        if self.reward not in GRPO_REWARDS:
            raise UserError(f"grpo.reward '{self.reward}' is unknown; available: {', '.join(GRPO_REWARDS)}")
        if self.loss_agg not in GRPO_LOSS_AGG:
            raise UserError(f"grpo.loss_agg '{self.loss_agg}' is unknown; available: {', '.join(GRPO_LOSS_AGG)}")
        if not 0 < self.clip_low < 1 or self.clip_high <= 0:
            raise UserError(f"grpo.clip_low must be in (0, 1) and grpo.clip_high > 0, got {self.clip_low} and "
                            f"{self.clip_high}")
        if self.resample_rounds < 0:
            raise UserError(f"grpo.resample_rounds must be 0 or more, got {self.resample_rounds}")


@dataclass
class ResidualConfig:
    base: str | None = None  # expert | a checkpoint path (.safetensors) | module:factory (factory(env) -> callable)
    base_noise: float = 0.0  # expert only: std of Gaussian noise on its normalized actions
    base_bias: list[float] = field(default_factory=list)  # expert only: constant offset of its actions
    scale: float = 0.1  # action = base + scale·tanh(residual)
    inputs: str = "obs+base"  # what the residual sees: obs+base | obs


@dataclass
class BCConfig:
    demos: str = ""  # a directory written by `roborl demos` or its demos.hdf5
    max_episodes: int | None = None  # use only the first N (successful) episodes
    success_only: bool = True
    steps: int = 20000  # gradient steps
    batch_size: int = 256
    lr: float = 1.0e-3
    weight_decay: float = 1.0e-6
    eval_every: int = 2000  # gradient steps


@dataclass
class TrainConfig:
    algorithm: str = "ppo"  # ppo (on-policy, section `algo`) | sac (off-policy, section `sac`) | grpo (`grpo`, `algo`)
    total_steps: int = 1_000_000
    rollout_steps: int = 50
    eval_every: int = 10  # iterations
    eval_episodes: int = 32
    eval_envs: int = 32
    video: bool = True
    video_envs: int = 4
    save_every: int = 10  # iterations
    seed: int = 0
    device: str = "auto"
    threads: int | None = None
    run_dir: str = "runs"
    name: str | None = None
    resume: str | None = None
    progress: bool = True
    max_minutes: float | None = None  # stop (and save) once the run's wall time, across resumes, passes this
    eval_at_start: bool = True  # evaluate a pretrained policy (policy.init) before the first update
    stop_at_success: float | None = None  # end the run once deterministic eval success reaches this

    def __post_init__(self) -> None:
        for key in ("total_steps", "rollout_steps", "eval_every", "eval_episodes", "eval_envs", "save_every"):
            if getattr(self, key) < 1:
                raise UserError(f"train.{key} must be at least 1, got {getattr(self, key)}")


SEED_STRIDE = 100_000  # learner r seeds with train.seed + r·SEED_STRIDE; Ray env worker i with + (i + 1)·SEED_STRIDE
DIST_BACKENDS = ("auto", "gloo", "nccl")  # torch.distributed backends of resources.backend
INFERENCE_PLACEMENTS = ("collocated", "learner")  # where rollout inference runs with Ray env workers


@dataclass
class ResourcesConfig:
    learners: int = 1  # processes, each stepping env.num_envs / learners envs; gradients averaged (roborl/distributed.py)
    compile: bool = False  # torch.compile the policy's act in rollouts, GAE and the PPO loss (roborl/compiling.py)
    cuda_graphs: bool = False  # with compile on CUDA: rollout inference replayed as CUDA graphs (fixed shapes)
    backend: str = "auto"  # torch.distributed backend: auto (nccl on CUDA, gloo on CPU) | gloo | nccl
    # Ray env workers (roborl/ray_workers.py): 0 steps the envs in the learner's process
    env_workers: int = 0  # Ray actors, each stepping env.num_envs / env_workers envs
    inference: str = "collocated"  # collocated: each env worker acts with its copy of the policy | learner: the
    # learner acts on every step's gathered observations (disaggregated; one round trip per step)
    async_rollouts: bool = False  # workers collect the next rollouts while the learner updates (collocated only)
    max_staleness: int = 1  # async: rollouts in flight per worker, so a rollout lags the learner by <= this
    is_clip: float = 1.0  # async: truncation of the importance weight π_learner/π_behaviour (V-trace's ρ̄)
    device: str | None = None  # env workers' device (simulation, collocated inference); None: train.device
    worker_cpus: float = 1.0  # Ray resources each env worker asks for (placement)
    worker_gpus: float = 0.0
    # placement across a cluster: worker i prefers the node with custom resource worker_nodes[i % len] (soft:
    # a worker whose node is gone is replaced wherever Ray finds room), e.g. [head, node_b]
    worker_nodes: list[str] = field(default_factory=list)
    ray_address: str | None = None  # None: start a local Ray instance; "auto" or "host:port": join that cluster
    max_restarts: int = 3  # env workers that may die and be replaced before the run fails

    def __post_init__(self) -> None:
        if self.learners < 1:
            raise UserError(f"resources.learners must be at least 1, got {self.learners}")
        if self.backend not in DIST_BACKENDS:
            raise UserError(f"resources.backend '{self.backend}' is unknown; available: {', '.join(DIST_BACKENDS)}")
        if self.cuda_graphs and not self.compile:
            raise UserError("resources.cuda_graphs replays compiled kernels: set resources.compile: true too")
        if self.env_workers < 0:
            raise UserError(f"resources.env_workers must be 0 (no Ray) or more, got {self.env_workers}")
        if self.inference not in INFERENCE_PLACEMENTS:
            raise UserError(f"resources.inference '{self.inference}' is unknown; available: "
                            f"{', '.join(INFERENCE_PLACEMENTS)}")
        if self.async_rollouts and self.inference != "collocated":
            raise UserError("resources.async_rollouts needs resources.inference collocated (workers that act "
                            "with their own copy of the policy)")
        if self.max_staleness < 1:
            raise UserError(f"resources.max_staleness must be at least 1, got {self.max_staleness}")


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    algo: PPOConfig = field(default_factory=PPOConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    bc: BCConfig = field(default_factory=BCConfig)
    sac: SACConfig = field(default_factory=SACConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    residual: ResidualConfig = field(default_factory=ResidualConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)

    def __post_init__(self) -> None:
        if self.algo.norm_adv_by_task and (self.train.algorithm != "ppo" or not self.algo.norm_adv):
            raise UserError("algo.norm_adv_by_task standardizes PPO's advantages per task: it needs "
                            "train.algorithm ppo and algo.norm_adv true")
        if self.algo.clip_high is not None and self.train.algorithm != "ppo":
            raise UserError(f"algo.clip_high is PPO's upper clip range; train.algorithm {self.train.algorithm} does not "
                            "read it (GRPO's range is grpo.clip_low / grpo.clip_high): unset algo.clip_high")
        if self.algo.group_size > 1 and (self.train.algorithm != "ppo" or self.resources.env_workers
                                         or self.resources.learners > 1):
            raise UserError("algo.group_size is PPO's group resets in one process: it needs train.algorithm ppo, "
                            "resources.env_workers 0 and resources.learners 1 (GRPO's groups are grpo.group_size)")
        workers = self.resources.env_workers
        if workers:
            if self.env.num_envs % workers:
                raise UserError(f"env.num_envs ({self.env.num_envs}) must be divisible by resources.env_workers "
                                f"({workers}): each env worker steps an equal share of the envs")
            if self.train.algorithm != "ppo" and self.resources.inference == "collocated":
                raise UserError(f"train.algorithm {self.train.algorithm} collects in the learner's process, not in "
                                "Ray env workers: set resources.inference=learner (the workers simulate, the "
                                "learner acts)")
            if self.resources.learners > 1:
                raise UserError("resources.env_workers and resources.learners > 1 cannot be combined yet; "
                                "use one of them")
        learners = self.resources.learners
        if learners == 1:
            return
        if self.env.num_envs % learners:
            raise UserError(f"env.num_envs ({self.env.num_envs}) must be divisible by resources.learners ({learners}): "
                            "each learner steps an equal share of the envs")
        if self.train.algorithm != "ppo":
            raise UserError(f"resources.learners > 1 trains with ppo; train.algorithm {self.train.algorithm} runs "
                            "in one process (resources.learners=1)")
        if self.algo.cost_limit is not None:
            raise UserError("resources.learners > 1 does not support algo.cost_limit (PPO-Lagrangian) yet; "
                            "use resources.learners=1")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp)).replace("NoneType", "null")


def _check(value: Any, tp: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check(value, inner[0], path)
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise UserError(f"config key '{path}' must be a list of {_type_name(item)}, got {value!r}")
        return [_check(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_type, item = typing.get_args(tp)
        if not isinstance(value, dict):
            raise UserError(f"config key '{path}' must be a mapping of {_type_name(key_type)} to {_type_name(item)}, "
                            f"got {value!r}")
        return {_check(k, key_type, path): _check(v, item, f"{path}.{k}") for k, v in value.items()}
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # YAML 1.1 reads 1e-4 (no dot) as a string
            return float(value)
        except ValueError:
            pass
    if tp is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise UserError(f"config key '{path}' must be {_type_name(tp)}, got {type(value).__name__} {value!r}")
    return value


def _build(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise UserError(f"config section '{path or '<root>'}' must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        full = f"{path}.{key}" if path else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=3, cutoff=0.5)
            hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
            raise UserError(f"unknown config key '{full}'; {hint}valid keys here: {', '.join(names)}")
        tp = hints[key]
        kwargs[key] = _build(tp, value, full) if dataclasses.is_dataclass(tp) else _check(value, tp, full)
    return cls(**kwargs)


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise UserError(f"override '{dotted}': '{part}' is not a section")
    node[parts[-1]] = value


def parse_overrides(overrides: list[str]) -> dict:
    tree: dict = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(f"override '{item}' must look like key=value (e.g. train.total_steps=200000)")
        key = {"resume": "train.resume"}.get(key, key)
        _set_dotted(tree, key, yaml.safe_load(raw) if raw else None)
    return tree


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """The run's config: the YAML file (or, with only `resume=PATH`, the checkpoint's own config)
    with the `key=value` overrides applied on top."""
    data: dict = {}
    extra = parse_overrides(list(overrides))
    resume = extra.get("train", {}).get("resume")
    if path is None and resume:
        from roborl.checkpoint import Checkpoint

        data = Checkpoint(resume).config
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise UserError(f"config file '{path}' does not exist (see configs/ for examples)")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise UserError(f"config file '{path}' is not valid YAML: {str(exc).splitlines()[0]}") from exc
    return config_from_dict(_merge(data, extra))


def config_from_dict(data: dict) -> Config:
    return _build(Config, data, "")


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)
