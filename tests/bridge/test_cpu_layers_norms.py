"""recipe.export.cpu_layers' norms by direct calls: Transformer Engine's RMSNorm and LayerNorm, and their parameters.

The CPU e2e runs these norms in the model's forward pass; `export` only needs their parameters. The expected
values come from torch's own rms_norm and layer_norm, with TE's zero-centred gamma (weight + 1).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support.needs import TRAINER_EXTRA, needs
from tests.support.torch_threads import single_threaded_torch  # noqa: F401  (mutmut forks)

torch = needs("torch", install=TRAINER_EXTRA)

from recipe.export.cpu_layers import _norm, _norm_parameters  # noqa: E402

F = torch.nn.functional


def inputs(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, weight, bias): a batch of hidden states of width 8, a gamma and a beta, none of them trivial."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 8, generator=generator).to(dtype)
    return x, torch.randn(8, generator=generator), torch.randn(8, generator=generator)


@pytest.mark.parametrize("zero_centered", [False, True])
def test_rms_norm_is_torchs_with_te_gamma(zero_centered: bool) -> None:
    x, weight, _ = inputs()
    gamma = weight + 1 if zero_centered else weight
    expected = F.rms_norm(x, (8,), gamma, eps=0.5)
    assert torch.allclose(_norm(x, weight, None, 0.5, True, zero_centered), expected, atol=1e-6)


def test_rms_norm_of_bf16_is_computed_in_fp32_and_returned_in_bf16() -> None:
    x, weight, _ = inputs(torch.bfloat16)
    out = _norm(x, weight.to(torch.bfloat16), None, 1e-6, True, False)
    assert out.dtype == torch.bfloat16
    expected = F.rms_norm(x.float(), (8,), weight.to(torch.bfloat16).float(), eps=1e-6).to(torch.bfloat16)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("zero_centered", [False, True])
def test_layer_norm_is_torchs_with_te_gamma_and_the_bias(zero_centered: bool) -> None:
    x, weight, bias = inputs()
    gamma = weight + 1 if zero_centered else weight
    expected = F.layer_norm(x, (8,), gamma, bias, 0.5)
    assert torch.allclose(_norm(x, weight, bias, 0.5, False, zero_centered), expected, atol=1e-6)


def config(normalization: str, zero_centered: bool) -> SimpleNamespace:
    return SimpleNamespace(normalization=normalization, layernorm_zero_centered_gamma=zero_centered, params_dtype=torch.bfloat16)


def test_a_zero_centred_rms_norm_starts_at_gamma_zero_without_a_bias() -> None:
    module = SimpleNamespace()
    gamma, beta = _norm_parameters(module, config("RMSNorm", True), 8, 1e-6)
    assert isinstance(gamma, torch.nn.Parameter) and gamma.dtype == torch.bfloat16
    assert torch.equal(gamma, torch.zeros(8, dtype=torch.bfloat16)) and beta is None
    assert (module.norm_eps, module.norm_rms, module.norm_zero_centered) == (1e-6, True, True)


def test_a_layer_norm_starts_at_gamma_one_and_beta_zero() -> None:
    module = SimpleNamespace()
    gamma, beta = _norm_parameters(module, config("LayerNorm", None), 4, 1e-5)  # type: ignore[arg-type]
    assert torch.equal(gamma, torch.ones(4, dtype=torch.bfloat16)) and gamma.dtype == torch.bfloat16
    assert isinstance(beta, torch.nn.Parameter) and beta.dtype == torch.bfloat16
    assert torch.equal(beta, torch.zeros(4, dtype=torch.bfloat16))
    assert (module.norm_eps, module.norm_rms, module.norm_zero_centered) == (1e-5, False, False)
