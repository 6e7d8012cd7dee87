"""Config -> objects: the environment (with its wrappers), the policy, the device."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from roborl import (
    policies,  # its models import on first use: diffusers only for the policies that need it
    sim,
    tasks,  # registers the embedded mujoco/ tasks
)
from roborl.config import Config, EnvConfig, PolicyConfig, ResidualConfig, config_from_dict
from roborl.errors import UserError
from roborl.imports import import_factory
from roborl.policies.call_chooser import CallChooser
from roborl.policies.lerobot.configuration import LeRobotSpec
from roborl.rm import Hierarchy, HierarchyEnv, RewardMachineEnv, flatten, load_hierarchy
from roborl.rm.call_learning import CallLearner
from roborl.shields import ShieldChain, ShieldEnv
from roborl.shields.specs import build_shields
from roborl.sim.base_action import BaseActionEnv
from roborl.sim.chunking import ActionChunkEnv
from roborl.sim.history import StateHistoryEnv
from roborl.sim.wrapper import find_wrapper
from roborl.tasks.arm import ArmEnv
from roborl.tasks.expert import ImperfectExpert
from roborl.tasks.two_arms import TwoArmReachEnv

VLA_KINDS = ("token_vla", "flow_vla", "pi0")  # policies/vla, policies/pi0.py: the `vla` extra (transformers, peft)
BASE_IGNORES = ("critic_state",)  # what a frozen base never reads: a value head's privileged state
CRITIC_STATE_KINDS = (*VLA_KINDS, "lerobot", "residual")  # the policies whose value heads read env.critic_state


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise UserError(f"train.device '{name}' is not a device (use auto, cpu, cuda or cuda:N)") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"train.device is '{name}' but this torch has no CUDA device; use device=cpu or auto")
    return device


def make_env(cfg: EnvConfig, num_envs: int, seed: int, device: torch.device) -> sim.VecEnv:
    options: dict = {"device": device, "seed": seed}
    if cfg.episode_length is not None:
        options["episode_length"] = cfg.episode_length
    if cfg.id.startswith("mujoco/"):
        options.update(controller=cfg.controller, control_freq=cfg.control_freq, obs_mode=cfg.obs_mode,
                       render_size=tuple(cfg.render_size), backend=cfg.backend)
        if cfg.randomize.enabled:
            options["randomization"] = cfg.randomize
        if cfg.critic_state:
            options["critic_state"] = True
        if cfg.proprio_only:
            options["proprio_only"] = True
    elif cfg.proprio_only:
        raise UserError(f"env.proprio_only works on the embedded mujoco/ arm tasks, not {cfg.id}")
    elif cfg.critic_state:
        raise UserError(f"env.critic_state works on the embedded mujoco/ tasks with privileged state, not {cfg.id}")
    elif cfg.randomize.enabled:
        raise UserError(f"env.randomize works on the embedded mujoco/ tasks, not {cfg.id}")
    elif cfg.backend != "mujoco":
        raise UserError(f"env.backend '{cfg.backend}' picks the physics of the embedded mujoco/ tasks; "
                        f"{cfg.id} brings its own simulator (leave env.backend=mujoco)")
    if cfg.id.startswith("maniskill/"):  # env.controller names a ManiSkill control mode, e.g. pd_joint_delta_pos
        options.update(control_mode=cfg.controller, obs_mode=cfg.obs_mode, render_size=tuple(cfg.render_size))
    if cfg.id.startswith("libero/"):  # state skips LIBERO's cameras; rgb renders agent view and wrist at this size
        options.update(obs_mode=cfg.obs_mode, image_size=cfg.render_size[0])
    env = sim.make(cfg.id, num_envs, **options)
    if cfg.task_weights:
        set_task_weights(env, cfg)
    if cfg.rm.machine or cfg.rm.ltlf:
        try:
            machine = load_hierarchy(cfg.rm.machine, cfg.rm.ltlf, split=cfg.rm.learner == "options",
                                     progress=env.label_progress)
        except ValueError as exc:
            raise UserError(str(exc)) from exc
        if cfg.rm.learner == "options":
            if not isinstance(machine, Hierarchy):
                source = cfg.rm.machine or "the LTLf formula"
                raise UserError(f"env.rm.learner options learns a hierarchy of machines; {source} is a flat machine "
                                "(use env.rm.learner flat, or a file of `machine NAME` sections)")
            env = HierarchyEnv(env, machine, cfg.rm.reward)
        else:
            env = RewardMachineEnv(env, flatten(machine) if isinstance(machine, Hierarchy) else machine,
                                   cfg.rm.reward, cfg.rm.shaping_gamma)
    shield = make_shield(cfg, env)
    if shield is not None:
        env = ShieldEnv(env, shield, cfg.shield.penalty)
    if cfg.obs_history > 1:
        env = StateHistoryEnv(env, cfg.obs_history)
    if cfg.action_chunk > 1:
        env = ActionChunkEnv(env, cfg.action_chunk)
    return env


def set_task_weights(env: sim.VecEnv, cfg: EnvConfig) -> None:
    if not hasattr(env.unwrapped, "set_task_weights"):
        env.close()
        raise UserError(f"env.task_weights weighs the tasks of a multi-task env (mujoco/LangTabletop*); {cfg.id} "
                        "samples no tasks: remove env.task_weights")
    try:
        env.unwrapped.set_task_weights(cfg.task_weights)
    except sim.SimError as exc:
        env.close()
        raise UserError(f"env.task_weights: {exc}") from exc


def shield_specs(cfg: EnvConfig, env: sim.VecEnv) -> list[dict]:
    """The shields `env.shield` asks for, as data (roborl/shields/specs.py), in the order: action rate,
    speed, workspace, keep-out, automaton, joints."""
    s = cfg.shield
    raw = env.unwrapped
    if isinstance(raw, TwoArmReachEnv):
        return two_arm_shield_specs(cfg, raw)
    if s.arm_gap is not None:
        raise UserError(f"env.shield.arm_gap keeps two arms apart: it works on mujoco/TwoArmReach, not {cfg.id}")
    if not (s.workspace or s.max_speed or s.action_rate or s.joint_margin is not None or s.keep_out or s.automaton):
        return []
    if not isinstance(raw, ArmEnv):
        raise UserError(f"env.shield works on the embedded arm tasks (mujoco/...), not {cfg.id}")
    ee = [name for name, on in (("workspace", s.workspace), ("max_speed", s.max_speed), ("keep_out", s.keep_out)) if on]
    if ee and cfg.controller != "ee_delta_pos":
        raise UserError(f"env.shield.{ee[0]} shields the ee_delta_pos controller; this env uses {cfg.controller}")
    if s.joint_margin is not None and cfg.controller != "joint_delta_pos":
        raise UserError(f"env.shield.joint_margin shields the joint_delta_pos controller; this env uses {cfg.controller}")
    if s.workspace and len(s.workspace) != 6:
        raise UserError(f"env.shield.workspace needs 6 numbers [x0, y0, z0, x1, y1, z1], got {s.workspace}")
    layout = raw.obs_layout
    tcp = [layout["tcp"].start, layout["tcp"].stop]
    specs: list[dict] = []
    if s.action_rate:
        specs.append({"type": "action_rate", "max_delta": s.action_rate})
    if s.max_speed:
        specs.append({"type": "max_speed", "max_speed": s.max_speed, "control_dt": raw.control_dt,
                      "max_step": raw.max_ee_step})
    if s.workspace:
        specs.append({"type": "workspace", "low": s.workspace[:3], "high": s.workspace[3:], "tcp": tcp,
                      "max_step": raw.max_ee_step})
    if s.keep_out:
        specs.append({"type": "keep_out", "spheres": s.keep_out, "tcp": tcp, "max_step": raw.max_ee_step,
                      "alpha": s.cbf_alpha, "margin": s.cbf_margin})
    if s.automaton:
        specs.append({"type": "automaton", "factory": s.automaton})
    if s.joint_margin is not None:
        specs.append({"type": "joint_limits", "lower": raw.chain.lower.tolist(), "upper": raw.chain.upper.tolist(),
                      "q": [layout["q"].start, layout["q"].stop], "max_joint_step": raw.max_joint_step,
                      "margin": s.joint_margin})
    return specs


def two_arm_shield_specs(cfg: EnvConfig, raw: TwoArmReachEnv) -> list[dict]:
    """The gap shields of a two-arm task: one per arm (composed) or one on both arms' actions (central)."""
    s = cfg.shield
    single = [name for name in ("workspace", "max_speed", "action_rate", "joint_margin", "keep_out", "automaton")
              if getattr(s, name) not in (None, [])]
    if single:
        raise UserError(f"env.shield.{single[0]} shields one arm; {cfg.id} has two: use env.shield.arm_gap")
    if s.arm_gap is None:
        return []
    tcps = [[raw.obs_layout[f"{arm}_tcp"].start, raw.obs_layout[f"{arm}_tcp"].stop] for arm in raw.arms]
    starts = [space.action[0] for space in raw.agents.values()]
    if s.arm_gap_shield == "central":
        return [{"type": "joint_gap", "tcps": tcps, "starts": starts, "max_step": raw.max_ee_step, "gap": s.arm_gap}]
    return [{"type": "arm_gap", "tcp": tcps[i], "other_tcp": tcps[1 - i], "start": starts[i],
             "max_step": raw.max_ee_step, "gap": s.arm_gap} for i in range(2)]


