"""The models' ``Linear`` with oneDNN's prepacked weights (the CPU engine's GEMM): the same
products as ``nn.Linear``, never a stale weight, plain autograd for the trainer."""

import pytest
import torch
import torch.nn.functional as F

from pearl.engine.config import EngineConfig
from pearl.engine.engine import LLMEngine
from pearl.engine.sequence import Request, SamplingParams
from pearl.models.layers import Linear, prepack, prepack_available
from pearl.models.loader import build_model

pytestmark = pytest.mark.skipif(not prepack_available(), reason="torch without oneDNN")


def packed_layer(bias: bool) -> Linear:
    torch.manual_seed(0)
    layer = Linear(48, 80, bias=bias)
    assert prepack(layer) == 1 and layer.prepacked
    return layer


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 48), (7, 48), (33, 48), (2, 5, 48)])
def test_a_prepacked_layer_gives_the_plain_product(bias, shape):
    layer = packed_layer(bias)
    x = torch.randn(shape)
    with torch.inference_mode():
        got = layer(x)
    assert layer._packed is not None  # the oneDNN path ran, not the fallback
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_a_weight_changed_in_place_or_replaced_is_repacked():
    layer = packed_layer(bias=False)
    x = torch.randn(4, 48)
    with torch.inference_mode():
        layer(x)
    with torch.no_grad():
        layer.weight.mul_(-2.0)  # an in-place update (as load_state_dict's copy_)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), x @ layer.weight.T, rtol=1e-5, atol=1e-5)
    layer.weight.data = torch.randn(80, 48)  # a new tensor (as wake restores weights)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), x @ layer.weight.T, rtol=1e-5, atol=1e-5)


def test_under_autograd_a_prepacked_layer_is_a_plain_linear_with_gradients():
    layer = packed_layer(bias=True)
    x = torch.randn(3, 48)
    layer(x).sum().backward()
    assert layer._packed is None  # never packed a weight that trains
    torch.testing.assert_close(layer.weight.grad, x.sum(0).expand(80, 48))
    assert layer.bias.grad is not None


def test_a_frozen_prepacked_layer_passes_gradients_to_its_input():
    layer = packed_layer(bias=False)
    layer.requires_grad_(False)
    x = torch.randn(3, 48, requires_grad=True)
    layer(x).sum().backward()
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(3, 48))


def test_a_replaced_weight_never_reuses_the_packed_ones_address():
    """The packed copy holds its source weight alive: a weight swapped in (``.data``, the
    old one freed) cannot take its address and pass for it with the same version."""
    layer = packed_layer(bias=False)
    x = torch.randn(2, 48)
    with torch.inference_mode():
        layer(x)
    for _ in range(20):
        layer.weight.data = torch.empty(0)  # the old weight let go first, as sleep does
        layer.weight.data = torch.randn(80, 48)  # (an allocator reuses a freed address)
        with torch.inference_mode():
            torch.testing.assert_close(layer(x), x @ layer.weight.T, rtol=1e-5, atol=1e-5)


def test_the_engine_prepacks_on_the_cpu_and_serves_what_the_plain_model_serves(tiny_config):
    """Greedy tokens and logits of an engine with prepacked weights against one without;
    sleep frees the packed copies and wake serves the same again."""
    prompt = list(range(3, 40))
    greedy = SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True)
    outs, logits = {}, {}
    for packed in (False, True):
        config = EngineConfig(block_size=4, num_kv_blocks=128, prepack_weights=packed)
        eng = LLMEngine(build_model(tiny_config, seed=3), config)
        eng.runner.keep_logits = True
        outs[packed] = eng.generate([Request("a", prompt, greedy)])["a"].token_ids
        logits[packed] = eng.runner.last_logits
        layers = [m for m in eng.model.modules() if isinstance(m, Linear)]
        assert all(m.prepacked == packed for m in layers)
        assert all((m._packed is not None) == packed for m in layers)
    assert outs[True] == outs[False]
    torch.testing.assert_close(logits[True], logits[False], rtol=1e-4, atol=1e-4)
    eng.sleep()
    assert all(m._packed is None for m in layers)
    eng.wake()
    assert eng.generate([Request("b", prompt, greedy)])["b"].token_ids == outs[True]
