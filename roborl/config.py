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

from roborl.config_rules import check_choices, check_value, param
from roborl.errors import UserError
from roborl.policies.activations import ACTIVATIONS
from roborl.policies.configuration_diffusion import DPPOConfig
from roborl.policies.configuration_flow import FlowNoiseConfig, FlowSDEConfig, FPOConfig
from roborl.policies.configuration_pi0 import Pi0Spec
from roborl.policies.lerobot.configuration import LeRobotSpec
from roborl.policies.vla.spec import VLASpec
from roborl.sim.randomization import Randomization


@dataclass
class RMConfig:
    machine: str | None = None  # a reward-machine file (tasks/*.rm) or module:function returning one
    # or an LTLf formula over the task's labels, e.g. "F(at_a & X F(at_b))"; with learner options it is split into
    # a hierarchy of its sub-formulas (roborl/rm/ltlf_split.py)
    ltlf: str | None = None
    reward: str = param("replace", choices=("replace", "add"))  # replace the task's reward by the machine's, or add them
    # potential-based shaping with Φ = V_RM and this γ (= algo.gamma); None: off
    shaping_gamma: float | None = param(None, ge=0, le=1)
    # how a hierarchy of machines is learned: flat (one policy on its flat machine) | options (one option per
    # callable machine, each trained on its own reward and ended at its return; roborl/rm/hierarchy_env.py)
    learner: str = param("flat", choices=("flat", "options"))
    # options learner, a hierarchy's choice states (several calls): calls are chosen by a Q-network learned by SMDP
    # Q-learning (roborl/rm/call_learning.py); this share of them at random in training
    choice_epsilon: float = param(0.1, ge=0, le=1)
    choice_gamma: float = param(0.97, gt=0, le=1)  # the call learner's discount per env step
    choice_lr: float = param(1.0e-3, gt=0)  # the call learner's learning rate (Adam)


@dataclass
class ShieldConfig:
    workspace: list[float] = field(default_factory=list)  # [x0, y0, z0, x1, y1, z1]: box for the TCP target
    max_speed: float | None = param(None, gt=0)  # m/s of the commanded TCP motion (ee_delta_pos)
    action_rate: float | None = param(None, gt=0)  # max change of each action dimension per step
    joint_margin: float | None = param(None, ge=0)  # joint_delta_pos: keep joint targets this far (rad) inside the limits
    keep_out: list[list[float]] = field(default_factory=list)  # spheres [x, y, z, r] the TCP stays out of (CBF)
    # CBF gain: the share of its distance to a keep-out sphere the TCP may close per step
    cbf_alpha: float = param(0.5, gt=0, le=1)
    cbf_margin: float = param(0.02, ge=0)  # metres added to every keep-out radius
    automaton: str | None = None  # module:factory returning an AutomatonShield (e.g. roborl.shields.presets:pick_place_gripper)
    arm_gap: float | None = param(None, gt=0)  # two-arm tasks (mujoco/TwoArmReach): metres the two TCPs keep apart
    # composed: one assume-guarantee shield per arm, each on its own action | central: one shield on both arms' actions
    arm_gap_shield: str = param("composed", choices=("composed", "central"))
    penalty: float = param(0.0, ge=0)  # subtracted from the reward of a step where the shield intervened


