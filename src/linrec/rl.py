"""Reinforcement-learning targets as reverse linear recurrences: discounted returns and GAE.

Both run one reverse ``linrec`` scan over the time dim of a rollout, with the discount cut to zero
where an episode ends, so a whole batch of environments is computed at once, at any length, and is
differentiable in every floating-point argument.

>>> import torch, linrec
>>> rewards = torch.ones(5, 2)                                  # (time, envs)
>>> dones = torch.tensor([[0, 0], [1, 0], [0, 0], [0, 0], [0, 1]], dtype=torch.bool)
>>> linrec.rl.discounted_returns(rewards, 0.5, dones)[:, 0]     # env 0 ends after step 1
tensor([1.5000, 1.0000, 1.7500, 1.5000, 1.0000])
>>> values = torch.zeros(6, 2)                                  # V(s_0), ..., V(s_5): length T + 1
>>> advantages, returns = linrec.rl.gae(rewards, values, dones, gamma=0.5, lam=1.0)

The ``dones`` convention, and CleanRL's and Stable-Baselines3's
-----------------------------------------------------------------
Here ``dones[t]`` true means the episode ended *after step t*: ``rewards[t]`` was its last reward, and
nothing after step t reaches step t. CleanRL's PPO buffers store the other convention: ``dones[t]`` true
means ``obs[t]`` *starts* a new episode (the step before it ended one), with ``next_done`` for the step
after the rollout; Stable-Baselines3's ``RolloutBuffer`` stores the same as ``episode_starts``, with the
last step's ``dones`` passed to ``compute_returns_and_advantage``. Passed unchanged, such a buffer raises
nothing and gives wrong advantages. Shift it by one step first::

    dones = torch.cat([dones[1:], next_done[None]])             # CleanRL: (time, envs) buffers
    dones = torch.cat([episode_starts[1:], last_dones[None]])   # SB3's names, as tensors

and pass the values with the bootstrap value appended, ``torch.cat([values, next_value.reshape(1, -1)])``:
``gae(rewards, values, dones, gamma, lam)`` then gives CleanRL's ``advantages`` and ``returns``.
"""

from __future__ import annotations

import numbers
import warnings
from typing import NamedTuple

import torch

from ._core.checks import check_device, check_dtype, check_tensor, is_broadcastable, normalize_dim, type_name
from .scan import linrec

__all__ = ["GAE", "MissingBootstrapWarning", "discounted_returns", "gae"]

#: A discount (gamma) or trace decay (lam): a Python number in [0, 1], or a tensor broadcastable to the rewards.
Discount = float | torch.Tensor

_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
#: 16-bit inputs are computed in float32: gamma = 0.99 is 0.98828125 in bfloat16, off by 15 % after 100 steps.
_COMPUTE_DTYPE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


class MissingBootstrapWarning(UserWarning):
    """:func:`gae` got values without the bootstrap value V(s_T) for a rollout whose last step does not end every
    environment's episode: V(s_T) = 0 is taken there, which is rarely what a truncated rollout means."""


class GAE(NamedTuple):
    """What :func:`gae` returns: unpack it (``advantages, returns = gae(...)``) or use the fields."""

    #: The GAE(lambda) advantages A_t, of the rewards' shape.
    advantages: torch.Tensor
    #: The value targets ``advantages + values`` (the values of states 0..T-1), of the rewards' shape.
    returns: torch.Tensor


