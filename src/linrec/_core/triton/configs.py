"""Tuning data of the Triton kernels and the choice of a tile per call: plain numbers, apart from the
kernels, chosen from the layout alone so that a new sequence length never triggers tuning (Triton
compiles one kernel per tile shape and specialization, not per length)."""

from __future__ import annotations

from dataclasses import dataclass

from .layout import Layout

#: Elements of one (BLOCK_L, BLOCK_C) tile: each thread of the program holds TILE_ELEMENTS / (32 *
#: warps) of every operand, enough loads in flight to cover DRAM latency.
TILE_ELEMENTS = 2048
#: Warps of a program, by tile elements: the largest key not above the tile's size.
WARPS_BY_TILE = {0: 1, 256: 2, 512: 4, 4096: 8}
#: The smallest tile length: shorter tiles spend more time on the carry between chunks than on the scan.
MIN_BLOCK_L = 16
#: float32 tiles at least this long take 8 warps: their compensated scan (kernels.py) is bound by the
#: latency of its chains of fused multiply-adds, which more warps hide.
COMPENSATED_8_WARPS_FROM_BLOCK_L = 2048
#: The widest channel block when channels are the contiguous dim: 64 float32 channels are 256 bytes a
#: time step, whole 32-byte sectors; wider blocks only lengthen the per-step reduction of the carry.
MAX_BLOCK_C = 64
#: Fewer programs than this many per multiprocessor leave multiprocessors idle: the channel block
#: narrows (and the tile lengthens) down to MIN_CHANNEL_BYTES of a time step to make more of them.
#: Below SPLIT_BELOW_PROGRAMS_PER_MULTIPROCESSOR the time dim splits into segments, as many as make
#: SPLIT_PROGRAMS_PER_MULTIPROCESSOR programs: the split reads inputs and coefficients twice.
PROGRAMS_PER_MULTIPROCESSOR = 4
SPLIT_BELOW_PROGRAMS_PER_MULTIPROCESSOR = 2
#: A 128-byte line per time step: narrower channel blocks read partial lines.
MIN_CHANNEL_BYTES = 128
SPLIT_PROGRAMS_PER_MULTIPROCESSOR = 8
#: A segment spans at least this many tiles: the split's aggregate pass and carry scan cost as much as
#: a few tiles.
MIN_SEGMENT_TILES = 4


@dataclass(frozen=True)
class TileConfig:
    block_length: int
    block_channels: int
    warps: int


def _power_of_two_at_least(value: int) -> int:
    return 1 << max(value - 1, 0).bit_length()


def _warps(elements: int) -> int:
    return WARPS_BY_TILE[max(key for key in WARPS_BY_TILE if key <= elements)]


def forced(block_length: int, block_channels: int) -> TileConfig:
    """The tile a caller forces (tuning, tests): both powers of two."""
    for name, value in (("block_length", block_length), ("block_channels", block_channels)):
        if value < 1 or value & (value - 1):
            raise ValueError(f"linrec: the Triton kernels' {name} must be a power of two, got {value}")
    return TileConfig(block_length, block_channels, _warps(block_length * block_channels))


def _programs(layout: Layout, block_channels: int) -> int:
    return layout.batch0 * layout.batch1 * -(-layout.channels // block_channels)


def choose(layout: Layout, time_contiguous: bool, element_size: int, multiprocessors: int,
           compensated: bool = False) -> TileConfig:
    """A tile for the layout: the time dim along the tile where it is contiguous, else a block of
    contiguous channels scanned together."""
    length = _power_of_two_at_least(max(layout.length, MIN_BLOCK_L))
    channels = _power_of_two_at_least(layout.channels)
    if time_contiguous:
        block_length = min(length, TILE_ELEMENTS)
        block_channels = min(channels, TILE_ELEMENTS // block_length)
    else:
        block_channels = min(channels, MAX_BLOCK_C)
        narrowest = max(MIN_CHANNEL_BYTES // element_size, 1)
        while (block_channels > narrowest
               and _programs(layout, block_channels) < PROGRAMS_PER_MULTIPROCESSOR * multiprocessors):
            block_channels //= 2
        block_length = min(length, max(TILE_ELEMENTS // block_channels, MIN_BLOCK_L))
    if compensated and block_length >= COMPENSATED_8_WARPS_FROM_BLOCK_L:
        return TileConfig(block_length, block_channels, 8)
    return TileConfig(block_length, block_channels, _warps(block_length * block_channels))


def segment_length(layout: Layout, config: TileConfig, multiprocessors: int) -> int:
    """The time steps one program scans: the whole length, or a segment of it (a multiple of the tile
    length) where the rows and channel blocks alone would leave multiprocessors idle."""
    programs = _programs(layout, config.block_channels)
    wanted = -(-SPLIT_PROGRAMS_PER_MULTIPROCESSOR * multiprocessors // programs)
    segments = min(wanted, layout.length // (MIN_SEGMENT_TILES * config.block_length))
    if programs >= SPLIT_BELOW_PROGRAMS_PER_MULTIPROCESSOR * multiprocessors or segments < 2:
        return layout.length
    tiles = -(-layout.length // (segments * config.block_length))
    return tiles * config.block_length
