"""The options of DPPO, the RL fine-tuning of a diffusion policy (`policy.dppo`; the model: diffusion.py)."""
from dataclasses import dataclass, field


@dataclass
class DPPOConfig:
    # K': the last K' denoising steps are fine-tuned, earlier ones use a frozen copy
    finetune_steps: int = field(default=5, metadata={"ge": 1})
    min_sampling_std: float = field(default=0.1, metadata={"gt": 0})  # lower bound of the denoising noise std when sampling
    min_logprob_std: float = field(default=0.1, metadata={"gt": 0})  # lower bound of the std in the log-probabilities
    # γ_d: the advantage of denoising step j is scaled by γ_d^(K'-1-j)
    denoise_discount: float = field(default=0.99, metadata={"gt": 0, "le": 1})
    # ε_b: the clip range of the first fine-tuned step, growing to algo.clip at the last
    clip_base: float = field(default=0.001, metadata={"gt": 0})
