"""linrec.rl: discounted returns and GAE against their definitions, Python loops backward in time in
float64, forward and backward (rewards, values, bootstrap, and gamma/lam when tensors), over episode
ends at the first and the last step, the (time, envs), (envs, time) and (batch, time, agents) layouts,
float32, float64 and bfloat16; then the argument checks."""

from __future__ import annotations

import doctest
import warnings

import pytest
import torch
from helpers import TOLERANCE, assert_matches, random_values, wide

import linrec
from linrec.rl import GAE, discounted_returns, gae

T = 37  # odd, and not a multiple of any block size
ENVS = 6
DTYPES = [torch.float32, torch.float64, torch.bfloat16]


# --- the definitions --------------------------------------------------------------------------------


def _per_step(value, shape, dim):
    """gamma, lam or dones (a number or a tensor broadcastable to the rewards) as (time, ...) float64."""
    return torch.as_tensor(value, dtype=torch.float64).expand(shape).movedim(dim, 0)


def loop_returns(rewards, gamma, dones=None, dim=0, bootstrap=None):
    """G[t] = r[t] + gamma * (1 - done[t]) * G[t+1], from the last step back, G[T] = bootstrap (or 0)."""
    r = rewards.movedim(dim, 0)
    g = _per_step(gamma, rewards.shape, dim)
    d = _per_step(0.0 if dones is None else dones, rewards.shape, dim)
    state = r.new_zeros(r.shape[1:]) if bootstrap is None else bootstrap.expand(r.shape[1:])
    returns = []
    for t in reversed(range(r.shape[0])):
        state = r[t] + g[t] * (1 - d[t]) * state
        returns.append(state)
    return torch.stack(returns[::-1]).movedim(0, dim)


def loop_gae(rewards, values, dones, gamma, lam, dim=0):
    """delta[t] = r[t] + gamma (1 - done[t]) V[t+1] - V[t], A[t] = delta[t] + gamma lam (1 - done[t]) A[t+1];
    V[T] = 0 when values has length T. Returns (advantages, advantages + V[:T])."""
    r, v = rewards.movedim(dim, 0), values.movedim(dim, 0)
    length = r.shape[0]
    g, lam_ = _per_step(gamma, rewards.shape, dim), _per_step(lam, rewards.shape, dim)
    d = _per_step(0.0 if dones is None else dones, rewards.shape, dim)
    advantage = r.new_zeros(r.shape[1:])
    advantages = []
    for t in reversed(range(length)):
        following = v[t + 1] if t + 1 < v.shape[0] else torch.zeros_like(v[t])
        delta = r[t] + g[t] * (1 - d[t]) * following - v[t]
        advantage = delta + g[t] * lam_[t] * (1 - d[t]) * advantage
        advantages.append(advantage)
    advantages = torch.stack(advantages[::-1])
    return advantages.movedim(0, dim), (advantages + v[:length]).movedim(0, dim)


# --- layouts and operands -----------------------------------------------------------------------------


class Layout:
    """Where the time dim is: tensors are made (time, envs) and then laid out (views where possible)."""

    def __init__(self, name, dim, arrange, state):
        self.name, self.dim, self.arrange, self.state = name, dim, arrange, state

    def __repr__(self):
        return self.name


LAYOUTS = [
    Layout("time_envs_dim0", 0, lambda x: x, lambda s: s),
    Layout("envs_time_dim1_strided", 1, lambda x: x.T, lambda s: s),  # a transposed view
    Layout("envs_time_dim-1", -1, lambda x: x.T.contiguous(), lambda s: s),
    Layout("batch_time_agents_dim1", 1, lambda x: x.reshape(x.shape[0], 2, 3).movedim(0, 1), lambda s: s.reshape(2, 3)),
]


def episode_ends(length, device):
    """(time, envs) bool: env 0 ends at the first step, env 1 at the last, env 2 never, env 3 at every
    step, envs 4-5 at random steps (a fifth of them)."""
    dones = torch.rand(length, ENVS) < 0.2
    dones[:, :4] = False
    dones[0, 0] = dones[-1, 1] = True
    dones[:, 3] = True
    return dones.to(device)


def leaf(tensor):
    return tensor.detach().requires_grad_()