def make_shield(cfg: EnvConfig, env: sim.VecEnv) -> ShieldChain | None:
    specs = shield_specs(cfg, env)
    if not specs:
        return None
    try:
        return build_shields(specs)
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def make_residual_env(cfg: Config, num_envs: int, seed: int, device: torch.device) -> sim.VecEnv:
    """The env a residual policy acts in: the simulator (with the base's observation history) plus the
    frozen base, whose action for each step is `obs["base_action"]` (sim/base_action.py)."""
    r = cfg.residual
    if not r.base:
        raise UserError("policy.kind residual needs residual.base: expert, a checkpoint path, a LeRobot policy "
                        "directory or module:factory")
    if cfg.env.action_chunk != 1:
        raise UserError("a residual policy corrects every control step: set env.action_chunk=1 "
                        "(a chunked base runs its own chunks open loop)")
    if r.base == "expert":
        env = make_env(cfg.env, num_envs, seed, device)
        return BaseActionEnv(env, make_expert_base(cfg.env.id, env, r, seed))
    if ":" in r.base and not r.base.endswith(".safetensors"):
        env = make_env(cfg.env, num_envs, seed, device)
        base = import_factory(r.base, "residual.base")(env)
        return BaseActionEnv(env, base, getattr(base, "execute", 1))
    if not Path(r.base).exists():
        raise UserError(f"residual.base '{r.base}' does not exist: train the base first (a checkpoint such as "
                        "RUN/checkpoints/best.safetensors, or a LeRobot policy directory written by `roborl export "
                        "CKPT --format pretrained --out DIR`), or use expert or module:factory")
    if lerobot_policy_dir(r.base):
        env = make_env(cfg.env, num_envs, seed, device)
        base = load_lerobot_base(r.base, env, device)
        return BaseActionEnv(env, lambda obs: base.act(obs, deterministic=True).action, base.execute)
    policy, base_cfg, base_spaces = load_base_policy(r.base, device)
    if cfg.env.obs_history not in (1, base_cfg.env.obs_history):
        raise UserError(f"env.obs_history is set by the base checkpoint ({base_cfg.env.obs_history}); leave it at 1")
    env = make_env(dataclasses.replace(cfg.env, obs_history=base_cfg.env.obs_history), num_envs, seed, device)
    spaces = describe_spaces(env, BASE_IGNORES)
    if spaces != base_spaces:  # another task of the same observations is fine (per-task evals)
        env.close()
        raise UserError(f"residual.base '{r.base}' was trained on {base_cfg.env.id} ({base_spaces}); "
                        f"{cfg.env.id} has {spaces}: it cannot be this env's base")
    return BaseActionEnv(env, lambda obs: policy.act(obs, deterministic=True).action, base_cfg.env.action_chunk)