@dataclass
class EnvConfig:
    id: str = "mujoco/Reach"  # the environment (`roborl envs` lists them): mujoco/*, gym/*, maniskill/*, libero/*, isaaclab/*
    num_envs: int = param(64, ge=1)  # environments stepped together as one batch
    controller: str = "ee_delta_pos"  # mujoco/ tasks: ee_delta_pos | joint_delta_pos | joint_pos (the action space)
    control_freq: int = param(20, ge=1)  # policy decisions per simulated second (Hz)
    episode_length: int | None = param(None, ge=1)  # None: the task's default
    obs_mode: str = "state"  # state | rgb (adds obs["rgb"], uint8 N×H×W×3 camera frames)
    render_size: list[int] = param(factory=lambda: [128, 128], ge=8)  # [height, width] of rgb observations and videos
    # physics of the mujoco/ tasks: mujoco (CPU threads) | warp (MuJoCo Warp, GPU)
    backend: str = param("mujoco", choices=("mujoco", "warp"))
    action_chunk: int = param(1, ge=1)  # K: one policy decision executes K actions of its chunk (sim/chunking.py)
    obs_history: int = param(1, ge=1)  # n: `state` holds the last n states of the episode (sim/history.py)
    # asymmetric actor-critic: the task's privileged state (objects, goal) as `critic_state`, which the value head
    # of a VLA, pi0, LeRobot or residual policy reads and the policy never does (embedded mujoco/ tasks that have it)
    critic_state: bool = False
    # embedded mujoco/ arm tasks: `state` is the arm's proprioception alone (joint positions and velocities, gripper
    # opening, TCP position), so objects and goals reach the policy through the camera only (env.obs_mode rgb), as
    # on a robot without a perception stack
    proprio_only: bool = False
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
class PolicyConfig:
    # gaussian | diffusion | flow | residual (a correction of `residual.base`) | token_vla | flow_vla (policies/vla)
    # | pi0 (transformers' PI0ForConditionalGeneration, policies/pi0.py) | lerobot (LeRobot's SmolVLA, ACT or
    # Diffusion Policy, policies/lerobot)
    kind: str = "gaussian"
    hidden: list[int] = param(factory=lambda: [256, 256], ge=1)  # widths of the actor's (or the network's) hidden layers
    activation: str = param("tanh", choices=tuple(ACTIVATIONS))  # of the hidden layers
    init_log_std: float = -0.5  # gaussian: the log standard deviation of the actions at the start (learned)
    normalize_obs: bool = True  # standardize state observations by running mean and std (saved with the checkpoint)
    # gaussian on a multi-agent env (mujoco/TwoArmReach): joint (one actor on the whole state) | per_agent (one actor
    # per agent on its own observation, the critic on the whole state: MAPPO); with env.rm.learner options:
    # per_machine (one actor per machine of the hierarchy, the critic shared)
    actors: str = param("joint", choices=("joint", "per_agent", "per_machine"))
    init: str | None = None  # start from this checkpoint's weights (a BC policy, for RL fine-tuning)
    # take only these submodules from `init` (e.g. [backbone]: a VLA's pretrained backbone, a new expert)
    init_modules: list[str] = field(default_factory=list)
    horizon: int = param(1, ge=1)  # H: actions predicted per decision (diffusion / flow); env.action_chunk of them run
    denoiser: str = param("mlp", choices=("mlp", "unet"))  # mlp | unet (diffusion / flow network)
    critic_hidden: list[int] = param(factory=lambda: [256, 256], ge=1)  # widths of the value network's hidden layers
    steps: int = param(10, ge=1)  # denoising steps (diffusion, DDIM) or Euler steps (flow) per action
    train_timesteps: int = param(100, ge=1)  # DDPM training timesteps (diffusion)
    eta: float = param(1.0, ge=0)  # DDIM η (diffusion); > 0 keeps sampling stochastic
    # diffusion: dppo; flow: flow_noise | flow_sde | fpo; lerobot: flow_noise | flow_sde (SmolVLA), dppo (Diffusion Policy)
    rl_mode: str | None = None
    dppo: DPPOConfig = field(default_factory=DPPOConfig)
    flow_noise: FlowNoiseConfig = field(default_factory=FlowNoiseConfig)
    flow_sde: FlowSDEConfig = field(default_factory=FlowSDEConfig)
    fpo: FPOConfig = field(default_factory=FPOConfig)
    vla: VLASpec = field(default_factory=VLASpec)  # token_vla / flow_vla: backbone, fine-tuning, heads
    pi0: Pi0Spec = field(default_factory=Pi0Spec)  # pi0: the checkpoint (or tiny sizes), fine-tuning, heads
    lerobot: LeRobotSpec = field(default_factory=LeRobotSpec)  # lerobot: the policy directory (or type and sizes), heads


    def __post_init__(self) -> None:
        if self.init_modules and not self.init:
            raise UserError(f"policy.init_modules {self.init_modules} takes parts of policy.init, which is unset: "
                            "set policy.init to a checkpoint (or leave policy.init_modules empty)")

