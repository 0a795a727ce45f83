"""linrec behind mamba_ssm's and causal-conv1d's interfaces: the functions against their definitions (a float64
composition of the same equations), the module paths code imports them from, and transformers' Mamba-family
models on linrec (where transformers is installed) against transformers' own PyTorch path."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_matches, random_values, wide

import linrec
import linrec.integrations as integrations
from linrec.integrations import namespaces


@pytest.fixture
def restored_modules(monkeypatch):
    """sys.modules and transformers' model modules as they were before the test (namespaces and enable()
    change them for the whole process)."""
    saved = {name: module for name, module in sys.modules.items()
             if name.split(".")[0] in ("mamba_ssm", "causal_conv1d")}
    models = [sys.modules.get(f"transformers.models.{m}.modeling_{m}") for m in ("mamba", "falcon_mamba", "jamba")]
    attributes = [(module, dict(vars(module))) for module in models if module is not None]
    yield
    for name in [name for name in sys.modules if name.split(".")[0] in ("mamba_ssm", "causal_conv1d")]:
        del sys.modules[name]
    sys.modules.update(saved)
    for module, values in attributes:
        for name in ("causal_conv1d_fn", "causal_conv1d_update", "mamba_inner_fn", "selective_scan_fn",
                     "mamba_selective_scan", "selective_state_update", "mamba_selective_state_update",
                     "is_fast_path_available"):
            if name in values:
                setattr(module, name, values[name])


def inner_reference(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight, out_proj_bias,
                    A, D, delta_bias, B_proj_bias=None, C_proj_bias=None, rms_weights=None, eps=1e-6):
    """mamba_inner_fn's equations, composed of torch ops and the selective scan's loop, in float64."""
    batch, _, length = xz.shape
    x, z = xz.chunk(2, dim=1)
    d, width = conv1d_weight.shape[0], conv1d_weight.shape[-1]
    conv = F.silu(F.conv1d(x, conv1d_weight, conv1d_bias, padding=width - 1, groups=d)[..., :length])
    rank = delta_proj_weight.shape[1]
    n = A.shape[1]
    x_dbl = conv.transpose(1, 2) @ x_proj_weight.t()  # (batch, length, rank + 2n)
    delta = x_dbl[..., :rank] @ delta_proj_weight.t()  # (batch, length, d)
    B, C = x_dbl[..., rank:rank + n], x_dbl[..., rank + n:]
    if B_proj_bias is not None:
        B, C = B + B_proj_bias, C + C_proj_bias

    def rms(values, weight):
        return values * torch.rsqrt(values.square().mean(-1, keepdim=True) + eps) * weight

    if rms_weights is not None:
        b_weight, c_weight, dt_weight = rms_weights
        B, C, delta = rms(B, b_weight), rms(C, c_weight), rms(delta, dt_weight)
    out = linrec.selective_scan(conv, delta.transpose(1, 2), A, B.transpose(1, 2), C.transpose(1, 2), D, z,
                                delta_bias, True, backend="loop")
    return F.linear(out.transpose(1, 2), out_proj_weight, out_proj_bias)


@pytest.mark.parametrize("variant", ["plain", "biased", "rms"])
def test_mamba_inner_fn(device, seed, variant):
    """Output and every gradient against the composition of its equations (float32 against float64)."""
    batch, d, n, rank, width, d_model, length = 2, 6, 4, 3, 4, 5, 21
    arguments = dict(
        xz=random_values((batch, 2 * d, length), torch.float32, device),
        conv1d_weight=random_values((d, 1, width), torch.float32, device),
        conv1d_bias=random_values((d,), torch.float32, device),
        x_proj_weight=random_values((rank + 2 * n, d), torch.float32, device),
        delta_proj_weight=random_values((d, rank), torch.float32, device),
        out_proj_weight=random_values((d_model, d), torch.float32, device),
        out_proj_bias=random_values((d_model,), torch.float32, device),
        A=-torch.rand(d, n, device=device) - 0.5,
        D=random_values((d,), torch.float32, device),
        delta_bias=random_values((d,), torch.float32, device),
    )
    extra = {}
    if variant == "biased":
        extra = dict(B_proj_bias=random_values((n,), torch.float32, device),
                     C_proj_bias=random_values((n,), torch.float32, device))
    leaves = {name: t.requires_grad_() for name, t in {**arguments, **extra}.items()}
    rms = None
    if variant == "rms":
        rms = [random_values(shape, torch.float32, device).requires_grad_() for shape in ((n,), (n,), (d,))]
        extra = dict(b_rms_weight=rms[0], c_rms_weight=rms[1], dt_rms_weight=rms[2])
    out = integrations.mamba_inner_fn(**arguments, **extra)
    assert out.shape == (batch, length, d_model)
    wide_leaves = {name: wide(t).requires_grad_() for name, t in leaves.items()}
    wide_rms = None if rms is None else [wide(t).requires_grad_() for t in rms]
    expected = inner_reference(**wide_leaves, rms_weights=wide_rms)
    assert_matches(out, expected, torch.float32, "out")
    d_out = random_values(out.shape, torch.float32, device)
    all_leaves = [*leaves.values(), *(rms or [])]
    grads = torch.autograd.grad(out, all_leaves, d_out)
    wanted = torch.autograd.grad(expected, [*wide_leaves.values(), *(wide_rms or [])], wide(d_out))
    names = [*leaves, *(["b_rms", "c_rms", "dt_rms"] if rms else [])]
    for name, grad, want in zip(names, grads, wanted):
        assert_matches(grad, want, torch.float32, f"d_{name}", terms=batch * length)


def test_selective_state_update_zeroes_padded_rows(device, seed):
    """mamba_ssm's semantics for a negative state_batch_indices entry: output 0, state untouched."""
    state = random_values((3, 4, 2), torch.float32, device)
    before = state.clone()
    x, dt = random_values((2, 4), torch.float32, device), torch.rand(2, 4, device=device)
    A = -torch.rand(4, 2, device=device)
    B, C = random_values((2, 2), torch.float32, device), random_values((2, 2), torch.float32, device)
    indices = torch.tensor([2, -1], device=device)
    out = integrations.selective_state_update(state, x, dt, A, B, C, state_batch_indices=indices)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.equal(state[:2], before[:2])
    own = before[2:].clone()
    expected = linrec.selective_state_update(own, x[:1], dt[:1], A, B[:1], C[:1])
    torch.testing.assert_close(out[:1], expected)
    torch.testing.assert_close(state[2:], own)