def image_shape(spaces: dict) -> tuple[int, int] | None:
    """(H, W) of the `rgb` observation, or None for an env without a camera."""
    return tuple(spaces["rgb"].shape[:2]) if "rgb" in spaces else None


def critic_state_dim(spaces: dict) -> int:
    """Width of the privileged `critic_state` observation (env.critic_state), 0 without it."""
    return spaces["critic_state"].shape[0] if "critic_state" in spaces else 0


def describe_spaces(env: sim.VecEnv, without: tuple[str, ...] = ()) -> str:
    """The shapes of an env's observations (but those `without`) and of one control step's action, e.g.
    'state (24,), action (4,)'."""
    shapes = {k: getattr(s, "shape", None) for k, s in env.observation_space.spaces.items() if k not in without}
    shapes["action"] = (env.action_dim,)
    return ", ".join(f"{k} {tuple(v) if v is not None else '-'}" for k, v in shapes.items())


def make_expert_base(env_id: str, env: sim.VecEnv, r: ResidualConfig, seed: int) -> ImperfectExpert:
    if env_id not in tasks.EXPERTS:
        raise UserError(f"residual.base expert: no scripted expert for '{env_id}'; tasks with experts: "
                        f"{', '.join(tasks.EXPERTS)}")
    try:  # the expert reads the simulator's privileged state
        return ImperfectExpert(tasks.EXPERTS[env_id](env.unwrapped), r.base_bias, r.base_noise, seed)
    except ValueError as exc:
        raise UserError(f"residual.base expert: {exc}") from exc


