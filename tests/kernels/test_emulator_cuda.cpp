// The emulated GPU itself (PROPLAB_CUDA=EMULATE, kernels/emulation): that threads of a block really meet at
// __syncthreads, that the built-in coordinates are right, that what is undefined on a GPU aborts and an invalid
// launch fails as the CUDA runtime's does, that the fake runtime's memory checks and limit work, and that
// kernels::gemm (kernels/matmul.cu on the emulated cuBLASLt) computes row-major products with every transpose,
// leading dimension, alpha, beta and bias. Compiled to nothing in other builds.
#ifdef PROPLAB_CUDA_EMULATED

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/emulation/emu.h"
#include "kernels/matmul.cuh"

namespace {

constexpr int kThreads = 256;

__global__ void rotate_through_shared(const int* in, int* out) {
  static thread_local int shared[kThreads];
  proplab::emu::note_shared(&shared, sizeof shared, "shared");
  const int t = static_cast<int>(threadIdx.x);
  const int base = static_cast<int>(blockIdx.x) * kThreads;
  shared[t] = in[base + t];
  __syncthreads();  // every write above happens before any read below
  const int next = shared[(t + 1) % kThreads];
  __syncthreads();
  shared[t] = next * 2;
  __syncthreads();
  out[base + t] = shared[(t + kThreads - 1) % kThreads];
}

__global__ void write_coordinates(unsigned* out) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  out[block * blockDim.x * blockDim.y * blockDim.z + thread] = block * 10000 + thread;
}

__global__ void divergent_return(int* out) {
  if (threadIdx.x == 3) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void divergent_sites(int* out) {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

__global__ void too_much_shared(float* out) {
  static thread_local float shared[13 * 1024];  // 52 KiB
  proplab::emu::note_shared(&shared, sizeof shared, "shared");
  shared[threadIdx.x] = 1.0f;
  out[threadIdx.x] = shared[threadIdx.x];
}

TEST(CudaEmulator, ThreadsOfABlockMeetAtEveryBarrier) {
  const int blocks = 3;
  std::vector<int> in(blocks * kThreads), out(in.size(), -1);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int>(i) * 7;
  proplab::emu::launch("rotate_through_shared", blocks, kThreads, 0, nullptr,
                       [&] { rotate_through_shared(in.data(), out.data()); });
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  // Thread t - 1 doubled what thread t wrote, and thread t reads it back: 2 * in[t] only if every phase ended
  // before the next began.
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(out[b * kThreads + t], 2 * in[b * kThreads + t]) << b << "," << t;
}

TEST(CudaEmulator, BuiltInCoordinatesCoverTheGridOnce) {
  const dim3 grid(4, 3, 2), block(8, 4, 2);
  const unsigned threads = 8 * 4 * 2, total = 4 * 3 * 2 * threads;
  std::vector<unsigned> out(total, 0xffffffffu);
  proplab::emu::launch("write_coordinates", grid, block, 0, nullptr, [&] { write_coordinates(out.data()); });
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (unsigned i = 0; i < total; ++i) EXPECT_EQ(out[i], (i / threads) * 10000 + i % threads) << i;
}

TEST(CudaEmulator, AnInvalidConfigurationLaunchesNothing) {
  std::vector<unsigned> out(4096, 7u);
  proplab::emu::launch("write_coordinates", 1, 2048, 0, nullptr, [&] { write_coordinates(out.data()); });
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  proplab::emu::launch("write_coordinates", dim3(1, 70000), 32, 0, nullptr, [&] { write_coordinates(out.data()); });
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  for (unsigned value : out) EXPECT_EQ(value, 7u);
}

TEST(CudaEmulatorDeathTest, UndefinedBehaviourAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<int> out(64, 0);
  std::vector<float> floats(64, 0.0f);
  EXPECT_DEATH(proplab::emu::launch("divergent_return", 1, 64, 0, nullptr, [&] { divergent_return(out.data()); }),
               "divergent __syncthreads in kernel divergent_return.*thread \\(3,0,0\\) returned");
  EXPECT_DEATH(proplab::emu::launch("divergent_sites", 1, 64, 0, nullptr, [&] { divergent_sites(out.data()); }),
               "divergent __syncthreads in kernel divergent_sites");
  EXPECT_DEATH(proplab::emu::launch("too_much_shared", 1, 64, 0, nullptr, [&] { too_much_shared(floats.data()); }),
               "kernel too_much_shared uses 53248 bytes of static shared memory");
}

TEST(CudaEmulator, RuntimeChecksMemory) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1024), cudaSuccess);
  std::vector<char> host(2048, 1);
  EXPECT_EQ(cudaMemcpy(p, host.data(), 1024, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host.data(), 1025, cudaMemcpyHostToDevice), cudaErrorInvalidValue);  // past the end
  EXPECT_EQ(cudaMemcpy(host.data(), p, 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);    // kinds swapped
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  std::size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  void* huge = nullptr;
  EXPECT_EQ(cudaMalloc(&huge, total_bytes), cudaErrorMemoryAllocation);
  EXPECT_EQ(huge, nullptr);
  cudaGetLastError();
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_STREQ(prop.name, "proplab CUDA emulator");
  EXPECT_EQ(prop.major, 9);
}

