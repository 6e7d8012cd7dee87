"""The options of the RL fine-tuning modes of a flow-matching policy (`policy.flow_noise`, `policy.flow_sde`,
`policy.fpo`; the model: flow.py, the modes: flow_rl.py)."""
from dataclasses import dataclass, field


@dataclass
class FlowNoiseConfig:
    """flow-noise: a learned noise std in [min_std, max_std] on each Euler step."""
    min_std: float = field(default=0.08, metadata={"gt": 0})  # the smallest noise std the noise network may output
    max_std: float = field(default=0.16, metadata={"gt": 0})  # the largest


@dataclass
class FlowSDEConfig:
    noise_level: float = field(default=0.5, metadata={"gt": 0})  # a in σ_t = a·sqrt(t / (1 − t))


@dataclass
class FPOConfig:
    samples: int = field(default=8, metadata={"ge": 1})  # (τ, ε) pairs per action; each pair's ratio is clipped alone