def lerobot_policy_dir(path: str) -> bool:
    from pathlib import Path

    return Path(path).expanduser().is_dir() and (Path(path).expanduser() / "config.json").is_file()


def load_lerobot_base(path: str, env: sim.VecEnv, device: torch.device) -> nn.Module:
    """A LeRobot policy directory (ACT, Diffusion Policy, SmolVLA) as a frozen base, acting deterministically."""
    try:
        from roborl.policies.lerobot.policy import LeRobotPolicy, is_policy_dir

        if not is_policy_dir(path):
            raise ValueError(f"residual.base '{path}' has a config.json that names no LeRobot policy type")
        spaces = env.observation_space.spaces
        image = image_shape(spaces)
        base = LeRobotPolicy.from_directory(path, spaces["state"].shape[0], env.action_dim, image)
    except (ImportError, ValueError, OSError) as exc:
        env.close()
        raise UserError(f"residual.base: {exc}") from exc
    return base.to(device).eval().requires_grad_(False)


def load_base_policy(path: str, device: torch.device) -> tuple[nn.Module, Config, str]:
    """A trained roborl policy, frozen, the config it was trained with and its env's `describe_spaces`."""
    from roborl.checkpoint import Checkpoint

    ckpt = Checkpoint(path)
    base_cfg = config_from_dict(ckpt.config)
    if base_cfg.policy.kind == "residual":
        raise UserError(f"residual.base '{path}' is itself a residual policy; use its base, or export it first")
    probe = make_env(base_cfg.env, 1, 0, torch.device("cpu"))
    policy = make_policy(base_cfg.policy, probe, base_cfg.env.action_chunk)
    spaces = describe_spaces(probe, BASE_IGNORES)
    probe.close()
    ckpt.load_policy(policy)
    return policy.to(device).eval().requires_grad_(False), base_cfg, spaces


def make_run_env(cfg: Config, num_envs: int, seed: int, device: torch.device) -> sim.VecEnv:
    """The environment a run's policy acts in (training and evaluation)."""
    if cfg.policy.kind == "residual":
        return make_residual_env(cfg, num_envs, seed, device)
    return make_env(cfg.env, num_envs, seed, device)


def per_agent_actors(cfg: PolicyConfig, env: sim.VecEnv) -> dict[str, tuple[tuple[int, ...], int]]:
    """What each agent's actor reads and commands (policy.actors per_agent)."""
    if not env.agents:
        raise UserError("policy.actors per_agent needs an env of several agents (e.g. mujoco/TwoArmReach); "
                        "this one has one: use policy.actors joint")
    if isinstance(env, (StateHistoryEnv, ActionChunkEnv)) or env.action_dim != sum(a.action_dim for a in env.agents.values()):
        raise UserError("policy.actors per_agent reads each agent's columns of one step's state and commands its "
                        "action dims: leave env.obs_history and env.action_chunk at 1")
    return {name: (space.state, space.action_dim) for name, space in env.agents.items()}


def option_machines(env: sim.VecEnv) -> list[int] | None:
    """The machine of each option column at the end of `state`, for a hierarchy learned by options (in this
    process, or in the Ray env workers behind a RayVecEnv); None for any other env."""
    hierarchy = find_wrapper(env, HierarchyEnv)
    return hierarchy.options.machine_of if hierarchy is not None else getattr(env, "option_machines", None)


def per_machine_actors(env: sim.VecEnv) -> list[int]:
    """`option_machines`, which policy.actors per_machine needs."""
    machines = option_machines(env)
    if machines is None:
        raise UserError("policy.actors per_machine trains one actor per machine of a hierarchy learned by options: "
                        "set env.rm.machine to a hierarchy file and env.rm.learner options (or policy.actors joint)")
    return machines


