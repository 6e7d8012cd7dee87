"""Policy models. Know nothing of simulators: they see observation dicts and return `Act`."""
from policies.act import Act
from policies.diffusion import DiffusionPolicy
from policies.flow import FlowPolicy
from policies.gaussian import GaussianActorCritic
from policies.normalizer import RunningNormalizer
from policies.residual import ResidualPolicy

__all__ = ["Act", "DiffusionPolicy", "FlowPolicy", "GaussianActorCritic", "ResidualPolicy", "RunningNormalizer"]