def discount(kind, layout, dtype, device, low=0.5):
    """gamma or lam: a Python float, or a tensor (0-dim, per environment, or per step) in (low, 1)."""
    def uniform(shape):
        return (low + (1 - low) * torch.rand(shape, dtype=torch.float64)).to(dtype).to(device)
    if kind == "float":
        return float(uniform(()))
    if kind == "scalar_tensor":
        return leaf(uniform(()))
    if kind == "per_env":  # (envs,) broadcasts right-aligned onto (time, envs); the others keep a time dim of 1
        per_env = uniform((1, ENVS))
        return leaf(per_env[0] if layout.dim == 0 else layout.arrange(per_env))
    if kind == "per_step":
        return leaf(layout.arrange(uniform((T, ENVS))))
    raise ValueError(kind)


def compare(ours, loop, tensors, dtype, shape, **numbers):
    """ours(**tensors, **numbers) against loop(...) on float64 copies: every output, then the gradient of
    every floating-point tensor for random upstream gradients. gamma/lam tensors enter the reference
    expanded to the rewards' shape, as per-element leaves: their gradient is a sum of per-element terms,
    each rounded, so its error is measured against the sum of the terms' magnitudes."""
    outputs = ours(**tensors, **numbers)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    references = {}
    for name, tensor in tensors.items():
        if tensor is None or not tensor.is_floating_point():
            references[name] = wide(tensor)
        elif name in ("gamma", "lam"):
            references[name] = wide(tensor).expand(shape).clone().requires_grad_()
        else:
            references[name] = wide(tensor).requires_grad_()
    expected = loop(**references, **numbers)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for index, (actual, want) in enumerate(zip(outputs, expected)):
        assert actual.dtype == dtype
        assert_matches(actual, want, dtype, f"output {index}")

    names = [name for name, tensor in tensors.items() if tensor is not None and tensor.requires_grad]
    d_outputs = [random_values(output.shape, dtype, output.device) for output in outputs]
    grads = torch.autograd.grad(outputs, [tensors[name] for name in names], d_outputs)
    wants = torch.autograd.grad(expected, [references[name] for name in names], [wide(d) for d in d_outputs])
    for name, grad, want in zip(names, grads, wants):
        tensor = tensors[name]
        assert grad.shape == tensor.shape and grad.dtype == tensor.dtype, f"d_{name}: {grad.shape} {grad.dtype}"
        if want.shape == tensor.shape:
            assert_matches(grad, want, dtype, f"d_{name}")
        else:
            scale = want.abs().sum_to_size(tensor.shape).max().clamp_min(1e-30)
            error = ((grad.detach().cpu().double() - want.sum_to_size(tensor.shape)).abs().max() / scale).item()
            assert error <= TOLERANCE[dtype], f"d_{name}: error / sum |terms| = {error:.3g} ({dtype})"


# --- discounted returns ----------------------------------------------------------------------------


@pytest.mark.parametrize("with_bootstrap", [False, True])
@pytest.mark.parametrize("gamma_kind", ["float", "scalar_tensor", "per_env", "per_step"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=repr)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_discounted_returns(device, seed, dtype, layout, gamma_kind, with_bootstrap):
    rewards = leaf(layout.arrange(random_values((T, ENVS), dtype, device)))
    dones = layout.arrange(episode_ends(T, device))
    gamma = discount(gamma_kind, layout, dtype, device)
    bootstrap = leaf(layout.state(random_values((ENVS,), dtype, device))) if with_bootstrap else None
    tensors = dict(rewards=rewards, dones=dones, bootstrap=bootstrap)
    numbers = dict(dim=layout.dim)
    (tensors if isinstance(gamma, torch.Tensor) else numbers)["gamma"] = gamma
    compare(discounted_returns, loop_returns, tensors, dtype, rewards.shape, **numbers)


@pytest.mark.parametrize("length", [1, 2, 5])
def test_discounted_returns_short_rollouts(device, seed, length):
    rewards = leaf(random_values((length, ENVS), torch.float64, device))
    dones = episode_ends(length, device)
    bootstrap = leaf(random_values((ENVS,), torch.float64, device))
    compare(discounted_returns, loop_returns, dict(rewards=rewards, dones=dones, bootstrap=bootstrap),
            torch.float64, rewards.shape, gamma=0.97)


def test_discounted_returns_by_hand(device):
    rewards = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]], device=device)  # (envs, time)
    dones = torch.tensor([[False, False, True, False], [True, False, False, True]], device=device)
    returns = discounted_returns(rewards, 0.5, dones, dim=1, bootstrap=torch.tensor([8.0, 8.0], device=device))
    # env 0: G3 = 4 + 0.5 * 8 = 8, G2 = 3 (ends), G1 = 2 + 1.5 = 3.5, G0 = 1 + 1.75 = 2.75
    # env 1: G3 = 1 (ends: no bootstrap), G2 = 1.5, G1 = 1.75, G0 = 1 (ends)
    assert returns.tolist() == [[2.75, 3.5, 3.0, 8.0], [1.0, 1.75, 1.5, 1.0]]
    assert discounted_returns(rewards, 1.0, dim=1).tolist() == [[10.0, 9.0, 7.0, 4.0], [4.0, 3.0, 2.0, 1.0]]
    assert discounted_returns(rewards, 0.0, dones, dim=-1).tolist() == rewards.tolist()