def discounted_returns(
    rewards: torch.Tensor,
    gamma: Discount,
    dones: torch.Tensor | None = None,
    dim: int = 0,
    bootstrap: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """The discounted returns ``G[t] = rewards[t] + gamma * (1 - dones[t]) * G[t+1]`` along ``dim``.

    The sum runs backward from the last step: ``G[T-1] = rewards[T-1] + gamma * (1 - dones[T-1]) * bootstrap``
    (``bootstrap`` is 0 when not given). One reverse :func:`linrec.linrec` scan computes it, for every
    environment at once.

    Args:
        rewards: the rewards, any shape with a time dim ``dim``, float32, float64, float16 or bfloat16
            (16-bit rewards are summed in float32 and the returns rounded to their dtype).
        gamma: the discount, a Python number in [0, 1], or a floating-point tensor that broadcasts to
            ``rewards`` (torch's rules, trailing dims first: ``(envs,)`` for ``(time, envs)`` rewards,
            ``(envs, 1)`` for ``(envs, time)``), differentiable; tensor values are not range-checked.
        dones: where episodes end, of ``rewards``' shape or broadcastable to it, bool (or 0/1 numbers):
            ``dones[t]`` true means the episode ended after step t, so ``G[t] = rewards[t]`` and nothing
            flows back across it (not CleanRL's or SB3's "obs[t] starts an episode": the module's
            docstring gives the one-line shift). ``None``: no episode ends in the rollout. A time-limit
            truncation is a done too; to bootstrap it, add ``gamma * V(final observation)`` to that
            step's reward.
        dim: the time dim; the default 0 fits rollouts stored as ``(time, envs, ...)``.
        bootstrap: the value of the state after the last step (the critic's estimate where the rollout
            was cut), of ``rewards``' shape without ``dim`` (or broadcastable to it), or a number;
            differentiable. It reaches ``G[T-1]`` through ``gamma * (1 - dones[T-1])``, so an episode
            that ended at the last step ignores it.

    Returns:
        The returns, of ``rewards``' shape and dtype.

    Raises:
        ValueError: a shape that does not match, ``gamma`` outside [0, 1], or a tensor on another
            device. IndexError: ``dim`` out of range. TypeError: an argument of the wrong type or dtype.

    Example:
        >>> rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0]])           # (envs, time)
        >>> dones = torch.tensor([[False, True, False, False]])      # the episode ends after step 1
        >>> discounted_returns(rewards, 0.9, dones, dim=1)
        tensor([[1.9000, 1.0000, 1.9000, 1.0000]])
        >>> discounted_returns(rewards, 0.9, dones, dim=1, bootstrap=torch.tensor([10.0]))
        tensor([[ 1.9000,  1.0000, 10.0000, 10.0000]])
    """
    op = "linrec.rl.discounted_returns"
    _check_floating(op, "rewards", rewards)
    dim = _time_dim(op, dim, rewards)
    dtype = _COMPUTE_DTYPE.get(rewards.dtype, rewards.dtype)
    discounts = _discount(op, "gamma", gamma, rewards, dtype)
    continues = _continues(op, dones, rewards, dtype)
    if continues is not None:
        discounts = discounts * continues
    initial = _bootstrap(op, bootstrap, rewards, dim, dtype)
    returns = linrec(rewards.to(dtype), discounts, dim=dim, reverse=True, initial=initial)
    return returns.to(rewards.dtype)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor | None,
    gamma: Discount,
    lam: Discount,
    dim: int = 0,
) -> GAE:
    """Generalized advantage estimation: the advantages GAE(gamma, lambda) and the value targets.

    With ``V = values`` and ``m[t] = 1 - dones[t]``, along ``dim``::

        delta[t] = rewards[t] + gamma * m[t] * V[t+1] - V[t]
        A[t]     = delta[t] + gamma * lam * m[t] * A[t+1]        (A[T] = 0)

    computed by one reverse :func:`linrec.linrec` scan for every environment at once. ``lam = 1`` gives
    the discounted returns minus the values, ``lam = 0`` the one-step TD errors.

    Args:
        rewards: the rewards r_0..r_{T-1}, any shape with a time dim ``dim`` of length T, float32,
            float64, float16 or bfloat16 (16-bit inputs are computed in float32, the results rounded).
        values: the critic's values, of ``rewards``' shape except along ``dim``, where the length is
            either T + 1: V(s_0)..V(s_T), the last one the bootstrap value of the state after the last
            step, or T: V(s_0)..V(s_{T-1}), with V(s_T) = 0 (no bootstrap; a MissingBootstrapWarning
            when the last step does not end every environment's episode, where the rollout was cut and
            V(s_T) is usually the critic's value of the next observation: CleanRL's ``next_value``).
            Differentiable; the results take the dtype of ``rewards`` and ``values`` promoted together.
        dones: where episodes end, of ``rewards``' shape or broadcastable to it, bool (or 0/1 numbers):
            ``dones[t]`` true means the episode ended after step t, so neither V[t+1] nor A[t+1] reaches
            step t. CleanRL's and SB3's buffers mark the step that starts an episode instead: shift
            them with ``dones = torch.cat([dones[1:], next_done[None]])`` (the module's docstring has
            the details). ``None``: no episode ends in the rollout.
        gamma: the discount, a Python number in [0, 1] or a floating-point tensor that broadcasts to
            ``rewards`` (per environment, ...), differentiable; tensor values are not range-checked.
        lam: the GAE lambda, in [0, 1], a number or a tensor like ``gamma``.
        dim: the time dim; the default 0 fits rollouts stored as ``(time, envs, ...)``.

    Returns:
        ``GAE(advantages, returns)``, a named tuple of two tensors of ``rewards``' shape, where
        ``returns = advantages + values`` (over states 0..T-1) are the targets of the value loss.

    Raises:
        ValueError: a shape that does not match (``values``' length included), ``gamma`` or ``lam``
            outside [0, 1], or a tensor on another device. IndexError: ``dim`` out of range.
            TypeError: an argument of the wrong type or dtype.

    Example:
        >>> rewards = torch.tensor([[1.0], [0.0], [1.0]])            # (time, envs): T = 3, one env
        >>> values = torch.tensor([[0.5], [0.5], [0.5], [2.0]])      # V(s_0)..V(s_3), s_3 bootstraps
        >>> dones = torch.tensor([[False], [True], [False]])         # the episode ends after step 1
        >>> advantages, returns = gae(rewards, values, dones, gamma=0.5, lam=0.5)
        >>> advantages[:, 0]                                         # deltas: 0.75, -0.5, 1.5
        tensor([ 0.6250, -0.5000,  1.5000])
        >>> returns[:, 0]
        tensor([1.1250, 0.0000, 2.0000])
    """
    op = "linrec.rl.gae"
    _check_floating(op, "rewards", rewards)
    dim = _time_dim(op, dim, rewards)
    _check_floating(op, "values", values)
    check_device(op, "values", values, "rewards", rewards.device)
    length = rewards.shape[dim]
    expected = list(rewards.shape)
    if values.dim() != rewards.dim() or any(
        v != r for d, (v, r) in enumerate(zip(values.shape, rewards.shape)) if d != dim
    ) or values.shape[dim] not in (length, length + 1):
        expected[dim] = f"{length} or {length + 1}"
        raise ValueError(
            f"{op}: values must have the shape of rewards with a length of T + 1 (with the bootstrap value) "
            f"or T (without) along dim {dim}, T = {length}: expected {_shape(expected)}, got {_shape(values.shape)}"
        )
    out_dtype = torch.promote_types(rewards.dtype, values.dtype)
    dtype = _COMPUTE_DTYPE.get(out_dtype, out_dtype)
    discounts = _discount(op, "gamma", gamma, rewards, dtype)
    decay = _discount(op, "lam", lam, rewards, dtype)
    continues = _continues(op, dones, rewards, dtype)
    if continues is not None:
        discounts = discounts * continues
    values = values.to(dtype)
    if values.shape[dim] == length:  # no bootstrap: the state after the last step is worth 0
        _warn_if_cut(op, dones, rewards, dim)
        slot = list(values.shape)
        slot[dim] = 1
        values = torch.cat([values, values.new_zeros(slot)], dim)
    current, following = values.narrow(dim, 0, length), values.narrow(dim, 1, length)
    deltas = rewards.to(dtype) + discounts * following - current
    advantages = linrec(deltas, discounts * decay, dim=dim, reverse=True)
    return GAE(advantages.to(out_dtype), (advantages + current).to(out_dtype))


