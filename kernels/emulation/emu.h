// kernels/emulation/emu.h: the CUDA language on the host, for the emulation build (PROPLAB_CUDA=EMULATE).
//
// Every kernels/*.cu is turned at build time (cmake/cuda_emulate.py) into a .cpp that includes this header first;
// each launch `k<T...><<<grid, block, shmem, stream>>>(args)` becomes
// `::proplab::emu::launch("k", grid, block, shmem, stream, [&] { k<T...>(args); })`, and each
// `__shared__ T name[N];` a thread-local static plus a size check. g++ then compiles the kernels as host code.
//
// Invariants:
// - A launch runs synchronously on the calling thread: blocks one after another (x fastest, then y, then z), the
//   threads of a block as fibers (kernels/emulation/emu.cpp) that really interleave at __syncthreads(): every
//   thread runs until it reaches the barrier or returns, then the next phase begins. Work queued before a launch
//   is therefore always complete, and streams need no ordering of their own.
// - threadIdx, blockIdx, blockDim and gridDim read the running fiber's values; __shared__ storage is static and
//   thread-local (blocks do not overlap, so one copy per kernel is enough), and it is NOT cleared between blocks,
//   just as shared memory is uninitialised on a GPU.
// - Undefined behaviour on a GPU aborts with a message naming the kernel, the block and the thread: a barrier
//   reached by some threads of a block while others returned or wait at another __syncthreads, and more than
//   48 KiB of static shared memory in one block. An invalid launch configuration (a block of more than 1024
//   threads, a grid dimension of 0, gridDim.y or z above 65535) launches nothing and leaves
//   cudaErrorInvalidConfiguration as the last error, as the CUDA runtime does.
// - The float intrinsics (__fadd_rn, __fmul_rn, ...) are single IEEE operations, exactly rounded as on the GPU, as
//   long as the compiler contracts nothing: the kernels are compiled with -ffp-contract=off. Library functions
//   (expf, sqrtf, ...) are the host's, whose last-bit results may differ from CUDA's.
#pragma once

#include <cuda_runtime.h>
#include <math_constants.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace proplab::emu {

namespace detail {
// The running fiber's coordinates (set by the scheduler before it switches to a thread).
extern thread_local constinit uint3 thread_idx;
extern thread_local constinit uint3 block_idx;
extern thread_local constinit dim3 block_dim;
extern thread_local constinit dim3 grid_dim;

using Body = void (*)(void* context);
// Runs `body(context)` once per thread of every block of the grid (the fiber scheduler); false when the
// configuration is invalid (nothing ran, the last error is set).
void run_grid(const char* kernel, dim3 grid, dim3 block, std::size_t dynamic_shared, Body body, void* context);
}  // namespace detail

// The emulated kernel launch that cmake/cuda_emulate.py writes in place of <<<grid, block, shmem, stream>>>.
template <typename Grid, typename Block, typename Thread>
void launch(const char* kernel, Grid grid, Block block, std::size_t dynamic_shared, cudaStream_t /*stream*/,
            Thread&& thread) {
  detail::run_grid(
      kernel, dim3(grid), dim3(block), dynamic_shared,
      [](void* context) { (*static_cast<std::remove_reference_t<Thread>*>(context))(); }, &thread);
}
template <typename Grid, typename Block, typename Thread>
void launch(const char* kernel, Grid grid, Block block, Thread&& thread) {
  launch(kernel, grid, block, 0, nullptr, static_cast<Thread&&>(thread));
}
template <typename Grid, typename Block, typename Thread>
void launch(const char* kernel, Grid grid, Block block, std::size_t dynamic_shared, Thread&& thread) {
  launch(kernel, grid, block, dynamic_shared, nullptr, static_cast<Thread&&>(thread));
}

// __syncthreads(): suspends the calling fiber until every thread of the block has reached the same barrier.
void syncthreads(const char* file, int line);

// Registers a static __shared__ array of the running kernel; aborts when the block's total exceeds 48 KiB.
void note_shared(const void* address, std::size_t bytes, const char* name);

}  // namespace proplab::emu

// ---- the CUDA C++ keywords and built-in variables ---------------------------------------------------------------
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#undef __shared__
#undef __constant__
#undef __restrict__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __constant__ static
#define __restrict__ __restrict
// Fallback for a __shared__ declaration cmake/cuda_emulate.py did not rewrite (no size check then).
#define __shared__ static thread_local
#define threadIdx (::proplab::emu::detail::thread_idx)
#define blockIdx (::proplab::emu::detail::block_idx)
#define blockDim (::proplab::emu::detail::block_dim)
#define gridDim (::proplab::emu::detail::grid_dim)
#define __syncthreads() ::proplab::emu::syncthreads(__FILE__, __LINE__)

// ---- device intrinsics: one IEEE operation each (round to nearest even, as the _rn suffix says) -----------------
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __int_as_float(int bits) { return std::bit_cast<float>(bits); }
inline float __uint_as_float(unsigned bits) { return std::bit_cast<float>(bits); }
inline int __float_as_int(float value) { return std::bit_cast<int>(value); }
inline unsigned __float_as_uint(float value) { return std::bit_cast<unsigned>(value); }
inline double __longlong_as_double(long long bits) { return std::bit_cast<double>(bits); }
inline long long __double_as_longlong(double value) { return std::bit_cast<long long>(value); }
inline float __saturatef(float value) {
  return value != value ? 0.0f : value < 0.0f ? 0.0f : value > 1.0f ? 1.0f : value;
}