def test_nothing_flows_back_across_an_episode_end(device, seed):
    rewards = leaf(random_values((T, ENVS), torch.float32, device))
    dones = torch.zeros(T, ENVS, dtype=torch.bool, device=device)
    dones[10] = True  # episodes end after step 10
    returns = discounted_returns(rewards, 0.99, dones, bootstrap=torch.ones(ENVS, device=device))
    (grad,) = torch.autograd.grad(returns[:11].sum(), rewards)
    assert (grad[11:] == 0).all() and (grad[:11] != 0).all()

    values = leaf(random_values((T + 1, ENVS), torch.float32, device))
    advantages, _ = gae(rewards, values, dones, 0.99, 0.95)
    d_rewards, d_values = torch.autograd.grad(advantages[:11].sum(), (rewards, values))
    assert (d_rewards[11:] == 0).all() and (d_values[11:] == 0).all()  # V[11] is not used for step 10
    assert (d_values[:11] != 0).all()


def test_dones_forms_agree(device, seed):
    rewards = random_values((T, ENVS), torch.float64, device)
    dones = episode_ends(T, device)
    expected = discounted_returns(rewards, 0.9, dones)
    for form in (dones.float(), dones.double(), dones.to(torch.int64), dones.to(torch.uint8)):
        torch.testing.assert_close(discounted_returns(rewards, 0.9, form), expected, rtol=0, atol=0)
    no_ends = torch.zeros_like(dones)
    torch.testing.assert_close(discounted_returns(rewards, 0.9), discounted_returns(rewards, 0.9, no_ends))
    # dones shared by the environments, (time, 1), broadcast to (time, envs)
    shared = dones[:, 4:5]
    torch.testing.assert_close(discounted_returns(rewards, 0.9, shared), discounted_returns(rewards, 0.9, shared.expand(T, ENVS)))