def make_policy(cfg: PolicyConfig, env: sim.VecEnv, execute: int = 1, residual: ResidualConfig | None = None,
                state_std: bool = False, cost_critic: bool = False) -> nn.Module:
    spaces = env.observation_space.spaces
    obs_dim, action_dim = spaces["state"].shape[0], env.action_dim
    if "critic_state" in spaces and cfg.kind not in CRITIC_STATE_KINDS:
        raise UserError(f"env.critic_state is read only by the value heads of policy.kind "
                        f"{', '.join(CRITIC_STATE_KINDS)}, not by {cfg.kind}; set env.critic_state false")
    if cfg.kind == "residual":
        if "base_action" not in spaces:
            raise UserError("policy.kind residual needs an env with a base (residual.base)")
        r = residual or ResidualConfig()
        critic_dim = critic_state_dim(spaces)
        if critic_dim and state_std:
            raise UserError("env.critic_state is read by PPO's value head; SAC's critics see the policy's "
                            "observation: set env.critic_state false")
        image = image_shape(spaces)
        try:
            return policies.ResidualPolicy(obs_dim, action_dim, r.scale, r.inputs, list(cfg.hidden), cfg.activation,
                                           cfg.init_log_std, state_std, cfg.normalize_obs, critic=not state_std,
                                           image_shape=image, critic_state_dim=critic_dim)
        except ValueError as exc:
            raise UserError(str(exc)) from exc
    if cfg.kind == "gaussian":
        if execute > 1:
            raise UserError("env.action_chunk > 1 needs a chunk-predicting policy (policy.kind diffusion or flow)")
        image = image_shape(spaces)
        agents = per_agent_actors(cfg, env) if cfg.actors == "per_agent" else None
        machines = per_machine_actors(env) if cfg.actors == "per_machine" else None
        try:
            return policies.GaussianActorCritic(obs_dim, action_dim, list(cfg.hidden), cfg.activation,
                                                cfg.init_log_std, cfg.normalize_obs, image_shape=image, cost_critic=cost_critic,
                                                sac=state_std, agents=agents, option_machines=machines)
        except ValueError as exc:
            raise UserError(str(exc)) from exc
    if cfg.kind == "pi0":
        return make_pi0_policy(cfg, env, execute)
    if cfg.kind == "lerobot":
        return make_lerobot_policy(cfg.lerobot, cfg, env, execute)
    if cfg.kind in VLA_KINDS:
        return make_vla_policy(cfg, env, execute)
    if "rgb" in spaces:
        raise UserError(f"policy.kind '{cfg.kind}' conditions on `state` only; use env.obs_mode=state")
    common = dict(denoiser=cfg.denoiser, hidden=list(cfg.hidden), critic_hidden=list(cfg.critic_hidden),
                  normalize_obs=cfg.normalize_obs, steps=cfg.steps)
    try:
        if cfg.kind == "diffusion":
            d = cfg.dppo
            return policies.DiffusionPolicy(obs_dim, action_dim, cfg.horizon, execute, train_timesteps=cfg.train_timesteps,
                                            eta=cfg.eta, rl_mode=cfg.rl_mode, finetune_steps=d.finetune_steps,
                                            min_sampling_std=d.min_sampling_std,
                                            min_logprob_std=d.min_logprob_std, denoise_discount=d.denoise_discount,
                                            clip_base=d.clip_base, **common)
        return policies.FlowPolicy(obs_dim, action_dim, cfg.horizon, execute, rl_mode=cfg.rl_mode,
                                   noise_min=cfg.flow_noise.min_std, noise_max=cfg.flow_noise.max_std,
                                   noise_level=cfg.flow_sde.noise_level, fpo_samples=cfg.fpo.samples, **common)
    except ValueError as exc:  # the policies check their own arguments (rl_mode, denoiser, horizon)
        raise UserError(str(exc)) from exc


