"""The hidden-layer activations of roborl's MLPs, by config name (`policy.activation`).

`Tanh` is tanh computed as 2·sigmoid(2x) - 1 on the CPU. The function is the same (to float32 rounding,
about 1e-7 absolute), but torch's CPU tanh kernel costs about seven times its sigmoid kernel (measured on
a 2048×256 float32 batch, torch 2.14, AVX-512), and tanh layers then take a quarter of a PPO update with
[256, 256] networks. The gradient is tanh's own, (1 - y²)·g, from the saved output. On other devices, and
while torch traces or compiles the module (TorchScript, ONNX, torch.export), it is plain `torch.tanh`, so
exported policies hold the standard operator.
"""
from __future__ import annotations

import torch
from torch import nn


def _tanh_by_sigmoid(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x * 2).mul_(2).sub_(1)


class _SigmoidTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        y = _tanh_by_sigmoid(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


class Tanh(nn.Module):
    """`nn.Tanh`, faster on the CPU (see the module's docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cpu or torch.jit.is_tracing() or torch.compiler.is_compiling():
            return torch.tanh(x)
        if x.requires_grad and torch.is_grad_enabled():
            return _SigmoidTanh.apply(x)
        return _tanh_by_sigmoid(x)  # without the autograd node, which inference does not need


ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU}
