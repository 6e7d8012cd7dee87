"""LangTabletop: language-conditioned multi-task manipulation in one scene (a red and a blue cube, three
coloured balls). Each env samples a task and an instruction at reset (tasks/language.py):

- reach: move the gripper to the named ball (green, yellow or purple; the balls are drawn only in reach
  episodes);
- push: slide the named cube 10 cm forward, backward, left or right (robot frame) along the table;
- lift: grasp the named cube and raise it 6 cm;
- stack: put the named cube on the other one and let go.

Observations: `rgb` (N×H×W×3 uint8, 64×64 by default), `state` (proprioception only: joints, joint
velocities, gripper, TCP; the objects are seen only in the image), `instruction` (N strings) and
`task_id` (N, index into `TASK_NAMES`). `privileged_state=True` appends the objects and the goal to
`state` (debugging, state-only baselines; the default with `obs_mode="state"`, where there is no image);
`critic_state=True` gives them as `critic_state` instead, for an asymmetric critic (the policy never sees them).

Layouts: by default the cubes and balls are placed anywhere in their ranges, so the policy must find them
in the image. With `layout_jitter=J` (the `mujoco/LangTabletopFixed-*` ids, J = 2 cm) every object has its
own place, moved by up to ±J per axis at each reset, as LIBERO's initial states are: the instruction says
which object and what to do, and the image refines where it is. A tiny flow VLA trained from scratch on a
CPU learns this in minutes; the random layout needs a pretrained vision encoder.
"""
from __future__ import annotations

import torch

from roborl.sim.errors import SimError
from roborl.sim.registry import register
from roborl.sim.vec_env import Obs
from roborl.tasks.arm import CUBE_HALF, ArmEnv
from roborl.tasks.cube import Cube
from roborl.tasks.language import DIRECTION_XY, DIRECTIONS, MAX_WORDS, TARGET_COLORS, TARGET_RGBA, TASK_NAMES, TEMPLATES
from roborl.tasks.language import instructions as make_instructions
from roborl.tasks.push import CubePushing
from roborl.tasks.stack import stacking_reward

CUBE_LOW, CUBE_HIGH = [0.45, -0.12], [0.6, 0.12]
BALL_LOW, BALL_HIGH = [0.4, -0.25, 0.08], [0.7, 0.25, 0.3]
PUSH_DIST = 0.1
LIFT_HEIGHT = 0.06  # metres the lifted cube's centre rises above its resting height
SUCCESS_DIST = 0.03
MIN_SEPARATION = 0.08  # between the cubes, and between the other cube and a push's path
HIDDEN = (0.35, 0.0, -0.3)  # under the table top: where the balls wait outside reach episodes
# the fixed layout (`layout_jitter`): each object at its own place, moved by up to ± the jitter per axis
LAYOUT_CUBES = ((0.52, -0.11), (0.52, 0.11))  # red, blue
LAYOUT_BALLS = ((0.48, -0.18, 0.12), (0.62, 0.0, 0.22), (0.48, 0.18, 0.12))  # green, yellow, purple
TEMPLATE_COUNTS = torch.tensor([len(TEMPLATES[t]) for t in TASK_NAMES])
REACH, PUSH, LIFT, STACK = (TASK_NAMES.index(t) for t in ("reach", "push", "lift", "stack"))


class InstructedCube:
    """The cube an instruction names (or, with `other`, the other one), per env (`Cube`'s pos and quat).
    `color` is the env's live tensor (0 red, 1 blue), rewritten at every reset."""

    def __init__(self, cubes: tuple[Cube, Cube], color: torch.Tensor, other: bool = False) -> None:
        self.cubes, self.color, self.other = cubes, color, other

    def _pick(self, red: torch.Tensor, blue: torch.Tensor) -> torch.Tensor:
        return torch.where((self.color[:, None] == 0) != self.other, red, blue)

    @property
    def pos(self) -> torch.Tensor:
        return self._pick(self.cubes[0].pos, self.cubes[1].pos)

    @property
    def quat(self) -> torch.Tensor:
        return self._pick(self.cubes[0].quat, self.cubes[1].quat)