@dataclass
class PPOConfig:
    lr: float = param(3e-4, gt=0)  # Adam learning rate
    gamma: float = param(0.8, ge=0, le=1)  # discount per policy decision
    gae_lambda: float = param(0.9, ge=0, le=1)  # GAE λ: 0 is one-step TD, 1 is Monte Carlo
    clip: float = param(0.2, gt=0, lt=1)  # the probability ratio is clipped to [1 − clip, 1 + clip]
    # the ratio's upper clip range, 1 + clip_high (None: algo.clip); DAPO's clip-higher
    clip_high: float | None = param(None, gt=0)
    # the policy loss: "clip" (PPO) or "asymmetric" (PPO's clip where A > 0, SPO's penalty where A < 0: FPO++)
    surrogate: str = param("clip", choices=("clip", "asymmetric"))
    # G > 1: each iteration starts groups of G envs from one state; advantages centered per group
    group_size: int = param(1, ge=1)
    epochs: int = param(4, ge=1)  # passes over each rollout per update
    minibatches: int = param(4, ge=1)  # minibatches each epoch splits the rollout into
    ent_coef: float = param(0.0, ge=0)  # weight of the entropy bonus
    vf_coef: float = param(0.5, ge=0)  # weight of the value loss
    max_grad_norm: float = param(0.5, gt=0)  # gradients are clipped to this global norm
    clip_value_loss: bool = True  # clip the value update around the rollout's values (range: algo.value_clip)
    norm_adv: bool = True  # standardize advantages per minibatch
    norm_adv_by_task: bool = False  # standardize each task's advantages (obs["task_id"]) over the rollout
    target_kl: float | None = param(None, gt=0)  # stop the epochs early once the approximate KL exceeds this
    adaptive_lr: bool = False  # rsl_rl's schedule: lr ÷1.5 when KL > 2·desired_kl, ×1.5 when < ½·desired_kl
    desired_kl: float = param(0.01, gt=0)  # the KL that algo.adaptive_lr steers toward
    anneal_lr: bool = False  # decay the policy's lr linearly to 0 over train.total_steps (CleanRL)
    critic_lr: float | None = param(None, gt=0)  # a learning rate of the critic's own (None: algo.lr for everything)
    # a VLA backbone's own learning rate (None: algo.lr), e.g. slow under a fast expert
    backbone_lr: float | None = param(None, gt=0)
    value_clip: float | None = param(None, gt=0)  # clip range of the value loss (None: algo.clip)
    critic_warmup: int = param(0, ge=0)  # iterations that fit only the critic before the policy moves
    bc_coef: float = param(0.0, ge=0)  # weight of the pull toward the pretrained policy (diffusion / flow)
    cost_limit: float | None = param(None, ge=0)  # PPO-Lagrangian: keep the mean episode cost (info["cost"]) under this
    lagrange_ki: float = param(0.01, ge=0)  # PID-Lagrangian gains on (episode cost − cost_limit); ki alone = gradient ascent on λ
    lagrange_kp: float = param(0.0, ge=0)  # PID-Lagrangian: proportional gain
    lagrange_kd: float = param(0.0, ge=0)  # PID-Lagrangian: derivative gain



@dataclass
class SACConfig:
    lr: float = param(3e-4, gt=0)  # actor and critics
    gamma: float = param(0.9, ge=0, le=1)  # discount per policy decision
    tau: float = param(0.005, gt=0, le=1)  # Polyak rate of the target critics
    batch_size: int = param(256, ge=1)  # transitions per gradient update
    buffer_size: int = param(1_000_000, ge=1)  # transitions, kept on train.device
    utd_ratio: float = param(0.5, gt=0)  # gradient updates per environment transition (N envs step → round(N·utd) updates)
    seed_steps: int = param(10000, ge=0)  # env steps of base-policy rollouts (no residual) before the first update
    # Policy Decorator: the residual is on per episode with prob min(t/H, 1); 0: always on
    progressive_steps: int = param(0, ge=0)
    init_alpha: float = param(0.1, gt=0)  # entropy temperature, learned toward target_entropy
    target_entropy: float | None = None  # None: −action_dim
    critic_hidden: list[int] = param(factory=lambda: [256, 256], ge=1)  # widths of each Q network's hidden layers
    critic_layer_norm: bool = False  # LayerNorm in the Q networks' hidden layers (RLPD's critics)
    actor_delay: int = param(1, ge=1)  # critic updates per actor update
    crm: bool = False  # with env.rm: store each transition as seen from every machine state (CRM)
    # RLPD (Ball et al. 2023): demonstrations (a `roborl demos` directory) and the operator's interventions go to a
    # buffer of their own, sampled for sac.offline_fraction of every batch
    demos: str = ""
    demo_episodes: int | None = param(None, ge=1)  # use only the first N demonstrations
    offline_fraction: float = param(0.5, ge=0, le=1)  # of every batch from that buffer (all online while it is empty)


