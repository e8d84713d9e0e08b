// kernels/embedding: the CUDA side of the token and position embeddings (proplab::ops::embedding_forward/backward
// in src/ops/ops.h, and the vocab-parallel embedding_shard_* and position_add_* of src/ops/vocab_parallel.h, whose
// CPU implementations are the reference).
//
// A table holds the rows of token ids [first, first + rows); ids outside that range look up zeros and receive no
// gradient (the whole table: first = 0, rows = vocabulary size, ids already checked to lie inside).
//
// Invariants:
// - Forward is elementwise and bitwise the CPU's (one float addition where a position row is added).
// - Backward ACCUMULATES into the tables, without atomics and bitwise as the CPU: the (id, position) pairs are
//   sorted by id with a stable radix sort (cub::DeviceRadixSort::SortPairs, so positions stay ascending within an
//   id), and one thread per (id, feature) adds its gradients in position order, in float, onto the table's value;
//   d_pos[t] receives d_y[b, t] in b order likewise.
// - Everything is enqueued on context().stream; temporaries (sort buffers) come from kernels::Scratch; nothing
//   synchronises. Device pointers throughout; y, d_y of [positions, features] with positions = batch · seq.
// - Host-compilable.
#pragma once

#include <cstdint>

namespace proplab::kernels {

// y[p] = table[ids[p] − first] (zeros when ids[p] − first is outside [0, rows)), plus pos[p % seq] when pos is
// given; y overwritten.
void embedding_gather(const std::int32_t* ids, std::int64_t positions, std::int64_t seq, const float* table,
                      std::int64_t first, std::int64_t rows, const float* pos, std::int64_t features, float* y);

// y[p] += pos[p % seq] over positions = batch · seq rows.
void position_add(const float* pos, std::int64_t positions, std::int64_t seq, std::int64_t features, float* y);

// d_table[ids[p] − first] += d_y[p] for the ids inside [first, first + rows), each element in position order.
void embedding_table_backward(const std::int32_t* ids, std::int64_t positions, std::int64_t first, std::int64_t rows,
                              const float* d_y, std::int64_t features, float* d_table);

// d_pos[t] += Σ_b d_y[b, t] in b order, t < seq.
void position_backward(const float* d_y, std::int64_t batch, std::int64_t seq, std::int64_t features, float* d_pos);

}  // namespace proplab::kernels