# --- GAE -----------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::linrec.rl.MissingBootstrapWarning")  # the "T" rows take V(s_T) = 0
@pytest.mark.parametrize("discount_kind", ["float", "scalar_tensor", "per_env", "per_step"])
@pytest.mark.parametrize("values_length", ["T+1", "T"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=repr)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gae(device, seed, dtype, layout, values_length, discount_kind):
    rewards = leaf(layout.arrange(random_values((T, ENVS), dtype, device)))
    values = leaf(layout.arrange(random_values((T + (values_length == "T+1"), ENVS), dtype, device)))
    dones = layout.arrange(episode_ends(T, device))
    gamma = discount(discount_kind, layout, dtype, device)
    lam = discount("float" if discount_kind == "per_step" else discount_kind, layout, dtype, device)
    tensors = dict(rewards=rewards, values=values, dones=dones)
    numbers = dict(dim=layout.dim)
    for name, value in (("gamma", gamma), ("lam", lam)):
        (tensors if isinstance(value, torch.Tensor) else numbers)[name] = value
    compare(gae, loop_gae, tensors, dtype, rewards.shape, **numbers)


@pytest.mark.parametrize("length", [1, 2, 5])
def test_gae_short_rollouts(device, seed, length):
    rewards = leaf(random_values((ENVS, length), torch.float64, device))
    values = leaf(random_values((ENVS, length + 1), torch.float64, device))
    dones = episode_ends(length, device).T
    compare(gae, loop_gae, dict(rewards=rewards, values=values, dones=dones), torch.float64, rewards.shape,
            gamma=0.99, lam=0.9, dim=1)


def test_gae_by_hand(device):
    rewards = torch.tensor([1.0, 0.0, 1.0], device=device)
    values = torch.tensor([0.5, 0.5, 0.5, 2.0], device=device)
    dones = torch.tensor([False, True, False], device=device)
    result = gae(rewards, values, dones, gamma=0.5, lam=0.5)
    assert isinstance(result, GAE)
    # deltas: 1 + 0.25 - 0.5 = 0.75, 0 - 0.5 (ends) = -0.5, 1 + 1 - 0.5 = 1.5; A0 = 0.75 + 0.25 * -0.5
    assert result.advantages.tolist() == [0.625, -0.5, 1.5]
    assert result.returns.tolist() == [1.125, 0.0, 2.0]
    # without the bootstrap value V[3] = 0: delta2 = 0.5 (the last step ends no episode: a warning)
    with pytest.warns(linrec.rl.MissingBootstrapWarning, match="values has length T = 3 along dim 0"):
        assert gae(rewards, values[:3], dones, 0.5, 0.5).advantages.tolist() == [0.625, -0.5, 0.5]


def test_gae_warns_only_where_a_bootstrap_value_is_missing(device):
    """Values without V(s_T) warn where the last step leaves an episode running (CleanRL's next_value forgotten),
    whether dones is None, per step or broadcast; not when every episode ends there, nor with V(s_T) given."""
    rewards = torch.ones(4, 3, device=device)
    ends = torch.zeros(4, 3, dtype=torch.bool, device=device)
    ends[-1] = True
    running = ends.clone()
    running[-1, 1] = False
    for dones, values_length in ((None, 4), (running, 4), (running[:, :1] & False, 4)):
        with pytest.warns(linrec.rl.MissingBootstrapWarning, match="CleanRL's next_value"):
            gae(rewards, torch.zeros(values_length, 3, device=device), dones, 0.9, 0.9)
    with warnings.catch_warnings():
        warnings.simplefilter("error", linrec.rl.MissingBootstrapWarning)
        for dones, values_length in ((ends, 4), (ends[:, :1], 4), (None, 5), (running, 5)):
            gae(rewards, torch.zeros(values_length, 3, device=device), dones, 0.9, 0.9)


def test_gae_lambda_one_and_zero(device, seed):
    rewards = random_values((T, ENVS), torch.float64, device)
    values = random_values((T + 1, ENVS), torch.float64, device)
    dones = episode_ends(T, device)
    advantages, returns = gae(rewards, values, dones, 0.95, 1.0)
    expected = discounted_returns(rewards, 0.95, dones, bootstrap=values[-1])
    torch.testing.assert_close(returns, expected)
    torch.testing.assert_close(advantages, expected - values[:-1])
    deltas = rewards + 0.95 * (~dones) * values[1:] - values[:-1]
    torch.testing.assert_close(gae(rewards, values, dones, 0.95, 0.0).advantages, deltas)
    torch.testing.assert_close(gae(rewards, values, None, 0.95, 0.7).advantages,
                               gae(rewards, values, torch.zeros_like(dones), 0.95, 0.7).advantages)


def cleanrl_gae(rewards, values, dones, next_value, next_done, gamma, lam):
    """CleanRL's PPO advantage loop (ppo.py), as written there: ``dones[t]`` true means ``obs[t]`` starts a new
    episode, ``next_done`` is the done of the observation after the rollout, ``next_value`` its value."""
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * lam * nextnonterminal * lastgaelam
    return advantages, advantages + values


def test_cleanrl_buffer_after_the_documented_shift(device, seed):
    """A CleanRL (and SB3: episode_starts) buffer marks where episodes start; shifted by one step as the module's
    docstring says, gae gives CleanRL's advantages and returns. Unshifted, it does not."""
    rewards = torch.randn(T, ENVS, dtype=torch.float64, device=device)
    values = torch.randn(T, ENVS, dtype=torch.float64, device=device)
    dones = (torch.rand(T, ENVS, device=device) < 0.2).double()  # float 0/1, as CleanRL stores them
    next_value = torch.randn(1, ENVS, dtype=torch.float64, device=device)  # agent.get_value(next_obs).reshape(1, -1)
    next_done = (torch.rand(ENVS, device=device) < 0.5).double()
    expected = cleanrl_gae(rewards, values, dones, next_value, next_done, gamma=0.99, lam=0.95)

    shifted = torch.cat([dones[1:], next_done[None]])
    advantages, returns = gae(rewards, torch.cat([values, next_value.reshape(1, -1)]), shifted, gamma=0.99, lam=0.95)
    torch.testing.assert_close(advantages, expected[0])
    torch.testing.assert_close(returns, expected[1])
    unshifted = gae(rewards, torch.cat([values, next_value]), dones, gamma=0.99, lam=0.95).advantages
    assert not torch.allclose(unshifted, expected[0])


def test_dtypes_and_devices(device, seed):
    rewards = random_values((T, ENVS), torch.float32, device)
    values = random_values((T + 1, ENVS), torch.float64, device)
    advantages, returns = gae(rewards, values, None, 0.99, 0.95)
    assert advantages.dtype == returns.dtype == torch.float64  # promoted together, as torch's arithmetic
    bf16 = rewards.bfloat16()
    assert discounted_returns(bf16, 0.99).dtype == torch.bfloat16
    # a 0-dim gamma may be on the CPU, as in torch's arithmetic
    gamma = torch.tensor(0.9, dtype=torch.float64)
    torch.testing.assert_close(discounted_returns(rewards, gamma), discounted_returns(rewards, 0.9))


def test_bfloat16_keeps_gamma_precise(device, seed):
    """0.99 is 0.98828125 in bfloat16: the scan runs in float32 so that long horizons keep their discount."""
    rewards = torch.ones(300, 2, dtype=torch.bfloat16, device=device)
    returns = discounted_returns(rewards, 0.99)
    exact = (1 - 0.99 ** 300) / (1 - 0.99)
    assert abs(returns[0].float().cpu() - exact).max() / exact < 2**-8


def test_gradcheck(device, seed):
    def leaves(*shapes):
        return [torch.rand(shape, dtype=torch.float64, device=device, requires_grad=True) for shape in shapes]
    rewards, values, gamma, lam, bootstrap = leaves((7, 3), (8, 3), (3,), (), (3,))
    dones = episode_ends(7, device)[:, 3:]
    assert torch.autograd.gradcheck(lambda r, v, g, l: gae(r, v, dones, g, l), (rewards, values, gamma, lam))
    assert torch.autograd.gradcheck(lambda r, g, b: discounted_returns(r, g, dones, bootstrap=b), (rewards, gamma, bootstrap))
    assert torch.autograd.gradgradcheck(lambda r, v, g, l: gae(r, v, dones, g, l), (rewards, values, gamma, lam))


def test_empty_rollout(device):
    rewards = torch.zeros(0, 3, device=device)
    assert discounted_returns(rewards, 0.9).shape == (0, 3)
    assert gae(rewards, torch.zeros(1, 3, device=device), None, 0.9, 0.9).advantages.shape == (0, 3)
    assert gae(rewards, torch.zeros(0, 3, device=device), None, 0.9, 0.9).returns.shape == (0, 3)


def test_docstring_examples():
    assert doctest.testmod(linrec.rl, raise_on_error=True).attempted > 0


# --- argument checks ---------------------------------------------------------------------------------

REWARDS = torch.zeros(5, 3)
VALUES = torch.zeros(6, 3)


@pytest.mark.parametrize("call, match", [
    (lambda: discounted_returns(REWARDS, 1.5), r"gamma must be in \[0, 1\], got 1.5"),
    (lambda: discounted_returns(REWARDS, -0.1), r"gamma must be in \[0, 1\], got -0.1"),
    (lambda: discounted_returns(REWARDS, float("nan")), r"gamma must be in \[0, 1\], got nan"),
    (lambda: gae(REWARDS, VALUES, None, 0.99, 1.01), r"lam must be in \[0, 1\], got 1.01"),
    (lambda: gae(REWARDS, VALUES, None, 2, 0.9), r"gamma must be in \[0, 1\], got 2.0"),
    (lambda: discounted_returns(REWARDS, 0.9, torch.zeros(6, 3, dtype=torch.bool)),
     r"dones must have the shape of rewards \(5, 3\) or one broadcastable to it, got \(6, 3\)"),
    (lambda: gae(REWARDS, VALUES, torch.zeros(5, dtype=torch.bool), 0.9, 0.9),
     r"dones must have the shape of rewards \(5, 3\) .* got \(5,\)"),
    (lambda: gae(REWARDS, torch.zeros(7, 3), None, 0.9, 0.9),
     r"values must have the shape of rewards with a length of T \+ 1 .* T = 5: expected \(5 or 6, 3\), got \(7, 3\)"),
    (lambda: gae(REWARDS, torch.zeros(4, 3), None, 0.9, 0.9), r"values must .* expected \(5 or 6, 3\), got \(4, 3\)"),
    (lambda: gae(REWARDS, torch.zeros(6, 4), None, 0.9, 0.9), r"values must .* got \(6, 4\)"),
    (lambda: gae(REWARDS, torch.zeros(6), None, 0.9, 0.9), r"values must .* got \(6,\)"),
    (lambda: gae(REWARDS.T, VALUES, None, 0.9, 0.9, dim=1), r"along dim 1, T = 5: expected \(3, 5 or 6\), got \(6, 3\)"),
    (lambda: discounted_returns(REWARDS, torch.full((5,), 0.9)),
     r"gamma must be a number or a tensor broadcastable to the shape of rewards \(5, 3\), got shape \(5,\)"),
    (lambda: gae(REWARDS, VALUES, None, 0.9, torch.full((2, 5, 3), 0.9)), r"lam must be .* got shape \(2, 5, 3\)"),
    (lambda: discounted_returns(REWARDS, 0.9, bootstrap=torch.zeros(5)),
     r"bootstrap must have the shape of rewards without dim 0, \(3,\) .* got \(5,\)"),
    (lambda: discounted_returns(torch.tensor(1.0), 0.9), r"rewards must have a time dim, got a 0-dim tensor"),
])
def test_value_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("call, match", [
    (lambda: discounted_returns(REWARDS, 0.9, dim=2), r"dim must be in \[-2, 1\] for a 2-dim tensor, got 2"),
    (lambda: gae(REWARDS, VALUES, None, 0.9, 0.9, dim=-3), r"dim must be in \[-2, 1\] .* got -3"),
])
def test_dim_out_of_range(call, match):
    """As linrec.linrec: IndexError."""
    with pytest.raises(IndexError, match=match):
        call()


@pytest.mark.parametrize("call, match", [
    (lambda: discounted_returns(torch.zeros(5, 3, dtype=torch.int64), 0.9), r"rewards must be torch.float32, torch.float64, torch.float16 or torch.bfloat16, got torch.int64"),
    (lambda: discounted_returns([1.0, 2.0], 0.9), r"rewards must be a torch.Tensor, got list"),
    (lambda: gae(REWARDS, VALUES.long(), None, 0.9, 0.9), r"values must be torch.float32, .* got torch.int64"),
    (lambda: discounted_returns(REWARDS, "0.9"), r"gamma must be a number in \[0, 1\] or a tensor, got str"),
    (lambda: discounted_returns(REWARDS, True), r"gamma must be a number in \[0, 1\] or a tensor, got bool"),
    (lambda: gae(REWARDS, VALUES, None, 0.9, torch.tensor(1)), r"lam must be a number or a floating-point tensor"),
    (lambda: discounted_returns(REWARDS, 0.9, dim=0.0), r"dim must be an int, got float"),
    (lambda: discounted_returns(REWARDS, 0.9, dim=True), r"dim must be an int, got bool"),
    (lambda: discounted_returns(REWARDS, 0.9, dones=[0, 1]), r"dones must be a torch.Tensor or None, got list"),
    (lambda: discounted_returns(REWARDS, 0.9, bootstrap="v"), r"bootstrap must be a tensor, a number or None"),
])
def test_type_errors(call, match):
    with pytest.raises(TypeError, match=match):
        call()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs two devices")
def test_device_mismatch():
    rewards = torch.zeros(5, 3, device="cuda")
    with pytest.raises(ValueError, match=r"values must be on the device of rewards \(cuda:0\), got cpu"):
        gae(rewards, VALUES, None, 0.9, 0.9)
    with pytest.raises(ValueError, match=r"dones must be on the device of rewards"):
        discounted_returns(rewards, 0.9, torch.zeros(5, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"gamma must be on the device of rewards"):
        discounted_returns(rewards, torch.full((3,), 0.9))