GRPO_REWARDS = ("success", "success_at_end", "return", "return_to_go")
GRPO_LOSS_AGG = ("token_mean", "seq_mean_token_mean")


@dataclass
class GRPOConfig:
    """Critic-free group-relative PPO (roborl/grpo.py); optimizer, epochs and minibatches come from `algo`."""
    group_size: int = param(8, ge=2)  # G: consecutive envs started from one initial state (env.num_envs must be a multiple)
    # episode outcome: success (at any step) | success_at_end | return | return_to_go (each step's return from
    # there on, against the group's at that step; roborl/algos/grpo.py)
    reward: str = param("success", choices=GRPO_REWARDS)
    std_normalize: bool = True  # A = (R − mean) / (std + eps) per group; false: Dr.GRPO's A = R − mean
    eps: float = param(1.0e-6, ge=0)  # added to the group's std before dividing
    clip_low: float = param(0.2, gt=0, lt=1)  # ratio clipped to [1 − clip_low, 1 + clip_high] (DAPO's clip-higher)
    clip_high: float = param(0.28, gt=0)  # upper clip range (see grpo.clip_low)
    dynamic_sampling: bool = True  # drop groups whose rewards all agree (zero variance, no signal; DAPO)
    resample_rounds: int = param(0, ge=0)  # extra rollout rounds that refill the batch with groups that have signal (DAPO)
    # token_mean: every step weighs alike (DAPO) | seq_mean_token_mean: every episode
    loss_agg: str = param("token_mean", choices=GRPO_LOSS_AGG)



@dataclass
class ResidualConfig:
    # expert | a checkpoint path (.safetensors) | a LeRobot policy directory (ACT, Diffusion Policy, SmolVLA)
    # | module:factory (factory(env) -> callable)
    base: str | None = None
    base_noise: float = param(0.0, ge=0)  # expert only: std of Gaussian noise on its normalized actions
    base_bias: list[float] = field(default_factory=list)  # expert only: constant offset of its actions
    scale: float = param(0.1, gt=0)  # action = base + scale·tanh(residual)
    inputs: str = param("obs+base", choices=("obs+base", "obs"))  # what the residual sees: obs+base | obs


@dataclass
class BCConfig:
    demos: str = ""  # a directory written by `roborl demos` or its demos.hdf5
    max_episodes: int | None = param(None, ge=1)  # use only the first N (successful) episodes
    success_only: bool = True  # train on successful demonstrations only
    steps: int = param(20000, ge=1)  # gradient steps
    batch_size: int = param(256, ge=1)  # samples per gradient step
    lr: float = param(1.0e-3, gt=0)  # AdamW learning rate
    weight_decay: float = param(1.0e-6, ge=0)  # AdamW weight decay
    eval_every: int = param(2000, ge=1)  # gradient steps


