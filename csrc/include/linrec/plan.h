// A call's launch plan: what make_plan (cuda_launch.h) decides once per call from its params. The op
// layer then allocates the workspace the plan asks for and launches the plan. Host-only, torch-free.
#pragma once

#include <cstdint>

namespace linrec {

// The kernel families a call can be planned on; each is a directory of csrc/include/linrec/ with its
// policy (tuning data and compiled configs), agent, kernels and plan: Pipe (pipe/), every layout on
// every GPU; Bulk (bulk/), strided time with contiguous channels on sm_90 and newer.
enum class Family : int8_t { Pipe, Bulk };

// How a sequence's tiles are distributed: all to one segment that carries the output from tile to
// tile (Pipe), or one tile per block, chained by look-back (Chained).
enum class Schedule : int8_t { Pipe, Chained };

// The backward kernel is compiled in variants, so that the code of features a call does not use takes
// no registers (and occupancy) from it: Plain rows; Packed sequences (cu_seqlens); and Summing the
// coefficient gradient into broadcast coefficients' shape, packed or not. A runtime branch between
// summing and storing in one kernel keeps the registers of both paths live in both. The forward
// kernel is one, packed or not (docs/design.md, Broadcast coefficients and packed sequences).
enum class Variant : int8_t { Plain, Packed, Summing };

struct Plan {
  Family family = Family::Pipe;
  int config = 0;                      // index of the family's compiled config (pipe/policy.cuh: kPipeConfigs;
                                       // bulk: 1 for a reverse scan, else 0)
  Schedule schedule = Schedule::Pipe;  // the config's
  Variant variant = Variant::Plain;
  bool channel_pairs = false;          // 16-bit channels scanned two at a time (pipe/plan.cuh: pair_channels)
  int64_t grid_blocks = 0;
  int64_t workspace_bytes = 0;         // zeroed and 16-byte aligned, passed as params.workspace; 0: none
};

}  // namespace linrec
