"""Maps a call's operands onto the (batch0, batch1, time, channels) strided view the Triton kernels
address: the dims before the time dim merge into at most two batch dims, those after it into one
channel dim, wherever every operand's strides allow it (as TensorIterator coalesces dims). Without
channel dims (time last), the innermost batch dim takes the channels' place, so that one program
scans a block of neighbouring rows. Nothing is copied; a layout that does not merge returns None."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

Strides = tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """Sizes of the four dims, and each operand's (batch0, batch1, time, channels) strides."""

    batch0: int
    batch1: int
    length: int
    channels: int
    strides: tuple[tuple[int, int, int, int], ...]

    def extent(self) -> int:
        """The largest element offset past its start that any operand's view reaches, plus one."""
        sizes = (self.batch0, self.batch1, self.length, self.channels)
        return max(sum((size - 1) * stride for size, stride in zip(sizes, operand)) for operand in self.strides) + 1


def _merged(sizes: list[int], strides: list[Strides]) -> list[tuple[int, list[int]]]:
    """The dims of `sizes` with dims of size 1 dropped and neighbours merged where every operand steps
    through them as one dim: (size, one stride per operand), outermost first."""
    merged: list[tuple[int, list[int]]] = []
    for dim, size in enumerate(sizes):
        if size == 1:
            continue
        dim_strides = [operand[dim] for operand in strides]
        if merged:
            outer_size, outer_strides = merged[-1]
            if all(outer == inner * size for outer, inner in zip(outer_strides, dim_strides)):
                merged[-1] = (outer_size * size, dim_strides)
                continue
        merged.append((size, dim_strides))
    return merged


@lru_cache(maxsize=4096)  # the layers of a model call with the same few layouts: plan each once
def plan(shape: tuple[int, ...], dim: int, strides: tuple[Strides, ...]) -> Layout | None:
    """The four-dim view of operands of `shape` (each given by its strides, 0 where it broadcasts)
    scanned along `dim`, or None when their strides do not merge into it."""
    operands = len(strides)
    batch = _merged(list(shape[:dim]), [operand[:dim] for operand in strides])
    channels = _merged(list(shape[dim + 1 :]), [operand[dim + 1 :] for operand in strides])
    if not channels and batch:
        channels = [batch.pop()]
    if len(batch) > 2 or len(channels) > 1:
        return None
    unit = (1, [0] * operands)
    batch = [unit] * (2 - len(batch)) + batch
    channel = channels[0] if channels else unit
    return Layout(
        batch0=batch[0][0],
        batch1=batch[1][0],
        length=shape[dim],
        channels=channel[0],
        strides=tuple(
            (batch[0][1][k], batch[1][1][k], strides[k][dim], channel[1][k]) for k in range(operands)
        ),
    )