@dataclass
class TrainConfig:
    algorithm: str = "ppo"  # ppo (on-policy, section `algo`) | sac (off-policy, section `sac`) | grpo (`grpo`, `algo`)
    total_steps: int = param(1_000_000, ge=1)  # env steps (control steps of all envs) the run trains for
    rollout_steps: int = param(50, ge=1)  # steps of every env per iteration (PPO, GRPO: the rollout length)
    eval_every: int = param(10, ge=1)  # iterations
    eval_episodes: int = param(32, ge=1)  # deterministic episodes per evaluation
    eval_envs: int = param(32, ge=1)  # environments the evaluation runs in parallel
    video: bool = True  # write videos/eval_<steps>.mp4 with each evaluation
    video_envs: int = param(4, ge=1)  # eval envs shown side by side in the video
    save_every: int = param(10, ge=1)  # iterations
    seed: int = param(0, ge=0)  # seeds torch, the envs' initial states and the evaluation
    device: str = "auto"  # auto (cuda when available) | cpu | cuda | cuda:N: where the networks run
    threads: int | None = param(None, ge=1)  # torch CPU threads (None: half the cores)
    # torch CPU threads during the update, while this process's simulator is idle (None: the cores shared among
    # the learners, or train.threads where Ray env workers step the envs meanwhile)
    update_threads: int | None = param(None, ge=1)
    run_dir: str = "runs"  # runs are written to run_dir/name/
    name: str | None = None  # the run's directory name (None: the env id and the start time)
    resume: str | None = None  # a checkpoint to continue from (or `resume=PATH` on the command line)
    progress: bool = True  # show a progress bar
    max_minutes: float | None = param(None, gt=0)  # stop (and save) once the run's wall time, across resumes, passes this
    eval_at_start: bool = True  # evaluate a pretrained policy (policy.init) before the first update
    # which evaluation keeps best.safetensors: success (rate) | return (mean) | auto: success where the env
    # reports it, else return (Gymnasium envs without `is_success`)
    best_metric: str = param("auto", choices=("auto", "success", "return"))
    stop_at_success: float | None = param(None, ge=0, le=1)  # end the run once deterministic eval success reaches this

SEED_STRIDE = 100_000  # learner r seeds with train.seed + r·SEED_STRIDE; Ray env worker i with + (i + 1)·SEED_STRIDE
DIST_BACKENDS = ("auto", "gloo", "nccl")  # torch.distributed backends of resources.backend
INFERENCE_PLACEMENTS = ("collocated", "learner")  # where rollout inference runs with Ray env workers


@dataclass
class ResourcesConfig:
    # processes, each stepping env.num_envs / learners envs; gradients averaged (roborl/learners.py)
    learners: int = param(1, ge=1)
    compile: bool = False  # torch.compile the policy's act in rollouts, GAE and the PPO loss (roborl/compiling.py)
    cuda_graphs: bool = False  # with compile on CUDA: rollout inference replayed as CUDA graphs (fixed shapes)
    # torch.distributed backend: auto (nccl on CUDA, gloo on CPU) | gloo | nccl
    backend: str = param("auto", choices=DIST_BACKENDS)
    # Ray env workers (roborl/ray_workers.py): 0 steps the envs in the learner's process
    env_workers: int = param(0, ge=0)  # Ray actors, each stepping env.num_envs / env_workers envs
    # collocated: each env worker acts with its copy of the policy | learner: the learner acts on every step's
    # gathered observations (disaggregated; one round trip per step)
    inference: str = param("collocated", choices=INFERENCE_PLACEMENTS)
    async_rollouts: bool = False  # workers collect the next rollouts while the learner updates (collocated only)
    max_staleness: int = param(1, ge=1)  # async: rollouts in flight per worker, so a rollout lags the learner by <= this
    is_clip: float = param(1.0, gt=0)  # async: truncation of the importance weight π_learner/π_behaviour (V-trace's ρ̄)
    device: str | None = None  # env workers' device (simulation, collocated inference); None: train.device
    worker_cpus: float = param(1.0, ge=0)  # Ray resources each env worker asks for (placement)
    worker_gpus: float = param(0.0, ge=0)  # GPUs (fractions allowed) each env worker asks Ray for
    # placement across a cluster: worker i prefers the node with custom resource worker_nodes[i % len] (soft:
    # a worker whose node is gone is replaced wherever Ray finds room), e.g. [head, node_b]
    worker_nodes: list[str] = field(default_factory=list)
    ray_address: str | None = None  # None: start a local Ray instance; "auto" or "host:port": join that cluster
    max_restarts: int = param(3, ge=0)  # env workers that may die and be replaced before the run fails
    # local: the envs step here (or in Ray env workers) | robot: an actor process steps a robot (the twin,
    # franky-sim or a real arm; section `robot`) and streams its transitions to this learner (roborl/robot/actor.py)
    actor: str = param("local", choices=("local", "robot"))

    def __post_init__(self) -> None:
        if self.cuda_graphs and not self.compile:
            raise UserError("resources.cuda_graphs replays compiled kernels: set resources.compile: true too")
        if self.async_rollouts and self.inference != "collocated":
            raise UserError("resources.async_rollouts needs resources.inference collocated (workers that act "
                            "with their own copy of the policy)")