def make_vla_policy(cfg: PolicyConfig, env: sim.VecEnv, execute: int) -> nn.Module:
    """A token or flow VLA (policies/vla) on the env's `rgb`, `state` and `instruction` observations."""
    if "rgb" not in env.observation_space.spaces:
        raise UserError(f"policy.kind {cfg.kind} needs rgb observations; set env.obs_mode to rgb (or rgb+state)")
    try:
        from roborl.policies.vla.flow_vla import FlowVLAPolicy
        from roborl.policies.vla.token_vla import TokenVLAPolicy
    except ImportError as exc:
        raise UserError(f"policy.kind {cfg.kind} needs the vla extra: pip install -e '.[vla]' ({exc})") from exc
    spaces = env.observation_space.spaces
    state_dim, action_dim = spaces["state"].shape[0], env.action_dim
    critic_dim = critic_state_dim(spaces)
    try:
        if cfg.kind == "token_vla":
            if cfg.rl_mode is not None:
                raise ValueError("policy.rl_mode does not apply to token_vla (its log-prob is the action tokens')")
            return TokenVLAPolicy(cfg.vla, state_dim, action_dim, cfg.horizon, execute, critic_dim)
        return FlowVLAPolicy(cfg.vla, state_dim, action_dim, cfg.horizon, execute, steps=cfg.steps,
                             rl_mode=cfg.rl_mode, noise_min=cfg.flow_noise.min_std, noise_max=cfg.flow_noise.max_std,
                             noise_level=cfg.flow_sde.noise_level, fpo_samples=cfg.fpo.samples,
                             critic_state_dim=critic_dim)
    except (ValueError, OSError) as exc:  # bad settings, a checkpoint directory that is missing or incomplete
        raise UserError(str(exc)) from exc


def make_pi0_policy(cfg: PolicyConfig, env: sim.VecEnv, execute: int) -> nn.Module:
    """pi0 (transformers' PI0ForConditionalGeneration) on the env's `rgb`, `state` and `instruction`."""
    spaces = env.observation_space.spaces
    if "rgb" not in spaces:
        raise UserError("policy.kind pi0 needs rgb observations; set env.obs_mode to rgb")
    try:
        from roborl.policies.pi0 import Pi0Policy
    except ImportError as exc:
        raise UserError(f"policy.kind pi0 needs the vla extra: pip install -e '.[vla]' ({exc})") from exc
    critic_dim = critic_state_dim(spaces)
    try:
        return Pi0Policy(cfg.pi0, spaces["state"].shape[0], env.action_dim, cfg.horizon, execute, steps=cfg.steps,
                         rl_mode=cfg.rl_mode, noise_min=cfg.flow_noise.min_std, noise_max=cfg.flow_noise.max_std,
                         noise_level=cfg.flow_sde.noise_level, critic_state_dim=critic_dim)
    except (ValueError, OSError) as exc:  # bad settings, a checkpoint directory that is missing or incomplete
        raise UserError(str(exc)) from exc


def make_lerobot_policy(spec: LeRobotSpec, cfg: PolicyConfig, env: sim.VecEnv, execute: int) -> nn.Module:
    """A LeRobot policy (policies/lerobot) on the env's `state`, and its `rgb` and `instruction` where it has them."""
    try:
        from roborl.policies.lerobot.policy import LeRobotPolicy
    except ImportError as exc:
        raise UserError(f"policy.kind lerobot needs the lerobot extra: bash scripts/setup.sh installs it ({exc})") from exc
    spaces = env.observation_space.spaces
    critic_dim = critic_state_dim(spaces)
    image = image_shape(spaces)
    try:
        return LeRobotPolicy(spec, spaces["state"].shape[0], env.action_dim, cfg.horizon, execute, image_shape=image,
                             steps=cfg.steps, rl_mode=cfg.rl_mode, noise_min=cfg.flow_noise.min_std,
                             noise_max=cfg.flow_noise.max_std, noise_level=cfg.flow_sde.noise_level,
                             critic_state_dim=critic_dim,
                             dppo={"eta": cfg.eta, "finetune_steps": cfg.dppo.finetune_steps,
                                   "min_sampling_std": cfg.dppo.min_sampling_std,
                                   "min_logprob_std": cfg.dppo.min_logprob_std,
                                   "denoise_discount": cfg.dppo.denoise_discount, "clip_base": cfg.dppo.clip_base})
    except ImportError as exc:  # lerobot or torchvision missing
        raise UserError(str(exc)) from exc
    except (ValueError, OSError) as exc:  # bad settings, a policy directory that is missing or incomplete
        raise UserError(str(exc)) from exc


