// kernels/index_check: finding the first integer id outside a range on the device (token ids, class targets), so
// that an op can refuse out-of-range ids with the same error as its CPU reference before it writes anything.
//
// Invariants:
// - The answer is the smallest offending index (a minimum, independent of the order blocks run in); the geometry
//   depends only on the count.
// - The call waits for the GPU (the host needs the answer). Enqueued on context().stream. Host-compilable.
#pragma once

#include <cstdint>

namespace proplab::kernels {

struct IdOutside {
  std::int64_t index = 0;  // the first i with ids[i] outside [lo, hi), or the count when there is none
  std::int32_t value = 0;  // ids[index] when there is one
};

// The first of ids[0, n) (a device pointer) outside [lo, hi).
IdOutside first_id_outside(const std::int32_t* ids, std::int64_t n, std::int64_t lo, std::int64_t hi);

}  // namespace proplab::kernels