def test_causal_conv1d_fn_with_sequence_ids(device, seed):
    """seq_idx: steps of one row in several sequences, each starting from zeros, as cu_seqlens packs them."""
    x = random_values((2, 3, 10), torch.float32, device)
    weight = random_values((3, 4), torch.float32, device)
    seq_idx = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 2, 2], [0] * 10], device=device, dtype=torch.int32)
    out = integrations.causal_conv1d_fn(x, weight, seq_idx=seq_idx, activation="silu")
    first = linrec.causal_conv1d(x[:1], weight, activation="silu", cu_seqlens=torch.tensor([0, 3, 8, 10], device=device))
    torch.testing.assert_close(out[:1], first)
    torch.testing.assert_close(out[1:], linrec.causal_conv1d(x[1:], weight, activation="silu"))
    final = torch.empty(2, 3, 3, device=device)
    out, returned = integrations.causal_conv1d_fn(x, weight, return_final_states=True, final_states_out=final)
    assert returned is final and torch.equal(final, x[..., -3:])
    with pytest.raises(ValueError, match="cache_seqlens"):
        integrations.causal_conv1d_update(x[..., 0], final, weight, cache_seqlens=torch.zeros(2, dtype=torch.int32))


def test_namespaces_serve_the_import_paths(restored_modules):
    for name in [name for name in sys.modules if name.split(".")[0] in ("mamba_ssm", "causal_conv1d")]:
        del sys.modules[name]
    real = [top for top in ("mamba_ssm", "causal_conv1d") if importlib.util.find_spec(top) is not None]
    installed = integrations.install_namespaces(replace=bool(real))
    assert installed == ["causal_conv1d", "mamba_ssm"]
    from causal_conv1d import causal_conv1d_fn, causal_conv1d_update
    from causal_conv1d.causal_conv1d_interface import causal_conv1d_fn as deep_conv
    from mamba_ssm.ops.selective_scan_interface import mamba_inner_fn, selective_scan_fn
    from mamba_ssm.ops.triton.selective_state_update import selective_state_update

    assert causal_conv1d_fn is deep_conv is integrations.causal_conv1d_fn
    assert causal_conv1d_update is integrations.causal_conv1d_update
    assert (mamba_inner_fn, selective_scan_fn, selective_state_update) == (
        integrations.mamba_inner_fn, integrations.selective_scan_fn, integrations.selective_state_update)
    import mamba_ssm

    assert mamba_ssm.selective_state_update is integrations.selective_state_update
    assert not hasattr(mamba_ssm, "__version__")  # no claim to Mamba-2's kernels
    assert importlib.util.find_spec("mamba_ssm.ops.triton") is not None
    assert integrations.install_namespaces() == ["causal_conv1d", "mamba_ssm"]  # again: nothing changes
    assert sys.modules["mamba_ssm"] is mamba_ssm
    assert namespaces.NAMESPACES["mamba_ssm"]["mamba_inner_fn"] is integrations.mamba_inner_fn