def load_pretrained(policy: nn.Module, path: str, modules: list[str] | tuple[str, ...] = ()) -> None:
    """Start from another run's weights (e.g. a BC checkpoint): every tensor of that checkpoint must fit;
    modules the RL mode adds (a noise head) and a value head built for other inputs (an asymmetric critic on
    a BC run's) keep their initialization; the frozen reference is the loaded net.
    `modules` (`policy.init_modules`, dotted names such as `backbone.vision`) takes only those submodules
    and leaves the rest as built, as pi0 starts a new action expert on a pretrained backbone."""
    from roborl.checkpoint import Checkpoint, state_dict_mismatch

    if not Path(path).exists():
        raise UserError(f"policy.init '{path}' does not exist: train it first (the config's header names the "
                        "`roborl bc` or `roborl train` run that writes it), or point policy.init at a checkpoint")
    ckpt = Checkpoint(path)
    state = {k: v for k, v in ckpt.policy_state.items() if not k.startswith("reference.")}
    prefixes = tuple(f"{m}." for m in modules)
    own = policy.state_dict()
    if prefixes:
        absent = [m for m in modules if not all(any(k.startswith(f"{m}.") for k in keys) for keys in (own, state))]
        if absent:
            raise UserError(f"policy.init_modules {absent} are not modules of both this policy and '{path}'; "
                            f"this policy has {sorted({k.split('.')[0] for k in own})}")
        state = {k: v for k, v in state.items() if k.startswith(prefixes)}
    critic_differs = any(k.startswith("critic.") and k in own and own[k].shape != v.shape for k, v in state.items())
    if critic_differs:  # PPO's critic warm-up trains the fresh one
        state = {k: v for k, v in state.items() if not k.startswith("critic.")}
    try:
        missing, unexpected = policy.load_state_dict(state, strict=False)
    except RuntimeError as exc:
        raise UserError(f"policy.init '{path}' does not fit this policy: {state_dict_mismatch(exc)}; give policy the "
                        "kind and sizes it was trained with") from exc
    fresh = ("reference.", "noise_head.") + (("critic.",) if critic_differs else ())
    missing = [k for k in missing if not k.startswith(fresh) and (not prefixes or k.startswith(prefixes))]
    if missing or unexpected:
        raise UserError(f"policy.init '{path}' does not fit this policy (missing {missing[:3]}, unexpected "
                        f"{unexpected[:3]}); give policy the same kind, horizon, denoiser, hidden sizes and "
                        f"policy.vla settings as the BC run")
    policy.start_finetuning()


def build(cfg: Config, device: torch.device, env: sim.VecEnv | None = None) -> tuple[sim.VecEnv, nn.Module]:
    """The run's envs (`env`, or `env.num_envs` of them made here) and a new policy that fits them."""
    env = env or make_run_env(cfg, cfg.env.num_envs, cfg.train.seed, device)
    return env, make_run_policy(cfg, env).to(device)


def make_run_policy(cfg: Config, env: sim.VecEnv) -> nn.Module:
    """A new policy of the run's config for `env` (the learner's, and each Ray env worker's copy)."""
    policy = make_policy(cfg.policy, env, cfg.env.action_chunk, cfg.residual, state_std=cfg.train.algorithm == "sac",
                         cost_critic=cfg.algo.cost_limit is not None)
    hierarchy = find_wrapper(env, HierarchyEnv)
    if hierarchy is not None and hierarchy.calls.count:
        rm = cfg.env.rm
        policy.call_chooser = CallChooser(env.observation_space["state"].shape[0], hierarchy.calls.count,
                                          epsilon=rm.choice_epsilon)
        hierarchy.use_chooser(policy.call_chooser, CallLearner(policy.call_chooser, env.num_envs, rm.choice_gamma,
                                                               rm.choice_lr))
    return policy


def refuse_spread_choices(cfg: Config) -> None:
    """The calls of a hierarchy's choice states are learned in the one process that steps the envs."""
    rm, r = cfg.env.rm, cfg.resources
    if rm.learner != "options" or not (rm.machine or rm.ltlf) or not (r.env_workers or r.learners > 1):
        return
    try:
        machine = load_hierarchy(rm.machine, rm.ltlf, split=True)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    if isinstance(machine, Hierarchy) and machine.choices:
        raise UserError(f"{rm.machine or rm.ltlf} has choice states, whose calls are learned in the process that steps the "
                        "envs: leave resources.env_workers at 0 and resources.learners at 1")


def use_call_chooser(env: sim.VecEnv, policy: nn.Module) -> None:
    """Another env (evaluation) chooses the calls of its hierarchy's choice states with the policy's chooser."""
    hierarchy = find_wrapper(env, HierarchyEnv)
    if hierarchy is not None and hasattr(policy, "call_chooser"):
        hierarchy.use_chooser(policy.call_chooser)