def segment_distance(p: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance of points p from segments a-b (rows, any dim)."""
    ab = b - a
    t = ((p - a) * ab).sum(-1, keepdim=True) / (ab * ab).sum(-1, keepdim=True).clamp(min=1e-12)
    return (a + t.clamp(0, 1) * ab - p).norm(dim=-1)


class LangTabletopEnv(CubePushing, ArmEnv):
    scene = "multitask_tabletop.xml"  # two cubes of equal mass
    episode_length = 100
    label_names = ("success", "grasped", "touching")

    def __init__(self, num_envs: int = 1, *, tasks: tuple[str, ...] | list[str] | str | None = None,
                 privileged_state: bool | None = None, obs_mode: str = "rgb",
                 render_size: tuple[int, int] = (64, 64), layout_jitter: float | None = None, **kwargs) -> None:
        names = tuple(tasks.split(",")) if isinstance(tasks, str) else tuple(tasks or TASK_NAMES)
        unknown = [t for t in names if t not in TASK_NAMES]
        if unknown or not names:
            raise SimError(f"unknown LangTabletop tasks {unknown or names}; available: {', '.join(TASK_NAMES)}")
        self.task_names = names
        self.active = torch.tensor([TASK_NAMES.index(t) for t in names])
        self.task_cdf: torch.Tensor | None = None  # set_task_weights; None: every task equally often
        self.privileged = obs_mode == "state" if privileged_state is None else privileged_state
        self.layout_jitter = layout_jitter
        kwargs.setdefault("camera", "workspace")  # high and close: the cubes and balls are seen beside the gripper
        super().__init__(num_envs, obs_mode=obs_mode, render_size=render_size, **kwargs)

    def _setup(self) -> None:
        super()._setup()
        n = self.num_envs
        self.cubes = (Cube(self, "red_cube"), Cube(self, "blue_cube"))
        self.task_id = torch.zeros(n, dtype=torch.long)
        self.color = torch.zeros(n, dtype=torch.long)  # the instructed cube (0 red, 1 blue)
        self.target = torch.zeros(n, dtype=torch.long)  # the instructed ball
        self.direction = torch.zeros(n, dtype=torch.long)
        self.balls = torch.zeros(n, 3, 3, dtype=torch.float64)
        self.start = torch.zeros(n, 3, dtype=torch.float64)  # the instructed cube's initial position
        self.instructions = [""] * n
        self._goal_cache: tuple[int, torch.Tensor] | None = None  # keyed on state_version, like the kinematics
        self.cube = InstructedCube(self.cubes, self.color)
        self.other = InstructedCube(self.cubes, self.color, other=True)

    # ---- episode sampling -----------------------------------------------------------------------
    def set_task_weights(self, weights: dict[str, float]) -> None:
        """Sample each task at reset in proportion to its weight (a task not named weighs 1), e.g.
        {"push": 2}: push in half the episodes of ReachPushLift. Multi-task RL spends its samples where the
        policy is weakest this way ("hard tasks first"); an empty dict restores uniform sampling."""
        unknown = sorted(set(weights) - set(self.task_names))
        if unknown:
            raise SimError(f"task weights name {unknown}, which this env does not sample; its tasks: "
                           f"{', '.join(self.task_names)}")
        w = torch.tensor([float(weights.get(t, 1.0)) for t in self.task_names], dtype=torch.float64)
        if not torch.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
            raise SimError(f"task weights must be finite, ≥ 0 and not all 0, got {dict(weights)}")
        cdf = w.cumsum(0) / w.sum()
        cdf[-1] = 1.0  # exactly: a uniform draw in [0, 1) never falls past the last task
        self.task_cdf = cdf if weights else None

    def _sample_tasks(self, n: int) -> torch.Tensor:
        """One draw per row, so group resets give each member its group's task."""
        g = self.generator
        if self.task_cdf is None:
            return self.active[torch.randint(len(self.active), (n,), generator=g)]
        u = torch.rand(n, generator=g, dtype=torch.float64)
        return self.active[torch.searchsorted(self.task_cdf, u, right=True)]

    def _reset_idx(self, ids: torch.Tensor) -> None:
        """Draws the same number of samples per row whatever the task (group resets rely on it)."""
        n, g = len(ids), self.generator
        self._reset_arm(ids)
        task = self._sample_tasks(n)
        template = (torch.rand(n, generator=g) * TEMPLATE_COUNTS[task]).long()
        color, target = torch.randint(2, (n,), generator=g), torch.randint(len(TARGET_COLORS), (n,), generator=g)
        direction, word = torch.randint(len(DIRECTIONS), (n,), generator=g), torch.randint(MAX_WORDS, (n,), generator=g)
        if self.layout_jitter is None:
            a, b, balls = self._random_layout(n, direction)
        else:
            a, b, balls = self._fixed_layout(n, color)
        red = torch.where(color[:, None] == 0, a, b)
        blue = torch.where(color[:, None] == 0, b, a)
        self.cubes[0].place(ids, red)
        self.cubes[1].place(ids, blue)
        self.task_id[ids], self.color[ids], self.target[ids], self.direction[ids] = task, color, target, direction
        self.balls[ids] = torch.where((task == REACH)[:, None, None], balls, torch.tensor(HIDDEN, dtype=torch.float64))
        self.start[ids, :2], self.start[ids, 2] = a, CUBE_HALF
        for i, text in zip(ids.tolist(), make_instructions(task, template, color, target, direction, word)):
            self.instructions[i] = text

    def _random_layout(self, n: int, direction: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The instructed cube's xy, the other's, and the three balls (n×3×3), anywhere in their ranges."""
        push = torch.tensor(DIRECTION_XY, dtype=torch.float64)[direction] * PUSH_DIST
        a = self.uniform(n, CUBE_LOW, CUBE_HIGH)
        b = self.uniform(n, CUBE_LOW, CUBE_HIGH)
        for _ in range(50):  # the other cube neither touches the instructed one nor blocks its push
            bad = ((a - b).norm(dim=-1) < MIN_SEPARATION) | (segment_distance(b, a, a + push) < MIN_SEPARATION)
            if not bad.any():
                break
            b[bad] = self.uniform(int(bad.sum()), CUBE_LOW, CUBE_HIGH)
        balls = self.uniform(n * 3, BALL_LOW, BALL_HIGH).view(n, 3, 3)
        for _ in range(50):
            gaps = torch.cdist(balls, balls) + torch.eye(3, dtype=balls.dtype) * 1e3
            close = gaps.min(-1).values < MIN_SEPARATION
            if not close.any():
                break
            balls[close] = self.uniform(int(close.sum()), BALL_LOW, BALL_HIGH)
        return a, b, balls

    def _fixed_layout(self, n: int, color: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The same, each object at its own place plus up to ±layout_jitter per axis."""
        j = self.layout_jitter
        cubes = torch.tensor(LAYOUT_CUBES, dtype=torch.float64)
        jitter = self.uniform(n * 2, [-j, -j], [j, j]).view(n, 2, 2)
        a, b = cubes[color] + jitter[:, 0], cubes[1 - color] + jitter[:, 1]
        balls = torch.tensor(LAYOUT_BALLS, dtype=torch.float64) + self.uniform(n * 3, [-j] * 3, [j] * 3).view(n, 3, 3)
        return a, b, balls

    # ---- what the task asks for ------------------------------------------------------------------
    @property
    def stack_target(self) -> torch.Tensor:
        return self.other.pos + torch.tensor([0, 0, 2 * CUBE_HALF], dtype=torch.float64)

    @property
    def goal(self) -> torch.Tensor:
        """Per env: the ball (reach), the cube's push goal (push) or lift goal (lift), the top of the other
        cube (stack)."""
        if self._goal_cache is not None and self._goal_cache[0] == self.state_version:
            return self._goal_cache[1]
        rows = torch.arange(self.num_envs)
        push = self.start.clone()
        push[:, :2] += torch.tensor(DIRECTION_XY, dtype=torch.float64)[self.direction] * PUSH_DIST
        lift = self.start + torch.tensor([0, 0, LIFT_HEIGHT + 0.01], dtype=torch.float64)
        goals = torch.stack([self.balls[rows, self.target], push, lift, self.stack_target], 0)
        self._goal_cache = (self.state_version, goals[self.task_id, rows])
        return self._goal_cache[1]

    def _state_obs(self) -> torch.Tensor:
        arm = self._arm_obs()
        return torch.cat([arm, self._critic_state_obs()], -1) if self.privileged else arm

    def _critic_state_obs(self) -> torch.Tensor:
        """The goal, the instructed cube, the other cube (and their offsets from the gripper) and the task."""
        goal, c = self.goal, self.cube.pos
        onehot = torch.nn.functional.one_hot(self.task_id, len(TASK_NAMES)).double()
        return torch.cat([goal, goal - self.tcp, c, c - self.tcp, self.other.pos, onehot], -1)

    def _obs(self, frames: bool = True) -> Obs:
        obs = super()._obs(frames)
        obs["instruction"] = list(self.instructions)
        obs["task_id"] = self.task_id.clone().to(self.device)
        return obs

    def _evaluate(self) -> dict[str, torch.Tensor]:
        c, tcp, goal, task = self.cube.pos, self.tcp, self.goal, self.task_id
        grasped = self.is_grasping(c)
        g = grasped.double()
        reach = (c - tcp).norm(dim=-1)
        to_goal = (goal - c).norm(dim=-1)
        off_table = torch.stack([cube.pos[:, 2] for cube in self.cubes], -1).min(-1).values < -0.05
        # reach
        d_ball = (goal - tcp).norm(dim=-1)
        reach_ok = d_ball < SUCCESS_DIST
        reach_r = (1 - torch.tanh(5 * d_ball) + reach_ok.double()) / 2
        # push
        to_xy = (goal[:, :2] - c[:, :2]).norm(dim=-1)
        push_ok = (to_xy < SUCCESS_DIST) & ~off_table
        push_r = ((1 - torch.tanh(5 * (self.push_pose() - tcp).norm(dim=-1))) + 2 * (1 - torch.tanh(5 * to_xy))
                  + 3 * push_ok.double()) / 6
        # lift
        lift_ok = grasped & (c[:, 2] > CUBE_HALF + LIFT_HEIGHT)
        lift_r = (1 - torch.tanh(5 * reach) + g + g * (1 - torch.tanh(5 * to_goal)) + 2 * lift_ok.double()) / 5
        # stack
        stack_r, stack_ok = stacking_reward(c, goal, tcp, grasped, self.gripper_gap)
        rows = torch.arange(self.num_envs)
        success = torch.stack([reach_ok, push_ok, lift_ok, stack_ok], 0)[task, rows]
        reward = torch.stack([reach_r, push_r, lift_r, stack_r], 0)[task, rows]
        touching = reach < CUBE_HALF + 0.03
        labels = torch.stack([success, grasped, touching], -1)
        return {"reward": reward, "success": success, "labels": labels, "terminated": off_table}

    def _markers(self):
        return [(self.balls[:, i], TARGET_RGBA[i], 0.025) for i in range(len(TARGET_COLORS))]


FIXED_JITTER = 0.02  # metres, per axis, of the LangTabletopFixed ids
LANG_TABLETOP_IDS: list[str] = []  # every registered LangTabletop id (the scripted expert drives them all)


def register_variants(prefix: str, jitter: float | None) -> None:
    """`mujoco/<prefix>` (all tasks), one id per task (e.g. `-Push`: a config cannot pass `tasks=`) and
    `-ReachPushLift` (the three tasks the VLA configs learn; stack is much harder)."""
    variants = {"": TASK_NAMES, **{f"-{t.capitalize()}": (t,) for t in TASK_NAMES},
                "-ReachPushLift": ("reach", "push", "lift")}
    for suffix, names in variants.items():
        LANG_TABLETOP_IDS.append(f"mujoco/{prefix}{suffix}")
        register(LANG_TABLETOP_IDS[-1])(
            lambda num_envs=1, _tasks=names, **kwargs: LangTabletopEnv(
                num_envs, **{"tasks": _tasks, "layout_jitter": jitter, **kwargs}))


register_variants("LangTabletop", None)
register_variants("LangTabletopFixed", FIXED_JITTER)
