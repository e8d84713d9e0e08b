// kernels/emulation/cublaslt.cpp: the cuBLASLt functions kernels/matmul.cu and kernels/context.cu call, for the
// emulated GPU: descriptors held on the host and a column-major GEMM computed on the host. Declared by the real
// <cublasLt.h> (C linkage).
//
// Invariants:
// - cublasLtMatmul computes D = alpha * op(A) op(B) + beta * C (+ bias[row] with CUBLASLT_EPILOGUE_BIAS), column-major,
//   honouring TRANSA/TRANSB and every leading dimension; products are accumulated in double and rounded to float
//   once per element (cuBLASLt accumulates in float, in an order of its own: results agree to float rounding).
//   beta = 0 never reads C (which may hold NaN), as in cuBLAS.
// - Inputs are f32 or bf16 (CUDA_R_16BF, widened exactly); C, D, the scale type and the bias are f32. Anything
//   else, an epilogue other than DEFAULT/BIAS, inconsistent shapes (op(A) m x k, op(B) k x n, C and D m x n,
//   ld >= rows), an attribute of the wrong size or a null pointer where data is needed fails with
//   CUBLAS_STATUS_NOT_SUPPORTED or CUBLAS_STATUS_INVALID_VALUE, as cuBLASLt would, and prints why.
// - AlgoGetHeuristic always offers one algorithm needing no workspace.
#include <cublasLt.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

struct Desc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_32F;
};

struct Layout {
  cudaDataType type;
  std::uint64_t rows, cols;
  std::int64_t ld;
};

struct Preference {};

int handle_token = 0;