ROBOT_KINDS = ("twin", "franka")


@dataclass
class RobotConfig:
    """Real-world RL (`resources.actor: robot`): the actor process, its robot and its episodes."""
    kind: str = param("twin", choices=ROBOT_KINDS)  # twin (roborl's MuJoCo twin) | franka (franky: a real arm or franky-sim)
    # twin: ws://HOST:PORT of a running twin (None: the actor starts one); franka: the arm's IP address
    address: str | None = None
    # the twin the actor starts: dynamics held fixed (sim.randomization fields), e.g. {object_mass: 1.5, latency_ms: 20}
    perturb: dict[str, float] = field(default_factory=dict)
    episode_steps: int | None = param(None, ge=1)  # control periods per episode (None: the task's episode length)
    # success: the robot's success flag (the twin's; ends the episode) | the directory of a reward classifier
    # (`roborl reward-classifier`), judging the camera frame after each step
    reward: str = "success"
    # none | module:factory returning judge(obs) -> bool: asked whether each success the reward classifier claims is
    # one; a veto goes on with the episode, and the classifier is refit on the verdicts (roborl/robot/judged_reward.py)
    judge: str = "none"
    corrections: str | None = None  # where the judged frames and the refit classifier go (None: RUN/reward_corrections)
    refit_steps: int = param(100, ge=1)  # Adam steps of each refit on the judged frames, between episodes
    # judged frames not yet learned from that start a refit (1: after every episode the judge was asked in); each
    # refit holds the robot between episodes for refit_steps steps, so fewer refits leave it more robot time
    refit_every: int = param(1, ge=1)
    # none | keyboard | gamepad | spacemouse (roborl/robot/teleop_devices.py) | module:factory: a scripted operator,
    # the factory returning its rule obs -> action or None (roborl/robot/teleop.py)
    operator: str = "none"
    # franka: the task on the cell, module:factory (roborl/robot/cell_tasks.py), e.g. roborl.robot.cell_tasks:Reach
    task: str | None = None
    learner: str = "127.0.0.1:0"  # HOST:PORT the learner listens on for its actor (port 0: a free one)
    spawn_actor: bool = True  # the learner starts the actor; false: start it where the robot is, `roborl actor HOST:PORT`
    seed: int = param(0, ge=0)  # reset seed of the first episode (the twin's initial states)
    # scripted: the robot's own reset before each episode (the twin's, FrankaRobot's home motion) | operator: the
    # actor also waits for the operator to reset the cell and press Enter (an actor started by hand)
    reset: str = param("scripted", choices=("scripted", "operator"))
    reconnect_s: float = param(300.0, gt=0)  # how long an actor that lost its learner keeps retrying before it stops


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
    robot: RobotConfig = field(default_factory=RobotConfig)

    def __post_init__(self) -> None:
        check_choices(self)  # keys the chosen algorithm and policy kind do not read
        check_relations(self)


