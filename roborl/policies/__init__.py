"""Policy models. Know nothing of simulators: they see observation dicts and return `Act`.

The names below import on first use (PEP 562), so reading a config (`roborl.config` needs only
`policies.vla.spec`) does not pay for diffusers and the models before a config error can be reported."""
from importlib import import_module

_HOMES = {"Act": "roborl.policies.act", "DiffusionPolicy": "roborl.policies.diffusion", "FlowPolicy": "roborl.policies.flow",
          "GaussianActorCritic": "roborl.policies.gaussian", "RunningNormalizer": "roborl.policies.normalizer",
          "ResidualPolicy": "roborl.policies.residual"}

__all__ = list(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'roborl.policies' has no attribute {name!r}")