cublasStatus_t invalid(const char* why) {
  std::fprintf(stderr, "proplab CUDA emulator: cuBLASLt: %s\n", why);
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t unsupported(const char* why) {
  std::fprintf(stderr, "proplab CUDA emulator: cuBLASLt: %s\n", why);
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

template <typename T>
bool read_attribute(T& out, const void* buf, std::size_t size) {
  if (buf == nullptr || size != sizeof(T)) return false;
  std::memcpy(&out, buf, sizeof(T));
  return true;
}

Desc* desc_of(cublasLtMatmulDesc_t d) { return reinterpret_cast<Desc*>(d); }
Layout* layout_of(cublasLtMatrixLayout_t l) { return reinterpret_cast<Layout*>(l); }

// Element (row, col) of a column-major matrix of `type` with leading dimension ld, as float.
float element(const void* data, cudaDataType type, std::int64_t ld, std::int64_t row, std::int64_t col) {
  const std::int64_t index = row + col * ld;
  if (type == CUDA_R_16BF) {
    const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(data)[index]) << 16;
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
  }
  return static_cast<const float*>(data)[index];
}

// op(X) as a dense row-major rows x cols float matrix (element (r, c) at r * cols + c).
std::vector<float> pack(const void* data, const Layout& layout, cublasOperation_t op, std::int64_t rows,
                        std::int64_t cols) {
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      out[static_cast<std::size_t>(r * cols + c)] =
          op == CUBLAS_OP_N ? element(data, layout.type, layout.ld, r, c) : element(data, layout.type, layout.ld, c, r);
  return out;
}

bool valid_input_type(cudaDataType type) { return type == CUDA_R_32F || type == CUDA_R_16BF; }

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return invalid("cublasLtCreate: null handle pointer");
  *handle = reinterpret_cast<cublasLtHandle_t>(&handle_token);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
  if (desc == nullptr) return invalid("cublasLtMatmulDescCreate: null descriptor pointer");
  if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC)
    return unsupported("cublasLtMatmulDescCreate: only CUBLAS_COMPUTE_32F is emulated");
  if (scale != CUDA_R_32F) return unsupported("cublasLtMatmulDescCreate: only a CUDA_R_32F scale type is emulated");
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(new Desc{compute, scale});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc_of(desc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmul_desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  Desc* d = desc_of(matmul_desc);
  if (d == nullptr) return invalid("cublasLtMatmulDescSetAttribute: null descriptor");
  bool ok = true;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: {
      std::int32_t v = 0;
      ok = read_attribute(v, buf, size);
      d->trans_a = static_cast<cublasOperation_t>(v);
      break;
    }
    case CUBLASLT_MATMUL_DESC_TRANSB: {
      std::int32_t v = 0;
      ok = read_attribute(v, buf, size);
      d->trans_b = static_cast<cublasOperation_t>(v);
      break;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
      std::uint32_t v = 0;
      ok = read_attribute(v, buf, size);
      d->epilogue = static_cast<cublasLtEpilogue_t>(v);
      if (ok && d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && d->epilogue != CUBLASLT_EPILOGUE_BIAS)
        return unsupported("only the DEFAULT and BIAS epilogues are emulated");
      break;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      ok = read_attribute(d->bias, buf, size);
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: {
      std::int32_t v = 0;
      ok = read_attribute(v, buf, size);
      d->bias_type = static_cast<cudaDataType_t>(v);
      if (ok && d->bias_type != CUDA_R_32F) return unsupported("only a CUDA_R_32F bias is emulated");
      break;
    }
    default:
      return unsupported("cublasLtMatmulDescSetAttribute: attribute not emulated");
  }
  if (!ok) return invalid("cublasLtMatmulDescSetAttribute: null buffer or wrong attribute size");
  if (d->trans_a != CUBLAS_OP_N && d->trans_a != CUBLAS_OP_T) return unsupported("TRANSA must be N or T");
  if (d->trans_b != CUBLAS_OP_N && d->trans_b != CUBLAS_OP_T) return unsupported("TRANSB must be N or T");
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (layout == nullptr) return invalid("cublasLtMatrixLayoutCreate: null layout pointer");
  if (type != CUDA_R_32F && type != CUDA_R_16BF) return unsupported("only CUDA_R_32F and CUDA_R_16BF are emulated");
  if (ld < 1 || static_cast<std::uint64_t>(ld) < rows)
    return invalid("cublasLtMatrixLayoutCreate: leading dimension smaller than the rows (column-major)");
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(new Layout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout_of(layout);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return invalid("cublasLtMatmulPreferenceCreate: null pointer");
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new Preference{});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete reinterpret_cast<Preference*>(pref);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  if (pref == nullptr) return invalid("cublasLtMatmulPreferenceSetAttribute: null preference");
  std::size_t expected = 0;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      expected = sizeof(std::uint64_t);
      break;
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      expected = sizeof(std::uint32_t);
      break;
    default:
      return CUBLAS_STATUS_SUCCESS;  // a hint only: nothing to emulate
  }
  if (buf == nullptr || size != expected)
    return invalid("cublasLtMatmulPreferenceSetAttribute: null buffer or wrong attribute size");
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
  if (handle == nullptr || desc == nullptr || a == nullptr || b == nullptr || c == nullptr || d == nullptr ||
      pref == nullptr || results == nullptr || returned == nullptr || requested < 1)
    return invalid("cublasLtMatmulAlgoGetHeuristic: null argument or no algorithm requested");
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].workspaceSize = 0;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t compute_desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a_desc, const void* B,
                              cublasLtMatrixLayout_t b_desc, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c_desc, void* D, cublasLtMatrixLayout_t d_desc,
                              const cublasLtMatmulAlgo_t* algo, void*, size_t, cudaStream_t) {
  const Desc* desc = desc_of(compute_desc);
  if (handle == nullptr || desc == nullptr || a_desc == nullptr || b_desc == nullptr || c_desc == nullptr ||
      d_desc == nullptr || alpha == nullptr || beta == nullptr)
    return invalid("cublasLtMatmul: null handle, descriptor or scale");
  if (algo == nullptr) return invalid("cublasLtMatmul: no algorithm (the emulation needs one from the heuristic)");
  const Layout &la = *layout_of(a_desc), &lb = *layout_of(b_desc), &lc = *layout_of(c_desc), &ld = *layout_of(d_desc);
  const bool ta = desc->trans_a == CUBLAS_OP_T, tb = desc->trans_b == CUBLAS_OP_T;
  const auto m = static_cast<std::int64_t>(ld.rows), n = static_cast<std::int64_t>(ld.cols);
  const auto k = static_cast<std::int64_t>(ta ? la.rows : la.cols);
  if (static_cast<std::int64_t>(ta ? la.cols : la.rows) != m)
    return invalid("cublasLtMatmul: op(A) has a different number of rows than D");
  if (static_cast<std::int64_t>(tb ? lb.cols : lb.rows) != k)
    return invalid("cublasLtMatmul: the rows of op(B) differ from the columns of op(A)");
  if (static_cast<std::int64_t>(tb ? lb.rows : lb.cols) != n)
    return invalid("cublasLtMatmul: op(B) has a different number of columns than D");
  if (lc.rows != ld.rows || lc.cols != ld.cols) return invalid("cublasLtMatmul: C and D have different shapes");
  if (!valid_input_type(la.type) || la.type != lb.type) return unsupported("cublasLtMatmul: A and B types differ");
  if (lc.type != CUDA_R_32F || ld.type != CUDA_R_32F) return unsupported("cublasLtMatmul: C and D must be f32");
  if (C == D && lc.ld != ld.ld) return invalid("cublasLtMatmul: in-place C = D with different leading dimensions");
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  if (k == 0) return invalid("cublasLtMatmul: k = 0");
  if (A == nullptr || B == nullptr || D == nullptr) return invalid("cublasLtMatmul: null A, B or D");
  const bool has_bias = desc->epilogue == CUBLASLT_EPILOGUE_BIAS;
  if (has_bias && desc->bias == nullptr) return invalid("cublasLtMatmul: BIAS epilogue without a bias pointer");
  const float alpha_value = *static_cast<const float*>(alpha), beta_value = *static_cast<const float*>(beta);
  if (beta_value != 0.0f && C == nullptr) return invalid("cublasLtMatmul: beta != 0 with a null C");

  const std::vector<float> op_a = pack(A, la, desc->trans_a, m, k);  // m x k, row-major: row i contiguous
  const std::vector<float> op_b_t = pack(B, lb, tb ? CUBLAS_OP_N : CUBLAS_OP_T, n, k);  // op(B)^T, n x k
  const auto* c = static_cast<const float*>(C);
  auto* d = static_cast<float*>(D);
  const auto* bias = static_cast<const float*>(desc->bias);
#pragma omp parallel for schedule(static)
  for (std::int64_t j = 0; j < n; ++j) {
    const float* column = op_b_t.data() + j * k;
    for (std::int64_t i = 0; i < m; ++i) {
      const float* row = op_a.data() + i * k;
      double sum = 0.0;
      for (std::int64_t l = 0; l < k; ++l) sum += static_cast<double>(row[l]) * static_cast<double>(column[l]);
      double value = static_cast<double>(alpha_value) * sum;
      if (beta_value != 0.0f) value += static_cast<double>(beta_value) * static_cast<double>(c[i + j * lc.ld]);
      if (has_bias) value += static_cast<double>(bias[i]);
      d[i + j * ld.ld] = static_cast<float>(value);
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