# ----- transformers -------------------------------------------------------------------------------------------

def tiny_models(device):
    """(name, a tiny random model) of each Mamba-family class transformers has, on ``device``."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    mamba = dict(vocab_size=64, hidden_size=32, state_size=8, num_hidden_layers=2, conv_kernel=4, expand=2,
                 time_step_rank=4)
    models = [("mamba", transformers.MambaForCausalLM(transformers.MambaConfig(**mamba)))]
    if hasattr(transformers, "FalconMambaForCausalLM"):
        models.append(("falcon_mamba", transformers.FalconMambaForCausalLM(transformers.FalconMambaConfig(**mamba))))
    if hasattr(transformers, "JambaForCausalLM"):
        config = transformers.JambaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, mamba_d_state=8,
                                          mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4, attn_layer_period=2,
                                          attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
                                          num_experts=2, use_mamba_kernels=False)
        models.append(("jamba", transformers.JambaForCausalLM(config)))
    return [(name, model.to(device)) for name, model in models]


def run_model(model, ids):
    """Training loss and gradients, then greedy generation with the cache (tokens and logits)."""
    model.train()
    model.zero_grad()
    loss = model(ids, labels=ids).loss
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.eval()
    with torch.no_grad():
        generated = model.generate(ids[:, :5], attention_mask=torch.ones_like(ids[:, :5]), max_new_tokens=6,
                                   do_sample=False, output_logits=True, return_dict_in_generate=True)
        prefill = model(generated.sequences[:, :-1]).logits[:, 4:]  # the whole sequence in one call
    return loss.detach(), grads, generated, prefill


def test_transformers_models_run_on_linrec(device, seed, restored_modules, monkeypatch):
    """Each Mamba-family model of transformers: training loss and gradients, and generation with the cache,
    equal to transformers' own PyTorch path within float32 rounding once linrec serves its functions, every one
    of which then runs; the decoding steps agree with the prefill of the sequence they generate."""
    models = tiny_models(device)
    import linrec.integrations.transformers as hf

    calls = {}
    for name, function in list(hf._FUNCTIONS.items()):
        def counted(*args, _function=function, _name=function.__name__, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _function(*args, **kwargs)
        counted.__signature__ = importlib.import_module("inspect").signature(function)
        monkeypatch.setitem(hf._FUNCTIONS, name, counted)
    ids = torch.randint(0, 64, (2, 13), device=device)
    expected = {name: run_model(model, ids) for name, model in models}
    enabled = hf.enable()
    for name, model in models:
        assert f"transformers.models.{name}.modeling_{name}" in enabled
        calls.clear()
        loss, grads, generated, prefill = run_model(model, ids)
        want_loss, want_grads, want_generated, _ = expected[name]
        # FalconMamba's training forward is mamba_ssm's mamba_inner_fn, which normalises the step sizes after
        # dt_proj (over d), where transformers' PyTorch path normalises them before it (over dt_rank): the two
        # differ with mamba_ssm too. test_mamba_inner_fn holds linrec's to mamba_ssm's equations.
        if name != "falcon_mamba":
            torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-5, msg=name)
            for parameter, grad in want_grads.items():
                assert_matches(grads[parameter], wide(grad), torch.float32, f"{name} d_{parameter}",
                               terms=ids.numel())
        assert torch.equal(generated.sequences, want_generated.sequences), name
        for step, (logits, want) in enumerate(zip(generated.logits, want_generated.logits)):
            assert_matches(logits, wide(want), torch.float32, f"{name} logits of step {step}")
        decoded = torch.stack(generated.logits, 1)
        assert_matches(decoded, wide(prefill), torch.float32, f"{name} decoding against the prefill")
        expected_calls = {"mamba_inner_fn", "causal_conv1d_fn", "selective_scan", "causal_conv1d_update",
                          "selective_state_update"}  # selective_scan_fn is linrec.selective_scan
        if name == "jamba":  # its layers train through the conv and the scan, not mamba_inner_fn
            expected_calls.remove("mamba_inner_fn")
        assert set(calls) == expected_calls, (name, calls)