def _shape(shape) -> str:
    return "(" + ", ".join(str(size) for size in shape) + ("," if len(shape) == 1 else "") + ")"


def _check_floating(op: str, name: str, tensor: object) -> None:
    check_tensor(op, name, tensor)
    check_dtype(op, name, tensor, _FLOAT_DTYPES)


def _time_dim(op: str, dim: object, rewards: torch.Tensor) -> int:
    if rewards.dim() == 0:
        raise ValueError(f"{op}: rewards must have a time dim, got a 0-dim tensor")
    return normalize_dim(op, dim, rewards.dim())


def _discount(op: str, name: str, value: object, rewards: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """gamma or lam as a tensor of ``dtype`` on the rewards' device, broadcastable to the rewards."""
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point():
            raise TypeError(f"{op}: {name} must be a number or a floating-point tensor, got a {value.dtype} tensor")
        if value.dim() > 0:  # a 0-dim tensor may live on the CPU, as in torch's arithmetic
            check_device(op, name, value, "rewards", rewards.device)
        if not is_broadcastable(value.shape, rewards.shape):
            raise ValueError(
                f"{op}: {name} must be a number or a tensor broadcastable to the shape of rewards "
                f"{_shape(rewards.shape)}, got shape {_shape(value.shape)}"
            )
        return value.to(device=rewards.device, dtype=dtype)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{op}: {name} must be a number in [0, 1] or a tensor, got {type_name(value)}")
    value = float(value)
    if not 0.0 <= value <= 1.0:  # NaN fails too
        raise ValueError(f"{op}: {name} must be in [0, 1], got {value}")
    return torch.full((), value, dtype=dtype, device=rewards.device)


def _continues(op: str, dones: object, rewards: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """``1 - dones`` in ``dtype``: 1 where the episode goes on after the step, 0 where it ends."""
    check_tensor(op, "dones", dones, or_none=True)
    if dones is None:
        return None
    if dones.is_complex():
        raise TypeError(f"{op}: dones must be bool (or 0/1 numbers), got {dones.dtype}")
    check_device(op, "dones", dones, "rewards", rewards.device)
    if not is_broadcastable(dones.shape, rewards.shape):
        raise ValueError(
            f"{op}: dones must have the shape of rewards {_shape(rewards.shape)} or one broadcastable to it, "
            f"got {_shape(dones.shape)}"
        )
    if dones.dtype == torch.bool:
        return (~dones).to(dtype)
    return 1 - dones.to(dtype)


def _warn_if_cut(op: str, dones: torch.Tensor | None, rewards: torch.Tensor, dim: int) -> None:
    """A MissingBootstrapWarning where the rollout's last step does not end every environment's episode (which reads
    ``dones`` on the host: one synchronization of a GPU, not made under torch.compile)."""
    length = rewards.shape[dim]
    if length == 0 or rewards.numel() == 0:
        return
    if dones is None:
        cut = True
    elif torch.compiler.is_compiling():
        return
    else:
        cut = not bool(torch.broadcast_to(dones, rewards.shape).narrow(dim, length - 1, 1).all())
    if cut:
        warnings.warn(
            f"{op}: values has length T = {length} along dim {dim} (no bootstrap value), but the last step does not "
            "end every environment's episode: V(s_T) = 0 is taken there. Pass V(s_T), the critic's value of the "
            "observation after the last step (CleanRL's next_value), as values' last entry (length T + 1); zeros "
            "there keep these targets without this warning",
            MissingBootstrapWarning, stacklevel=3)


def _bootstrap(op: str, bootstrap: object, rewards: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor | None:
    """The bootstrap value as linrec's ``initial``: the rewards' shape without ``dim``."""
    if bootstrap is None:
        return None
    state = rewards.shape[:dim] + rewards.shape[dim + 1:]
    if isinstance(bootstrap, torch.Tensor):
        if not bootstrap.is_floating_point():
            raise TypeError(f"{op}: bootstrap must be a floating-point tensor or a number, got {bootstrap.dtype}")
        check_device(op, "bootstrap", bootstrap, "rewards", rewards.device)
        if not is_broadcastable(bootstrap.shape, state):
            raise ValueError(
                f"{op}: bootstrap must have the shape of rewards without dim {dim}, {_shape(state)} "
                f"(or one broadcastable to it), got {_shape(bootstrap.shape)}"
            )
        return bootstrap.to(dtype).expand(state)
    if isinstance(bootstrap, bool) or not isinstance(bootstrap, numbers.Real):
        raise TypeError(f"{op}: bootstrap must be a tensor, a number or None, got {type_name(bootstrap)}")
    return torch.full(state, float(bootstrap), dtype=dtype, device=rewards.device)
