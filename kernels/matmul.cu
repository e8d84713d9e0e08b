#include "kernels/matmul.cuh"

#include <cublasLt.h>

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "kernels/common.cuh"
#include "kernels/context.cuh"

namespace proplab::kernels {
namespace {

// Everything the algorithm choice depends on. Alignment of the pointers (mod 16) matters to cuBLASLt too.
using PlanKey = std::tuple<bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                           std::int64_t, bool, int, int, int, int>;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

int alignment_class(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  return address % 16 == 0 ? 16 : address % 8 == 0 ? 8 : address % 4 == 0 ? 4 : 2;
}

// The column-major problem cuBLASLt sees: row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, i.e.
// cuBLASLt's "A" is our B and its "B" is our A, with the same transpose flags and m, n swapped.
Plan make_plan(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda,
               std::int64_t ldb, std::int64_t ldc, bool has_bias, GemmInput input, int align_a, int align_b,
               int align_c) {
  Plan plan;
  const cudaDataType_t in_type = input == GemmInput::bf16 ? CUDA_R_16BF : CUDA_R_32F;
  PROPLAB_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;   // cuBLASLt's A = our B
  const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B = our A
  PROPLAB_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
  PROPLAB_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
  if (has_bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    PROPLAB_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    const cudaDataType_t bias_type = CUDA_R_32F;
    PROPLAB_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                        sizeof(bias_type)));
  }
  // Column-major shapes as stored: cuBLASLt's A (our B) is n x k (or k x n transposed) with leading dim ldb, ...
  const std::uint64_t cm = static_cast<std::uint64_t>(n), cn = static_cast<std::uint64_t>(m),
                      ck = static_cast<std::uint64_t>(k);
  PROPLAB_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, in_type, trans_b ? ck : cm, trans_b ? cm : ck, ldb));
  PROPLAB_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, in_type, trans_a ? cn : ck, trans_a ? ck : cn, lda));
  PROPLAB_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, CUDA_R_32F, cm, cn, ldc));

  cublasLtMatmulPreference_t preference = nullptr;
  PROPLAB_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const std::size_t workspace = context().workspace_bytes;
  PROPLAB_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &workspace, sizeof(workspace)));
  const std::uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
  PROPLAB_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                            &scheme, sizeof(scheme)));
  const std::uint32_t align_first = static_cast<std::uint32_t>(align_b), align_second =
                                                                          static_cast<std::uint32_t>(align_a),
                      align_out = static_cast<std::uint32_t>(align_c);
  PROPLAB_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_first, sizeof(align_first)));
  PROPLAB_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_second, sizeof(align_second)));
  PROPLAB_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                            &align_out, sizeof(align_out)));
  PROPLAB_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                            &align_out, sizeof(align_out)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  PROPLAB_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(context().lt, plan.op, plan.a, plan.b, plan.c, plan.c,
                                                      preference, 1, &result, &found));
  cublasLtMatmulPreferenceDestroy(preference);
  if (found == 0)
    throw std::runtime_error("cuBLASLt has no algorithm for a " + std::to_string(m) + " x " + std::to_string(n) +
                             " x " + std::to_string(k) + " matrix product");
  plan.algo = result.algo;
  return plan;
}

}  // namespace

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const void* a, std::int64_t lda,
          const void* b, std::int64_t ldb, float* c, std::int64_t ldc, float alpha, float beta, const float* bias,
          GemmInput input) {
  if (m == 0 || n == 0) return;
  Context& ctx = context();
  if (k == 0) {
    // cuBLASLt wants k >= 1. An empty product is zero; the only callers with k == 0 are zero-width layers,
    // which pass beta = 0 and no bias.
    if (beta != 0.0f || bias) throw std::runtime_error("gemm with k = 0 supports only beta = 0 without bias");
    PROPLAB_CUDA_CHECK(cudaMemset2DAsync(c, sizeof(float) * ldc, 0, sizeof(float) * n, m, ctx.stream));
    return;
  }
  static std::mutex mutex;
  static std::map<PlanKey, Plan> plans;
  const int align_a = alignment_class(a), align_b = alignment_class(b), align_c = alignment_class(c);
  const PlanKey key{trans_a, trans_b, m, n, k, lda, ldb, ldc, bias != nullptr, static_cast<int>(input),
                    align_a, align_b, align_c};
  Plan* plan = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto found = plans.find(key);
    if (found == plans.end())
      found = plans.emplace(key, make_plan(trans_a, trans_b, m, n, k, lda, ldb, ldc, bias != nullptr, input, align_a,
                                           align_b, align_c))
                  .first;
    plan = &found->second;
  }
  if (bias)
    PROPLAB_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  PROPLAB_CUBLAS_CHECK(cublasLtMatmul(ctx.lt, plan->op, &alpha, b, plan->a, a, plan->b, &beta, c, plan->c, c,
                                      plan->c, &plan->algo, ctx.workspace, ctx.workspace_bytes, ctx.stream));
}

}  // namespace proplab::kernels
