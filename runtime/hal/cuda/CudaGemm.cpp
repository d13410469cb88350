// GEMMs on CUDA (CudaGemm.h): cuBLASLt loaded with dlopen, each shape's
// descriptors, layouts and algorithm prepared once per stream, and
// gemmColMajor (GpuApi.h): fp32, or bf16 operands on tensor cores with fp32
// accumulation, with the bias, bias-gradient and GELU epilogues.
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fmt/core.h"
#include "runtime/hal/cuda/CudaCheck.h"
#include "runtime/hal/cuda/CudaGemm.h"
#include "runtime/hal/cuda/CudaKernelContext.h"
#include "runtime/hal/gpu/ElementwiseLaunch.h"
#include "runtime/hal/gpu/GpuApi.h"
#include "runtime/hal/gpu/LinearLaunch.h"

namespace piper::runtime::hal {

namespace {

// cuBLASLt's entry points, resolved once.
struct CublasLt {
#define PIPER_CUBLASLT_FN(name) decltype(&::name) name = nullptr;
  PIPER_CUBLASLT_FN(cublasLtCreate)
  PIPER_CUBLASLT_FN(cublasLtDestroy)
  PIPER_CUBLASLT_FN(cublasLtGetStatusString)
  PIPER_CUBLASLT_FN(cublasLtMatmulDescCreate)
  PIPER_CUBLASLT_FN(cublasLtMatmulDescDestroy)
  PIPER_CUBLASLT_FN(cublasLtMatmulDescSetAttribute)
  PIPER_CUBLASLT_FN(cublasLtMatrixLayoutCreate)
  PIPER_CUBLASLT_FN(cublasLtMatrixLayoutDestroy)
  PIPER_CUBLASLT_FN(cublasLtMatmulPreferenceCreate)
  PIPER_CUBLASLT_FN(cublasLtMatmulPreferenceDestroy)
  PIPER_CUBLASLT_FN(cublasLtMatmulPreferenceSetAttribute)
  PIPER_CUBLASLT_FN(cublasLtMatmulAlgoGetHeuristic)
  PIPER_CUBLASLT_FN(cublasLtMatmul)
#undef PIPER_CUBLASLT_FN
};

const CublasLt *cublasLt = nullptr;

Status openCublasLt() {
  std::vector<std::string> tried;
  void *lib = nullptr;
  // $PIPER_CUBLASLT_LIBRARY alone when set (as PIPER_NCCL_LIBRARY): a
  // chosen library that does not load is an error, not a silent fallback.
  std::vector<std::string> candidates;
  if (const char *env = std::getenv("PIPER_CUBLASLT_LIBRARY"); env && *env) {
    candidates.push_back(env);
  } else {
    candidates.push_back("libcublasLt.so.13");
    candidates.push_back("/usr/local/cuda/lib64/libcublasLt.so.13");
  }
  for (const std::string &path : candidates) {
    lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib)
      break;
    const char *why = dlerror();
    tried.push_back(path + " (" + (why ? why : "not found") + ")");
  }
  if (!lib) {
    std::string list;
    for (const std::string &t : tried)
      list += (list.empty() ? "" : "; ") + t;
    return Status::error("cannot load cuBLASLt: tried " + list +
                         " (set PIPER_CUBLASLT_LIBRARY or LD_LIBRARY_PATH; "
                         "docs/gpu.md)");
  }
  auto *fns = new CublasLt();
  std::string missing;
#define PIPER_CUBLASLT_LOAD(name)                                              \
  fns->name = reinterpret_cast<decltype(fns->name)>(dlsym(lib, #name));        \
  if (!fns->name)                                                              \
    missing += std::string(missing.empty() ? "" : ", ") + #name;
  PIPER_CUBLASLT_LOAD(cublasLtCreate)
  PIPER_CUBLASLT_LOAD(cublasLtDestroy)
  PIPER_CUBLASLT_LOAD(cublasLtGetStatusString)
  PIPER_CUBLASLT_LOAD(cublasLtMatmulDescCreate)
  PIPER_CUBLASLT_LOAD(cublasLtMatmulDescDestroy)
  PIPER_CUBLASLT_LOAD(cublasLtMatmulDescSetAttribute)
  PIPER_CUBLASLT_LOAD(cublasLtMatrixLayoutCreate)
  PIPER_CUBLASLT_LOAD(cublasLtMatrixLayoutDestroy)
  PIPER_CUBLASLT_LOAD(cublasLtMatmulPreferenceCreate)
  PIPER_CUBLASLT_LOAD(cublasLtMatmulPreferenceDestroy)
  PIPER_CUBLASLT_LOAD(cublasLtMatmulPreferenceSetAttribute)
  PIPER_CUBLASLT_LOAD(cublasLtMatmulAlgoGetHeuristic)
  PIPER_CUBLASLT_LOAD(cublasLtMatmul)
#undef PIPER_CUBLASLT_LOAD
  if (!missing.empty()) {
    delete fns;
    return Status::error("cuBLASLt library lacks " + missing);
  }
  cublasLt = fns;
  return Status::ok();
}

std::string cublasMessage(cublasStatus_t status, const char *call,
                          const char *file, int line) {
  const char *text = cublasLt && cublasLt->cublasLtGetStatusString
                         ? cublasLt->cublasLtGetStatusString(status)
                         : "?";
  return fmt::format("{}: cuBLASLt status {} ({}) ({}:{})", call,
                     static_cast<int>(status), text, file, line);
}

#define PIPER_CUBLAS_RETURN_IF_ERROR(call)                                     \
  do {                                                                         \
    cublasStatus_t piperCublasStatus_ = (call);                                \
    if (piperCublasStatus_ != CUBLAS_STATUS_SUCCESS)                           \
      return Status::error(                                                    \
          cublasMessage(piperCublasStatus_, #call, __FILE__, __LINE__));       \
  } while (0)

/// A GEMM's shape as cuBLASLt sees it: everything its descriptors and
/// algorithm depend on (not the pointers, alpha or beta).
struct GemmKey {
  bool transA, transB, bf16;
  /// D (and C) packed bf16 instead of fp32 (ColMajorGemm::c16).
  bool outBf16;
  int64_t m, n, k, lda, ldb, ldc;
  uint32_t alignA, alignB, alignC;
  /// DEFAULT, BIAS, BGRADA, BGRADB, GELU_AUX(_BIAS) or DGELU.
  cublasLtEpilogue_t epilogue;
  /// The alignment of the epilogue's vector (the bias or the bias
  /// gradient), which the heuristic reads from its pointer (cublasLt.h:
  /// "depend on its value to determine expected pointer alignment").
  uint32_t alignVector;
  bool operator<(const GemmKey &o) const {
    return std::tie(transA, transB, bf16, outBf16, m, n, k, lda, ldb, ldc,
                    alignA, alignB, alignC, epilogue, alignVector) <
           std::tie(o.transA, o.transB, o.bf16, o.outBf16, o.m, o.n, o.k, o.lda,
                    o.ldb, o.ldc, o.alignA, o.alignB, o.alignC, o.epilogue,
                    o.alignVector);
  }
};

/// How many of the heuristic's algorithms a prepared GEMM keeps.
constexpr int kHeuristicAlgos = 4;

/// A GEMM prepared once (gpu-speed 4): its descriptor, layouts and the
/// heuristic's algorithms, kept for the stream's life, so every call of the
/// shape runs the same algorithm (the same bits every step) and none pays
/// for the heuristic again.
struct PreparedGemm {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  /// The heuristic's algorithms for the key, fastest first.
  std::vector<cublasLtMatmulAlgo_t> algos;
  /// The one the calls run: the first, or a later one where cuBLASLt
  /// refused those before it at run time (CUBLAS_STATUS_NOT_SUPPORTED for
  /// the call's pointers, which the heuristic judged by the key's
  /// alignments), kept from then on: every later call runs the same.
  size_t chosen = 0;
  /// A key with an epilogue that cuBLASLt has no algorithm for: its calls
  /// run the key without the epilogue instead (BIAS: the bias as C's
  /// initial value, beta = 1; BGRADA/B: the caller sums; GELU: the key
  /// with only its bias, and the caller applies GELU).
  bool epilogueRefused = false;
};

constexpr size_t kCublasWorkspace = size_t(32) << 20;

void destroyPrepared(const CublasLt &lt, PreparedGemm &g) {
  if (g.lc)
    lt.cublasLtMatrixLayoutDestroy(g.lc);
  if (g.lb)
    lt.cublasLtMatrixLayoutDestroy(g.lb);
  if (g.la)
    lt.cublasLtMatrixLayoutDestroy(g.la);
  if (g.desc)
    lt.cublasLtMatmulDescDestroy(g.desc);
  g = PreparedGemm();
}

bool isGeluEpilogue(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX ||
         e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;
}

/// A call's epilogue pointers: the bias or sums vector, the GELU matrix
/// (aux: the pre-activation written or read).
struct EpiloguePointers {
  const void *vector = nullptr, *aux = nullptr;
};

/// Sets the call's epilogue pointers on `desc` (the heuristic reads them to
/// learn their alignment; a call sets its own).
Status setEpiloguePointers(const CublasLt &lt, cublasLtMatmulDesc_t desc,
                           cublasLtEpilogue_t epilogue,
                           const EpiloguePointers &ptrs) {
  if (epilogue == CUBLASLT_EPILOGUE_DEFAULT)
    return Status::ok();
  if (ptrs.vector)
    PIPER_CUBLAS_RETURN_IF_ERROR(lt.cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptrs.vector,
        sizeof(ptrs.vector)));
  if (isGeluEpilogue(epilogue))
    PIPER_CUBLAS_RETURN_IF_ERROR(lt.cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ptrs.aux,
        sizeof(ptrs.aux)));
  return Status::ok();
}

/// The descriptors of `key` and the heuristic's best algorithm for them.
Status prepareGemm(const CublasLt &lt, cublasLtHandle_t handle,
                   const GemmKey &key, cudaDataType_t operandType,
                   const EpiloguePointers &ptrs, PreparedGemm &g) {
  PIPER_CUBLAS_RETURN_IF_ERROR(
      lt.cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = key.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t tb = key.transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  PIPER_CUBLAS_RETURN_IF_ERROR(lt.cublasLtMatmulDescSetAttribute(
      g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  PIPER_CUBLAS_RETURN_IF_ERROR(lt.cublasLtMatmulDescSetAttribute(
      g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (key.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    // BIAS: the bias (fp32, as D) added to the product before D is
    // written; BGRADA/B: op(A)'s rows or op(B)'s columns summed over k
    // into the same pointer (fp32, as C).
    cublasLtEpilogue_t epilogue = key.epilogue;
    PIPER_CUBLAS_RETURN_IF_ERROR(lt.cublasLtMatmulDescSetAttribute(
        g.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    int32_t biasType = CUDA_R_32F;
    PIPER_CUBLAS_RETURN_IF_ERROR(lt.cublasLtMatmulDescSetAttribute(
        g.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &biasType,
        sizeof(biasType)));
    // GELU_AUX(_BIAS): gelu(product + bias) to D and the pre-activation to
    // aux; DGELU: D = product * gelu'(aux). aux is fp32 as D (the default
    // aux type), C's shape and leading dimension.
    if (isGeluEpilogue(key.epilogue)) {
      int64_t auxLd = key.ldc;
      PIPER_CUBLAS_RETURN_IF_ERROR(lt.cublasLtMatmulDescSetAttribute(
          g.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &auxLd, sizeof(auxLd)));
    }
    PIPER_RETURN_IF_ERROR(setEpiloguePointers(lt, g.desc, key.epilogue, ptrs));
  }
  PIPER_CUBLAS_RETURN_IF_ERROR(lt.cublasLtMatrixLayoutCreate(
      &g.la, operandType, key.transA ? key.k : key.m,
      key.transA ? key.m : key.k, key.lda));
  PIPER_CUBLAS_RETURN_IF_ERROR(lt.cublasLtMatrixLayoutCreate(
      &g.lb, operandType, key.transB ? key.n : key.k,
      key.transB ? key.k : key.n, key.ldb));
  // C and D: fp32, or bf16 (D rounded to nearest even from the fp32
  // result: a packed output; only without an epilogue, beta 0).
  PIPER_CUBLAS_RETURN_IF_ERROR(lt.cublasLtMatrixLayoutCreate(
      &g.lc, key.outBf16 ? CUDA_R_16BF : CUDA_R_32F, key.m, key.n, key.ldc));
  cublasLtMatmulPreference_t pref = nullptr;
  PIPER_CUBLAS_RETURN_IF_ERROR(lt.cublasLtMatmulPreferenceCreate(&pref));
  Status status = [&]() -> Status {
    size_t workspaceBytes = kCublasWorkspace;
    PIPER_CUBLAS_RETURN_IF_ERROR(lt.cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspaceBytes,
        sizeof(workspaceBytes)));
    // The heuristic assumes 256-byte-aligned operands unless told
    // (gpu-review A.4): arena tensors are 64-byte aligned, MoE expert slices
    // 4-byte. Tell it each operand's real alignment (part of the key), so
    // that it picks an algorithm that can run on them.
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t>
        alignments[] = {
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.alignA},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.alignB},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.alignC},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.alignC},
        };
    for (const auto &[attribute, bytes] : alignments)
      PIPER_CUBLAS_RETURN_IF_ERROR(lt.cublasLtMatmulPreferenceSetAttribute(
          pref, attribute, &bytes, sizeof(bytes)));
    if (key.outBf16) {
      // A split-K reduction "in place" or in the output type would add the
      // partial sums as bf16: a packed D must be the fp32 result rounded
      // once (ColMajorGemm::c16), so only reductions in the compute type.
      const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE |
                               CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      PIPER_CUBLAS_RETURN_IF_ERROR(lt.cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
          sizeof(schemes)));
    }
    cublasLtMatmulHeuristicResult_t heuristics[kHeuristicAlgos]{};
    int found = 0;
    PIPER_CUBLAS_RETURN_IF_ERROR(lt.cublasLtMatmulAlgoGetHeuristic(
        handle, g.desc, g.la, g.lb, g.lc, g.lc, pref, kHeuristicAlgos,
        heuristics, &found));
    for (int i = 0; i < found && i < kHeuristicAlgos; ++i)
      if (heuristics[i].state == CUBLAS_STATUS_SUCCESS &&
          heuristics[i].workspaceSize <= kCublasWorkspace)
        g.algos.push_back(heuristics[i].algo);
    if (g.algos.empty())
      return Status::error(
          fmt::format("gemm: cuBLASLt has no algorithm for m={} n={} k={} ({})",
                      key.m, key.n, key.k, key.bf16 ? "bf16" : "fp32"));
    return Status::ok();
  }();
  lt.cublasLtMatmulPreferenceDestroy(pref);
  return status;
}

/// The stored shape of a column-major op(X) of rows x cols: X itself,
/// (trans ? cols x rows : rows x cols), its columns `ld` apart.
struct StoredMatrix {
  int64_t rows, cols;
};
StoredMatrix storedMatrix(bool trans, int64_t rows, int64_t cols) {
  return trans ? StoredMatrix{cols, rows} : StoredMatrix{rows, cols};
}

int64_t roundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

} // namespace

/// A stream's cuBLASLt state (CudaGemm.h).
struct CudaBlas {
  cublasLtHandle_t handle = nullptr; // made at the first GEMM
  CudaWorkspace *operands = nullptr;
  std::map<GemmKey, PreparedGemm> prepared;
};

CudaBlasPtr createCudaBlas(CudaWorkspace *operands) {
  CudaBlasPtr blas(new CudaBlas());
  blas->operands = operands;
  return blas;
}

void CudaBlasDeleter::operator()(CudaBlas *blas) const {
  if (cublasLt) { // else nothing was made
    for (auto &[key, g] : blas->prepared)
      destroyPrepared(*cublasLt, g);
    if (blas->handle)
      cublasLt->cublasLtDestroy(blas->handle);
  }
  delete blas;
}

uint32_t matrixAlignment(const void *ptr, int64_t ld, size_t elementBytes) {
  uint64_t bits = reinterpret_cast<uintptr_t>(ptr) |
                  static_cast<uint64_t>(ld) * elementBytes | 256;
  return static_cast<uint32_t>(bits & (~bits + 1)); // the lowest set bit
}

Status loadCublasLt() {
  static std::once_flag once;
  static Status status;
  std::call_once(once, [] { status = openCublasLt(); });
  return status;
}

namespace gpu {

Status gemmColMajor(const Context &ctx, const ColMajorGemm &call) {
  PIPER_RETURN_IF_ERROR(loadCublasLt());
  ColMajorGemm g = call;
  if (g.c16 && (!ctx.bf16 || g.c || g.beta != 0 || g.sumsA || g.sumsB ||
                g.geluOut || g.geluGradOf))
    return Status::error("gemm: a packed output needs a bf16 GEMM with beta "
                         "0, no fp32 C, no operand sums and no GELU");
  // A packed output: D in bf16 where there is no epilogue; with a bias the
  // fp32 result goes to scratch (its BIAS epilogue, as an fp32 output's),
  // which a pass then rounds and packs (cuBLASLt's bias on a bf16 D is
  // not asked for).
  uint16_t *const packedOut = g.c16;
  const bool viaScratch = packedOut && g.bias;
  const CublasLt &lt = *cublasLt;
  auto *blas = static_cast<CudaBlas *>(ctx.blas);
  if (!blas)
    return Status::error("gemm: no cuBLASLt context");
  if (!blas->handle)
    PIPER_CUBLAS_RETURN_IF_ERROR(lt.cublasLtCreate(&blas->handle));

  // Scratch: the cuBLASLt workspace, then (bf16) the operands' copies.
  // A bf16 copy's column stride is its stored rows rounded up to 8
  // elements (16 bytes), whatever the fp32 operand's: every column starts
  // aligned, so that cuBLASLt can run its vectorized tensor-core kernels
  // on operands whose stride is odd (GPT-2's vocabulary of 50257: the
  // logits' gradient in the LM head's two backward GEMMs). An operand
  // already packed (a step buffer of a mixed-precision plan) is read where
  // it is when its columns start 16-byte aligned, else copied to such a
  // stride (bf16 to bf16, no conversion).
  const StoredMatrix sa = storedMatrix(g.transA, g.m, g.k),
                     sb = storedMatrix(g.transB, g.k, g.n);
  const bool aInPlace = g.a.bf16 && matrixAlignment(g.a.bf16, g.lda, 2) >= 16,
             bInPlace = g.b.bf16 && matrixAlignment(g.b.bf16, g.ldb, 2) >= 16;
  int64_t lda = g.lda, ldb = g.ldb;
  size_t aElems = 0, bElems = 0;
  if (ctx.bf16) {
    if (!aInPlace) {
      lda = roundUp(sa.rows, 8);
      aElems = static_cast<size_t>(roundUp(lda * sa.cols, 128));
    }
    if (!bInPlace) {
      ldb = roundUp(sb.rows, 8);
      bElems = static_cast<size_t>(ldb * sb.cols);
    }
  }
  const size_t operandBytes16 =
      size_t(roundUp(static_cast<int64_t>(2 * (aElems + bElems)), 256));
  const size_t outBytes = viaScratch ? size_t(g.m * g.n) * sizeof(float) : 0;
  void *scratch = nullptr;
  PIPER_RETURN_IF_ERROR(blas->operands->reserve(
      kCublasWorkspace + operandBytes16 + outBytes, scratch));
  if (viaScratch) {
    g.c = reinterpret_cast<float *>(static_cast<char *>(scratch) +
                                    kCublasWorkspace + operandBytes16);
    g.ldc = g.m;
    g.c16 = nullptr;
  }
  const void *a = g.a.f32, *b = g.b.f32;
  cudaDataType_t operandType = CUDA_R_32F;
  if (ctx.bf16) {
    // The operands hold bf16 values already (the executor rounds them):
    // packing is exact. b16 starts on a 256-byte boundary (a16 takes a
    // multiple of 128 elements).
    auto *a16 = reinterpret_cast<uint16_t *>(static_cast<char *>(scratch) +
                                             kCublasWorkspace);
    uint16_t *b16 = a16 + aElems;
    auto operand = [&](const GemmOperand &op, bool inPlace, uint16_t *copy,
                       int64_t ld, int64_t ldIn, const StoredMatrix &sm,
                       const void *&out) -> Status {
      out = copy;
      if (inPlace) {
        out = op.bf16;
        return Status::ok();
      }
      if (!op.bf16)
        return launchPackBf16Columns(ctx, copy, ld, op.f32, ldIn, sm.rows,
                                     sm.cols);
      PIPER_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
          copy, static_cast<size_t>(ld) * 2, op.bf16,
          static_cast<size_t>(ldIn) * 2, static_cast<size_t>(sm.rows) * 2,
          static_cast<size_t>(sm.cols), cudaMemcpyDeviceToDevice, ctx.stream));
      return Status::ok();
    };
    PIPER_RETURN_IF_ERROR(operand(g.a, aInPlace, a16, lda, g.lda, sa, a));
    PIPER_RETURN_IF_ERROR(operand(g.b, bInPlace, b16, ldb, g.ldb, sb, b));
    operandType = CUDA_R_16BF;
  }

  const size_t operandBytes = ctx.bf16 ? 2 : 4;
  // GELU in the epilogue (cuBLASLt's aux leading dimension must be a
  // multiple of 8): forward, D is geluOut and aux receives C's
  // pre-activation; backward, aux is read.
  const bool gelu = (g.geluOut || g.geluGradOf) && g.ldc % 8 == 0;
  void *d = gelu && g.geluOut ? g.geluOut : g.c;
  if (g.c16)
    d = g.c16;
  const void *aux = g.geluOut ? static_cast<const void *>(g.c)
                              : static_cast<const void *>(g.geluGradOf);
  // The output matrices' alignment: C, D and aux share ldc (a packed D has
  // neither C nor aux).
  uint32_t alignOut =
      g.c16 ? matrixAlignment(g.c16, g.ldc, 2) : matrixAlignment(g.c, g.ldc, 4);
  if (gelu)
    alignOut =
        std::min(alignOut, matrixAlignment(d == g.c ? aux : d, g.ldc, 4));
  const cublasLtEpilogue_t plain =
      g.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  GemmKey key{g.transA,
              g.transB,
              ctx.bf16,
              g.c16 != nullptr,
              g.m,
              g.n,
              g.k,
              lda,
              ldb,
              g.ldc,
              matrixAlignment(a, lda, operandBytes),
              matrixAlignment(b, ldb, operandBytes),
              alignOut,
              gelu && g.geluGradOf ? CUBLASLT_EPILOGUE_DGELU
              : gelu && g.bias     ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
              : gelu               ? CUBLASLT_EPILOGUE_GELU_AUX
              : g.sumsA            ? CUBLASLT_EPILOGUE_BGRADA
              : g.sumsB            ? CUBLASLT_EPILOGUE_BGRADB
                                   : plain,
              0};
  EpiloguePointers pointers;
  pointers.vector = g.bias    ? static_cast<const void *>(g.bias)
                    : g.sumsA ? static_cast<const void *>(g.sumsA)
                              : static_cast<const void *>(g.sumsB);
  pointers.aux = aux;
  key.alignVector = matrixAlignment(pointers.vector, 0, 4);
  // The key's prepared GEMM (a key with an epilogue that cuBLASLt refuses
  // is kept, marked, and not asked again).
  auto preparedFor = [&](const GemmKey &k, PreparedGemm *&out) -> Status {
    auto found = blas->prepared.find(k);
    if (found == blas->prepared.end()) {
      PreparedGemm prepared;
      Status st =
          prepareGemm(lt, blas->handle, k, operandType, pointers, prepared);
      if (!st) {
        destroyPrepared(lt, prepared);
        if (k.epilogue == CUBLASLT_EPILOGUE_DEFAULT)
          return st;
        prepared.epilogueRefused = true;
      }
      found = blas->prepared.emplace(k, prepared).first;
    }
    out = &found->second;
    return Status::ok();
  };
  PreparedGemm *p = nullptr;
  PIPER_RETURN_IF_ERROR(preparedFor(key, p));
  float beta = g.beta;
  if (p->epilogueRefused && isGeluEpilogue(key.epilogue)) {
    // Without GELU (the caller applies it): the product, and the bias as
    // below, into C.
    key.epilogue = plain;
    d = g.c;
    PIPER_RETURN_IF_ERROR(preparedFor(key, p));
  }
  if (p->epilogueRefused) {
    key.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    if (g.bias) {
      // The bias as C's initial value instead, on the plain GEMM.
      if (g.beta != 0 || g.ldc != g.m)
        return Status::error(fmt::format(
            "gemm: cuBLASLt has no bias epilogue for m={} n={} k={} ({}) "
            "and C cannot start as the bias (beta {}, ldc {})",
            g.m, g.n, g.k, ctx.bf16 ? "bf16" : "fp32", g.beta, g.ldc));
      PIPER_RETURN_IF_ERROR(preparedFor(key, p));
      PIPER_RETURN_IF_ERROR(launchBroadcastRows(ctx, g.bias, g.c, g.n, g.m));
      beta = 1;
    } else {
      PIPER_RETURN_IF_ERROR(preparedFor(key, p)); // the caller sums
    }
  } else {
    // The descriptor is this stream's: set for this call, read by it.
    PIPER_RETURN_IF_ERROR(
        setEpiloguePointers(lt, p->desc, key.epilogue, pointers));
  }
  if (g.summed)
    *g.summed = key.epilogue == CUBLASLT_EPILOGUE_BGRADA ||
                key.epilogue == CUBLASLT_EPILOGUE_BGRADB;
  if (g.activated)
    *g.activated = isGeluEpilogue(key.epilogue);
  if (ctx.timer)
    PIPER_RETURN_IF_ERROR(ctx.timer->begin(ctx));
  noteKernelLaunch("gemm (cublasLtMatmul)");
  // An algorithm refused at run time (cuBLASLt checks a call's arguments
  // before it launches anything): the next of the heuristic's, kept for the
  // key's later calls.
  cublasStatus_t ran = CUBLAS_STATUS_NOT_SUPPORTED;
  for (; p->chosen < p->algos.size(); ++p->chosen) {
    ran = lt.cublasLtMatmul(blas->handle, p->desc, &g.alpha, a, p->la, b, p->lb,
                            &beta, d, p->lc, d, p->lc, &p->algos[p->chosen],
                            scratch, kCublasWorkspace, ctx.stream);
    if (ran != CUBLAS_STATUS_NOT_SUPPORTED)
      break;
  }
  if (ran != CUBLAS_STATUS_SUCCESS)
    return Status::error(fmt::format(
        "gemm: m={} n={} k={} ({}): {}", g.m, g.n, g.k,
        ctx.bf16 ? "bf16" : "fp32",
        cublasMessage(ran, "cublasLtMatmul", __FILE__, __LINE__) +
            (ran == CUBLAS_STATUS_NOT_SUPPORTED
                 ? fmt::format(" by each of the heuristic's {} algorithms",
                               p->algos.size())
                 : std::string())));
  if (viaScratch)
    PIPER_RETURN_IF_ERROR(
        launchPackBf16Columns(ctx, packedOut, call.ldc, g.c, g.ldc, g.m, g.n));
  return ctx.timer ? ctx.timer->end(ctx, "gemm") : Status::ok();
}
} // namespace gpu

} // namespace piper::runtime::hal
