// cub/device/device_radix_sort.cuh for the emulated GPU (PROPLAB_CUDA=EMULATE): found before the CUDA toolkit's
// CUB on the include path of the emulated kernels. Implements the one overload proplab uses,
// cub::DeviceRadixSort::SortPairs on device (here host) arrays, with CUB's two-phase contract.
//
// Invariants:
// - With d_temp_storage == nullptr it only sets temp_storage_bytes (never 0) and returns cudaSuccess; otherwise it
//   needs at least that many bytes (cudaErrorInvalidValue otherwise, as CUB's own check).
// - The sort is stable and orders by bits [begin_bit, end_bit) of the unsigned key only, as a radix sort over those
//   bits does; keys_out receives the whole keys. Inputs are left untouched.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

namespace cub {

struct DeviceRadixSort {
  template <typename KeyT, typename ValueT, typename NumItemsT>
  static cudaError_t SortPairs(void* d_temp_storage, std::size_t& temp_storage_bytes, const KeyT* d_keys_in,
                               KeyT* d_keys_out, const ValueT* d_values_in, ValueT* d_values_out, NumItemsT num_items,
                               int begin_bit = 0, int end_bit = sizeof(KeyT) * 8, cudaStream_t stream = 0) {
    static_assert(std::is_integral_v<KeyT> && std::is_unsigned_v<KeyT>,
                  "the emulated SortPairs handles unsigned integer keys only");
    (void)stream;
    const auto items = static_cast<std::size_t>(num_items < 0 ? 0 : num_items);
    const std::size_t needed = 256 + items * (sizeof(KeyT) + sizeof(ValueT));
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = needed;
      return cudaSuccess;
    }
    if (temp_storage_bytes < needed || begin_bit < 0 || end_bit > static_cast<int>(sizeof(KeyT) * 8) ||
        begin_bit > end_bit)
      return cudaErrorInvalidValue;
    const int bits = end_bit - begin_bit;
    const std::uint64_t mask = bits >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << bits) - 1;
    auto digit = [&](std::size_t i) { return (static_cast<std::uint64_t>(d_keys_in[i]) >> begin_bit) & mask; };
    std::vector<std::size_t> order(items);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return digit(a) < digit(b); });
    std::vector<KeyT> keys(items);
    std::vector<ValueT> values(items);
    for (std::size_t i = 0; i < items; ++i) {
      keys[i] = d_keys_in[order[i]];
      values[i] = d_values_in[order[i]];
    }
    std::copy(keys.begin(), keys.end(), d_keys_out);
    std::copy(values.begin(), values.end(), d_values_out);
    return cudaSuccess;
  }
};

}  // namespace cub