def check_relations(cfg: Config) -> None:
    """The rules that tie keys of several sections together, each refused in one line."""
    e, t, r, a = cfg.env, cfg.train, cfg.resources, cfg.algo
    check_memory(cfg)
    per_iteration = e.num_envs * t.rollout_steps * e.action_chunk
    if t.algorithm != "bc" and per_iteration > t.total_steps:
        chunk = " × env.action_chunk" if e.action_chunk > 1 else ""
        raise UserError(f"train.total_steps ({t.total_steps}) is less than one iteration, env.num_envs × "
                        f"train.rollout_steps{chunk} = {per_iteration}: raise train.total_steps or lower the others")
    if a.cost_limit is not None and cfg.policy.kind != "gaussian":
        raise UserError("algo.cost_limit (PPO-Lagrangian) needs policy.kind gaussian (the policy with a cost critic)")
    if a.norm_adv_by_task and not a.norm_adv:
        raise UserError("algo.norm_adv_by_task standardizes PPO's advantages per task: it needs algo.norm_adv true")
    if t.algorithm == "ppo":
        rows = e.num_envs // r.learners * t.rollout_steps
        if a.minibatches > rows:
            raise UserError(f"algo.minibatches ({a.minibatches}) must be at most the rows of one rollout, env.num_envs "
                            f"× train.rollout_steps{' / resources.learners' if r.learners > 1 else ''} = {rows}")
    if e.rm.learner == "options" and t.algorithm not in ("ppo", "sac"):
        raise UserError(f"env.rm.learner options ends each option's return where its machine returns, which PPO's "
                        f"advantages and SAC's targets honour: set train.algorithm ppo or sac (not {t.algorithm}), "
                        "or env.rm.learner flat")
    if e.rm.learner == "options" and e.rm.shaping_gamma is not None:
        raise UserError("env.rm.shaping_gamma shapes a flat machine's reward; the option learner pays each machine's "
                        "own reward (its reward terms give dense progress): leave shaping_gamma unset")
    if cfg.sac.batch_size > cfg.sac.buffer_size:
        raise UserError(f"sac.batch_size ({cfg.sac.batch_size}) must be at most sac.buffer_size ({cfg.sac.buffer_size})")
    if cfg.policy.flow_noise.min_std > cfg.policy.flow_noise.max_std:
        raise UserError(f"policy.flow_noise.min_std ({cfg.policy.flow_noise.min_std}) must be at most "
                        f"policy.flow_noise.max_std ({cfg.policy.flow_noise.max_std})")
    if r.actor == "robot":
        if t.algorithm != "sac":
            raise UserError(f"resources.actor robot trains off-policy from the robot's stream: set train.algorithm "
                            f"sac (not {t.algorithm})")
        if cfg.robot.reset == "operator" and cfg.robot.spawn_actor:
            raise UserError("robot.reset operator waits for Enter in the actor's terminal: set robot.spawn_actor false "
                            "and start `roborl actor HOST:PORT` there")
        if e.num_envs != 1 or r.env_workers or r.learners > 1:
            raise UserError("resources.actor robot steps one robot: set env.num_envs 1, resources.env_workers 0 and "
                            "resources.learners 1")
        if e.rm.machine or e.rm.ltlf:
            raise UserError("resources.actor robot: the robot's actor runs no reward machine (its observations carry no "
                            "machine state, its rewards come from robot.reward); remove env.rm.machine and env.rm.ltlf")
        if cfg.robot.judge != "none" and cfg.robot.reward == "success":
            raise UserError("robot.judge checks the successes a reward classifier claims: set robot.reward to a "
                            "classifier's directory (`roborl reward-classifier`), or robot.judge none")
        if cfg.robot.judge != "none" and ":" not in cfg.robot.judge:
            raise UserError(f"robot.judge must be none or module:factory (e.g. roborl.robot.operators:success_flag_judge), "
                            f"not '{cfg.robot.judge}'")
    if r.env_workers:
        if e.num_envs % r.env_workers:
            raise UserError(f"env.num_envs ({e.num_envs}) must be divisible by resources.env_workers "
                            f"({r.env_workers}): each env worker steps an equal share of the envs")
        if t.algorithm == "bc":
            raise UserError("train.algorithm bc learns from demonstrations and steps no envs: resources.env_workers "
                            "has nothing to run (set it to 0)")
        if a.group_size > 1 and r.inference == "collocated":
            raise UserError("algo.group_size resets groups from the learner: with Ray env workers set "
                            "resources.inference=learner")
        if r.learners > 1:
            raise UserError("resources.env_workers and resources.learners > 1 cannot be combined yet; use one of them")
    if r.learners == 1:
        return
    if e.num_envs % r.learners:
        raise UserError(f"env.num_envs ({e.num_envs}) must be divisible by resources.learners ({r.learners}): "
                        "each learner steps an equal share of the envs")
    if t.algorithm == "grpo":
        raise UserError("resources.learners > 1 needs batches of one size on every learner, and GRPO's vary with "
                        "its episodes and dynamic sampling: spread GRPO's envs with resources.env_workers instead")
    if t.algorithm == "sac" and cfg.sac.batch_size % r.learners:
        raise UserError(f"sac.batch_size ({cfg.sac.batch_size}) must be divisible by resources.learners ({r.learners}): "
                        "each learner samples an equal share of every batch")