// cudaPointerGetAttributes tells device memory (interior pointers included) from pinned and unregistered host
// memory as the CUDA runtime does; the devices are PROPLAB_EMU_DEVICES (1 unless the test environment sets it).
TEST(CudaEmulator, RuntimeKnowsPointersDevicesAndEvents) {
  int devices = 0, device = -1;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  ASSERT_GE(devices, 1);
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, 0);
  EXPECT_EQ(cudaSetDevice(devices), cudaErrorInvalidDevice);
  cudaDeviceProp prop{};
  EXPECT_EQ(cudaGetDeviceProperties(&prop, devices), cudaErrorInvalidDevice);
  cudaGetLastError();

  void *d = nullptr, *pinned = nullptr, *mapped = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 1000), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&pinned, 64), cudaSuccess);
  ASSERT_EQ(cudaHostAlloc(&mapped, 64, cudaHostAllocMapped), cudaSuccess);
  std::vector<char> plain(16);
  cudaPointerAttributes a{};
  ASSERT_EQ(cudaPointerGetAttributes(&a, static_cast<char*>(d) + 999), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  EXPECT_EQ(a.device, 0);
  EXPECT_EQ(a.devicePointer, static_cast<char*>(d) + 999);
  EXPECT_EQ(a.hostPointer, nullptr);
  ASSERT_EQ(cudaPointerGetAttributes(&a, static_cast<char*>(d) + 1000), cudaSuccess);  // one past the end
  EXPECT_NE(a.type, cudaMemoryTypeDevice);
  for (void* host : {pinned, mapped}) {
    ASSERT_EQ(cudaPointerGetAttributes(&a, host), cudaSuccess);
    EXPECT_EQ(a.type, cudaMemoryTypeHost);
    EXPECT_EQ(a.devicePointer, host);
    EXPECT_EQ(a.hostPointer, host);
  }
  ASSERT_EQ(cudaPointerGetAttributes(&a, plain.data()), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  EXPECT_EQ(a.devicePointer, nullptr);
  EXPECT_EQ(a.hostPointer, plain.data());
  // Pinned memory is host memory to copies and does not count against the device's memory.
  std::size_t free_before = 0, free_after = 0;
  cudaMemGetInfo(&free_before, nullptr);
  void* more = nullptr;
  ASSERT_EQ(cudaMallocHost(&more, 1 << 20), cudaSuccess);
  cudaMemGetInfo(&free_after, nullptr);
  EXPECT_EQ(free_before, free_after);
  EXPECT_EQ(cudaMemcpy(d, pinned, 64, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(more), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(mapped), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(plain.data()), cudaErrorInvalidValue);
  cudaGetLastError();
  EXPECT_EQ(cudaFree(d), cudaSuccess);

  cudaEvent_t start = nullptr, end = nullptr;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&end), cudaSuccess);
  float ms = -1.0f;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, end), cudaSuccess);
  EXPECT_EQ(ms, 0.0f);
  int least = -1, greatest = -1;
  EXPECT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  EXPECT_EQ(least, 0);
  EXPECT_EQ(greatest, 0);
}

// kernels::gemm against a naive row-major product, for every transpose pair, padded leading dimensions, alpha,
// beta and bias.
TEST(CudaEmulator, GemmMatchesANaiveProduct) {
  const std::int64_t m = 5, n = 7, k = 3, pad = 2;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (int with_bias = 0; with_bias < 2; ++with_bias) {
        const std::int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
        const std::int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
        std::vector<float> a(static_cast<std::size_t>(a_rows * lda)), b(static_cast<std::size_t>(b_rows * ldb)),
            c(static_cast<std::size_t>(m * ldc)), bias(static_cast<std::size_t>(n));
        for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(static_cast<int>(i % 11) - 5) * 0.5f;
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(static_cast<int>(i % 7) - 3) * 0.25f;
        for (std::size_t i = 0; i < c.size(); ++i) c[i] = static_cast<float>(i % 5);
        for (std::size_t i = 0; i < bias.size(); ++i) bias[i] = static_cast<float>(i) * 0.125f;
        const float alpha = 1.5f, beta = 0.5f;
        std::vector<float> expected = c;
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < n; ++j) {
            double sum = 0.0;
            for (std::int64_t l = 0; l < k; ++l)
              sum += static_cast<double>(ta ? a[l * lda + i] : a[i * lda + l]) *
                     static_cast<double>(tb ? b[j * ldb + l] : b[l * ldb + j]);
            expected[i * ldc + j] =
                static_cast<float>(alpha * sum + beta * c[i * ldc + j] + (with_bias ? bias[j] : 0.0f));
          }
        void *da, *db, *dc, *dbias;
        ASSERT_EQ(cudaMalloc(&da, a.size() * 4), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&db, b.size() * 4), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&dc, c.size() * 4), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&dbias, bias.size() * 4), cudaSuccess);
        cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(dc, c.data(), c.size() * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(dbias, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice);
        proplab::kernels::gemm(ta, tb, m, n, k, da, lda, db, ldb, static_cast<float*>(dc), ldc, alpha, beta,
                               with_bias ? static_cast<const float*>(dbias) : nullptr);
        std::vector<float> got(c.size());
        cudaMemcpy(got.data(), dc, got.size() * 4, cudaMemcpyDeviceToHost);
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < n; ++j)
            EXPECT_FLOAT_EQ(got[i * ldc + j], expected[i * ldc + j])
                << "trans " << ta << tb << " bias " << with_bias << " at " << i << "," << j;
        for (std::int64_t i = 0; i < m; ++i)  // the padding is untouched
          for (std::int64_t j = n; j < ldc; ++j) EXPECT_EQ(got[i * ldc + j], c[i * ldc + j]);
        cudaFree(da);
        cudaFree(db);
        cudaFree(dc);
        cudaFree(dbias);
      }
}

}  // namespace

#endif  // PROPLAB_CUDA_EMULATED
