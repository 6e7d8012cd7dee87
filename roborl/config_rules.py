"""What a config value may be, declared beside the field it belongs to, and checked in one place.

A field declared with `param(default, ge=..., gt=..., le=..., lt=..., choices=...)` carries its rules in
its dataclass metadata (the lower layers, which may not import this module, write the same metadata with
`dataclasses.field(metadata={"ge": 1})`: the policies' own configuration modules, for example).
`check_value` applies them (every float must also be finite) and says in one line which key is wrong, its
value and what is allowed. Rules on a list apply to each of its items.

Choices that select what else a config may say (`train.algorithm`, `policy.kind`) are registered in
`ALGORITHM_READS` and `POLICY_READS`: a key that the chosen algorithm or policy kind does not read, set to
anything but its default, is refused, so an impossible combination cannot be written (rather than each one
being listed).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from roborl.errors import UserError

MISSING = dataclasses.MISSING


def param(default: Any = MISSING, *, factory: Any = None, ge: float | None = None, gt: float | None = None,
          le: float | None = None, lt: float | None = None, choices: tuple[str, ...] | None = None) -> Any:
    """A dataclass field with the rules its value must keep."""
    rules = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt), ("choices", choices)) if v is not None}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=rules)
    return dataclasses.field(default=default, metadata=rules)


def allowed(rules: dict) -> str:
    """The rules as words: 'in [0, 1]', '> 0', ..."""
    low = ("[", rules["ge"]) if "ge" in rules else ("(", rules["gt"]) if "gt" in rules else None
    high = ("]", rules["le"]) if "le" in rules else (")", rules["lt"]) if "lt" in rules else None
    if low and high:
        return f"in {low[0]}{low[1]:g}, {high[1]:g}{high[0]}"
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {low[1]:g}"
    return f"{'<=' if high[0] == ']' else '<'} {high[1]:g}"


def check_value(value: Any, rules: dict, path: str) -> None:
    """Refuses `value` of config key `path` in one line where it breaks `rules` (or is a float that is not finite)."""
    if value is None:
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            check_value(item, rules, f"{path}[{i}]")
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"config key '{path}' must be a finite number, got {value}")
    if "choices" in rules and value not in rules["choices"]:
        raise UserError(f"{path} '{value}' is unknown; available: {', '.join(rules['choices'])}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        bounds = (("ge", lambda b: value >= b), ("gt", lambda b: value > b), ("le", lambda b: value <= b),
                  ("lt", lambda b: value < b))
        if not all(ok(rules[name]) for name, ok in bounds if name in rules):
            raise UserError(f"config key '{path}' must be {allowed(rules)}, got {value:g}")


# ---- registered choices: what each algorithm and each policy kind reads -----------------------------
ALL = "*"  # every key of the section
PPO_FAMILY_OPTIMIZER = ("lr", "epochs", "minibatches", "ent_coef", "max_grad_norm", "target_kl", "adaptive_lr",
                        "desired_kl", "anneal_lr", "backbone_lr")

# train.algorithm -> {section: keys it reads}; sections that no algorithm of `roborl train` reads are not listed
ALGORITHM_READS: dict[str, dict[str, Any]] = {
    "ppo": {"algo": ALL},
    "sac": {"sac": ALL},
    "grpo": {"algo": PPO_FAMILY_OPTIMIZER, "grpo": ALL},
    "bc": {},  # reads the `bc` section, which no RL algorithm reads: it is not checked against them
}
SECTIONS_BY_ALGORITHM = ("algo", "grpo", "sac")

COMMON_POLICY = ("kind", "init", "init_modules", "normalize_obs")
MLP_POLICY = (*COMMON_POLICY, "hidden", "activation", "init_log_std")
GENERATIVE = (*COMMON_POLICY, "horizon", "denoiser", "hidden", "critic_hidden", "steps", "rl_mode")
VLA = (*COMMON_POLICY, "horizon", "vla")
# policy.kind -> (the policy keys it reads, its policy.rl_mode choices)
POLICY_READS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "gaussian": ((*MLP_POLICY, "actors"), ()),
    "residual": (MLP_POLICY, ()),
    "diffusion": ((*GENERATIVE, "train_timesteps", "eta", "dppo"), ("dppo",)),
    "flow": ((*GENERATIVE, "flow_noise", "flow_sde", "fpo"), ("flow_noise", "flow_sde", "fpo")),
    "token_vla": (VLA, ()),
    "flow_vla": ((*VLA, "steps", "rl_mode", "flow_noise", "flow_sde", "fpo"), ("flow_noise", "flow_sde", "fpo")),
    "pi0": ((*COMMON_POLICY, "horizon", "steps", "rl_mode", "flow_noise", "flow_sde", "pi0"), ("flow_noise", "flow_sde")),
    "lerobot": ((*COMMON_POLICY, "horizon", "steps", "rl_mode", "flow_noise", "flow_sde", "eta", "dppo", "lerobot"),
                ("flow_noise", "flow_sde", "dppo")),
}


def check_trainable(cfg: Any) -> None:
    """Refuses, in one line, a config that `roborl train` cannot train by RL (a behaviour-cloning config)."""
    kind = cfg.policy.kind
    _, rl_modes = POLICY_READS[kind]
    if cfg.train.algorithm != "bc" and rl_modes and cfg.policy.rl_mode is None:
        raise UserError(f"policy.kind {kind} is fine-tuned by RL through policy.rl_mode ({', '.join(rl_modes)}), "
                        "which this config leaves unset: set it, or for behaviour cloning run `roborl bc CONFIG`")


def set_keys(obj: Any, defaults: Any, path: str = "") -> list[str]:
    """The dotted keys of dataclass `obj` whose value differs from the default (`defaults`, same class)."""
    out = []
    for f in dataclasses.fields(obj):
        value, default = getattr(obj, f.name), getattr(defaults, f.name)
        key = f"{path}.{f.name}" if path else f.name
        if dataclasses.is_dataclass(value):
            out += set_keys(value, default, key)
        elif value != default:
            out.append(key)
    return out


def check_choices(cfg: Any) -> None:
    """Refuses keys that the run's `train.algorithm` or `policy.kind` does not read, in one line."""
    algorithm, kind = cfg.train.algorithm, cfg.policy.kind
    if algorithm not in ALGORITHM_READS:
        raise UserError(f"train.algorithm '{algorithm}' is unknown; available: {', '.join(ALGORITHM_READS)}")
    if kind not in POLICY_READS:
        raise UserError(f"policy.kind '{kind}' is unknown; available: {', '.join(POLICY_READS)}")
    reads = ALGORITHM_READS[algorithm]
    for section in SECTIONS_BY_ALGORITHM:
        keys = reads.get(section, ())
        for key in set_keys(getattr(cfg, section), type(getattr(cfg, section))(), section):
            name = key.split(".")[1]
            if keys != ALL and name not in keys:
                readers = [a for a, r in ALGORITHM_READS.items() if r.get(section) == ALL or name in r.get(section, ())]
                raise UserError(f"config key '{key}' is not read by train.algorithm {algorithm} (it is read by "
                                f"{' or '.join(readers)}); remove it or choose another train.algorithm")
    policy_keys, rl_modes = POLICY_READS[kind]
    for key in set_keys(cfg.policy, type(cfg.policy)(), "policy"):
        name = key.split(".")[1]
        if name not in policy_keys:
            readers = [k for k, (keys, _) in POLICY_READS.items() if name in keys]
            raise UserError(f"config key '{key}' is not read by policy.kind {kind} (it is read by "
                            f"{', '.join(readers) or 'no policy kind'}); remove it or choose another policy.kind")
    mode = cfg.policy.rl_mode
    if mode is not None and mode not in rl_modes:
        raise UserError(f"policy.rl_mode '{mode}' does not apply to {kind}; available: "
                        f"{', '.join(rl_modes) or 'none (leave policy.rl_mode unset)'}")