ENV_BYTES = 16 * 1024  # a lower bound on the memory of one simulated env (a small MuJoCo scene's MjData)
STEP_BYTES = 64  # a lower bound on one env's rollout row without images (a few floats)


def check_memory(cfg: Config) -> None:
    """Refuses env counts and buffers whose memory, estimated from below, exceeds what this machine has available
    now, before anything is allocated (a run that cannot fit would otherwise swap for minutes, or be killed for
    memory once its buffer fills)."""
    import psutil

    e, t = cfg.env, cfg.train
    image = 3 * e.render_size[0] * e.render_size[-1] if "rgb" in e.obs_mode else 0
    needed = e.num_envs * (ENV_BYTES + t.rollout_steps * (STEP_BYTES + image))
    if t.algorithm == "sac":
        # observation and next observation of each transition, in the online buffer and, where demonstrations or
        # a robot's interventions fill it, the demonstration buffer of the same size
        buffers = 2 if cfg.sac.demos or cfg.resources.actor == "robot" else 1
        needed += buffers * cfg.sac.buffer_size * 2 * (STEP_BYTES + image)
    available = psutil.virtual_memory().available
    if needed > available:
        replay = f", sac.buffer_size={cfg.sac.buffer_size}" if t.algorithm == "sac" else ""
        replay += f", {e.render_size[0]}×{e.render_size[-1]} rgb observations" if image else ""
        raise UserError(f"this run needs at least {needed / 2**30:.1f} GiB (env.num_envs={e.num_envs}, "
                        f"train.rollout_steps={t.rollout_steps}{replay}), more than the {available / 2**30:.1f} GiB "
                        "this machine has available: lower them")


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
    fields = {f.name: f for f in dataclasses.fields(cls)}
    names = list(fields)
    kwargs = {}
    for key, value in data.items():
        full = f"{path}.{key}" if path else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=3, cutoff=0.5)
            hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
            raise UserError(f"unknown config key '{full}'; {hint}valid keys here: {', '.join(names)}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, full)
        else:
            kwargs[key] = _check(value, tp, full)
            check_value(kwargs[key], fields[key].metadata, full)
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
        try:
            value = yaml.safe_load(raw) if raw else None
        except yaml.YAMLError as exc:
            raise UserError(f"override '{item}': the value is not valid YAML ({str(exc).splitlines()[0]})") from None
        _set_dotted(tree, key, value)
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
    train = extra.get("train")
    resume = train.get("resume") if isinstance(train, dict) else None
    if path is None and resume:
        from roborl.checkpoint import Checkpoint

        data = Checkpoint(resume).config
    if path is not None:
        data = read_config_file(Path(path))
        _check_sections(Config, data, "")  # before overrides merge into a section the file got wrong
    return config_from_dict(_merge(data, extra))


def _check_sections(cls: type, data: dict, path: str) -> None:
    """Every section of `data` (a key whose field is a dataclass) is a mapping, at every depth."""
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        if key in hints and dataclasses.is_dataclass(hints[key]):
            full = f"{path}.{key}" if path else str(key)
            if not isinstance(value, dict):
                raise UserError(f"config section '{full}' must be a mapping, got {value!r}")
            _check_sections(hints[key], value, full)


def read_config_file(path: Path) -> dict:
    """The mapping a YAML config file holds; anything else is refused in one line."""
    if path.is_dir():
        raise UserError(f"config file '{path}' is a directory; give a YAML file (see configs/ for examples)")
    if not path.is_file():
        raise UserError(f"config file '{path}' does not exist (see configs/ for examples)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"config file '{path}' is not UTF-8 text (a binary or compressed file?); give a YAML "
                        "file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(f"config file '{path}' is not valid YAML: {str(exc).splitlines()[0]}") from exc
    if data is None:
        raise UserError(f"config file '{path}' is empty; give at least the keys that differ from the defaults "
                        "(see configs/ppo_reach.yaml)")
    if not isinstance(data, dict):
        raise UserError(f"config file '{path}' must hold a mapping of sections (env:, train:, ...), not a "
                        f"{type(data).__name__}")
    return data


def config_from_dict(data: dict) -> Config:
    return _build(Config, data, "")


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)
