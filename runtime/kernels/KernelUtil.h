// Internal to runtime/kernels: the argument bundle every kernel receives,
// operand and attribute validation helpers, the GEMM wrapper and the kernel
// entry points the dispatcher registers.
#ifndef PIPER_RUNTIME_KERNELS_KERNELUTIL_H
#define PIPER_RUNTIME_KERNELS_KERNELUTIL_H

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "runtime/kernels/Kernels.h"

namespace piper::runtime::detail {

/// Everything one kernel call sees. Error messages are prefixed with the op.
/// Attributes come decoded (`attrs`, made once at plan load): kernels read
/// them by id through readInt & co., never from `kernel`'s attribute map.
struct KernelArgs {
  const plan::Kernel &kernel;
  const KernelAttrs &attrs;
  const std::vector<TensorRef> &inputs;
  const std::vector<TensorRef> &outputs;
  KernelContext &ctx;

  const std::string &op() const { return kernel.op(); }
  Status error(const std::string &message) const {
    return Status::error(op() + ": " + message);
  }
};

using KernelFn = Status (*)(const KernelArgs &);

std::string shapeString(const std::vector<int64_t> &shape);
const char *dtypeName(plan::DType dtype);

/// Checks every operand's shape (no negative dimension, no overflowing
/// element count) and storage (data for a non-empty tensor): kernels index
/// raw memory with numel(), so a bogus shape must be an error first.
Status checkOperandStorage(const KernelArgs &a);

/// Checks that there are minInputs..maxInputs inputs and exactly numOutputs
/// outputs.
Status expectCounts(const KernelArgs &a, size_t minInputs, size_t maxInputs,
                    size_t numOutputs);
Status expectDType(const KernelArgs &a, const TensorRef &t, const char *name,
                   plan::DType dtype);
/// Checks dtype and exact shape.
Status expectTensor(const KernelArgs &a, const TensorRef &t, const char *name,
                    plan::DType dtype, const std::vector<int64_t> &shape);
/// Checks that `t` is a rank-2 tensor of `dtype` and returns its dimensions.
Status expectMatrix(const KernelArgs &a, const TensorRef &t, const char *name,
                    plan::DType dtype, int64_t &rows, int64_t &cols);
/// Checks that `t` is an f32 scalar (shape [] or [1]).
Status expectScalar(const KernelArgs &a, const TensorRef &t, const char *name);
/// Checks that `t` is an i32 token tensor, [B,S] (or flat [N]), and returns
/// its number of tokens.
Status expectTokens(const KernelArgs &a, const TensorRef &t, const char *name,
                    int64_t &count);
/// Checks that every token of `t` (already validated) lies in [0, limit).
Status expectTokensBelow(const KernelArgs &a, const TensorRef &t,
                         const char *name, int64_t limit);
/// Vocabulary parallelism (docs/tensor-parallel.md §5c): reads attribute
/// `members` (the tensor-parallel degree; default 1 unless `required`,
/// else at least 2) and gives this rank's first vocabulary id, its
/// context's tensor member times the local `vocab`.
Status readVocabShard(const KernelArgs &a, int64_t vocab, bool required,
                      int64_t &members, int64_t &first);
/// Checks that each dimension fits the 32-bit integers of the BLAS interface.
Status expectBlasDims(const KernelArgs &a, std::initializer_list<int64_t> dims);

// Attribute readers: read a.attrs (decoded at plan load) by id, no string
// lookup. Errors name the attribute as the plan does ("adamw: missing
// attribute 'lr'") and surface when the kernel runs, as when kernels read
// the protobuf.

/// Reads an integer attribute (stored as an integer, or as an integral
/// double); a missing attribute without default is an error, as is a
/// non-integral value.
Status readInt(const KernelArgs &a, KernelAttr id, std::optional<int64_t> dflt,
               int64_t &value);
/// A matrix operand of the vocabulary dimension that the compiler may have
/// padded (docs/kernels.md, "Padded vocabulary"): with the kernel's
/// `valid_cols` attribute, t [rows, ld] holds `cols` = valid_cols valid
/// columns per row (1 <= valid_cols <= ld; the others are never read);
/// without it, cols = ld = t's columns.
/// With `packable`, t may in mixed precision also be packed bf16: a GEMM's
/// packed input (expectGemmMatrix) or a packed output (the fused
/// classifier's dlogits, hal::Device::writesPackedOutput).
Status expectPaddedMatrix(const KernelArgs &a, const TensorRef &t,
                          const char *name, int64_t &rows, int64_t &cols,
                          int64_t &ld, bool packable = false);
/// expectMatrix of an f32 matrix that a GEMM reads: in mixed precision
/// (KernelContext::lowPrecision) it may instead be packed bf16, a step
/// buffer as the plan stores it, which the GPU backends' GEMMs read as it
/// is (hal::Device::readsPackedInput) and the CPU kernels unpack
/// (fp32Data): the same values either way.
Status expectGemmMatrix(const KernelArgs &a, const TensorRef &t,
                        const char *name, int64_t &rows, int64_t &cols);
/// The dtype an operand that may be packed must have: f32, or bf16 where it
/// is given packed in mixed precision (KernelContext::lowPrecision).
plan::DType packableDType(const KernelArgs &a, const TensorRef &t);
/// The floats of an f32 operand, or the values of a packed bf16 one
/// unpacked into `tmp`.
const float *fp32Data(const TensorRef &t, std::vector<float> &tmp);
/// expectTensor of an f32 output that in mixed precision may instead be
/// packed bf16 (a mixed-precision activation the executor stores packed:
/// hal::Device::writesPackedOutput).
Status expectPackableOutput(const KernelArgs &a, const TensorRef &t,
                            const char *name,
                            const std::vector<int64_t> &shape);
/// Where row `n` of `cols` floats of output `t` is computed: t's own row,
/// or for a packed t `scratch`, which storeRow then packs into t's row
/// (rounded to nearest even: the executor's rounding and packing of the
/// fp32 row). For the CPU kernels' packed outputs (expectPackableOutput).
float *outputRow(const TensorRef &t, int64_t n, int64_t cols,
                 std::vector<float> &scratch);
/// Packs `row` (`cols` floats) into row `n` of a packed t whose rows are
/// `ld` elements apart; nothing for an f32 t (outputRow gave its own row).
void storeRow(const TensorRef &t, int64_t n, int64_t ld, int64_t cols,
              const float *row);
/// expectPaddedMatrix of an operand whose valid part must be [rows, cols].
Status expectPaddedRows(const KernelArgs &a, const TensorRef &t,
                        const char *name, int64_t rows, int64_t cols,
                        int64_t &ld, bool packable = false);
/// Whether the kernel has `valid_cols` (its padded operands).
bool hasValidCols(const KernelArgs &a);
/// Reads an integer attribute that must be at least 1.
Status readPositiveInt(const KernelArgs &a, KernelAttr id,
                       std::optional<int64_t> dflt, int64_t &value);
/// Reads a finite numeric attribute (a double, or an integer).
Status readFloat(const KernelArgs &a, KernelAttr id, std::optional<double> dflt,
                 double &value);
/// Reads a flag attribute: 0 or 1, default 0.
Status readFlag(const KernelArgs &a, KernelAttr id, bool &flag);
/// Reads the `transpose_w` flag of the linear family (0 or 1, default 0).
Status readTransposeW(const KernelArgs &a, bool &transposeW);

/// Row-major C = alpha * op(A) * op(B) + beta * C through cblas_sgemm, where
/// op(A) is m x k and op(B) is k x n. Empty products are handled here because
/// BLAS rejects zero leading dimensions.
void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
          float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
          float beta, float *c, int64_t ldc);

// Kernel entry points, grouped by the file that implements them.

// LayerKernels.cpp
Status embeddingKernel(const KernelArgs &a);
Status embeddingGradKernel(const KernelArgs &a);
Status positionAddKernel(const KernelArgs &a);
Status positionAddGradKernel(const KernelArgs &a);
Status spSplitKernel(const KernelArgs &a);
Status columnsKernel(const KernelArgs &a);
Status columnsGradKernel(const KernelArgs &a);
Status tpKvAssembleKernel(const KernelArgs &a);
Status tpKvAssembleGradKernel(const KernelArgs &a);

// LinearKernels.cpp
Status linearKernel(const KernelArgs &a);
Status linearGradInputKernel(const KernelArgs &a);
Status linearGradWeightKernel(const KernelArgs &a);
Status biasAddKernel(const KernelArgs &a);
Status biasGradKernel(const KernelArgs &a);
Status linearGradWeightBiasKernel(const KernelArgs &a);
Status linearGeluKernel(const KernelArgs &a);
Status linearGradInputGeluKernel(const KernelArgs &a);

// UlyssesKernels.cpp
Status ulyssesSplitKernel(const KernelArgs &a);
Status ulyssesMergeKernel(const KernelArgs &a);
Status ulyssesNaturalKernel(const KernelArgs &a);
Status ulyssesZigzagKernel(const KernelArgs &a);
Status cpSplitKernel(const KernelArgs &a);
Status cpSplitGradKernel(const KernelArgs &a);

// NormKernels.cpp
Status layerNormKernel(const KernelArgs &a);
Status layerNormGradInputKernel(const KernelArgs &a);
Status layerNormGradWeightKernel(const KernelArgs &a);
Status rmsNormKernel(const KernelArgs &a);
Status rmsNormGradInputKernel(const KernelArgs &a);
Status rmsNormGradWeightKernel(const KernelArgs &a);
Status addLayerNormKernel(const KernelArgs &a);
Status addRmsNormKernel(const KernelArgs &a);
Status layerNormGradInputAddKernel(const KernelArgs &a);
Status rmsNormGradInputAddKernel(const KernelArgs &a);

// QkNormKernels.cpp
Status qkNormKernel(const KernelArgs &a);
Status qkNormGradInputKernel(const KernelArgs &a);
Status qkNormGradWeightKernel(const KernelArgs &a);

// ElementwiseKernels.cpp
Status geluKernel(const KernelArgs &a);
Status geluGradKernel(const KernelArgs &a);
Status swigluKernel(const KernelArgs &a);
Status swigluGradKernel(const KernelArgs &a);
Status addKernel(const KernelArgs &a);
/// y = gelu(x) and dx = gelu'(x) dy over n elements, the loops of gelu and
/// gelu_grad (their bits; dx may not alias x or dy).
void geluInto(const float *x, float *y, int64_t n);
void geluGradInto(const float *x, const float *dy, float *dx, int64_t n);

// AttentionKernels.cpp
Status attentionKernel(const KernelArgs &a);
Status attentionGradKernel(const KernelArgs &a);
Status attentionBlockKernel(const KernelArgs &a);
Status attentionBlockGradKernel(const KernelArgs &a);

// MoeKernels.cpp
Status moeRouterKernel(const KernelArgs &a);
Status moeRouterGradKernel(const KernelArgs &a);
Status moeAuxLossKernel(const KernelArgs &a);
Status moeAuxLossGradKernel(const KernelArgs &a);

// MoeSlotKernels.cpp
Status moeDispatchKernel(const KernelArgs &a);
Status moeDispatchGradKernel(const KernelArgs &a);
Status moeCombineKernel(const KernelArgs &a);
Status moeCombineGradKernel(const KernelArgs &a);

// MoeEpKernels.cpp
Status moeEpCountsKernel(const KernelArgs &a);
Status moeEpPackKernel(const KernelArgs &a);
Status moeEpUnpackKernel(const KernelArgs &a);
Status moeEpGatherKernel(const KernelArgs &a);
Status moeEpScatterKernel(const KernelArgs &a);

// MoeExpertKernels.cpp
Status expertLinearKernel(const KernelArgs &a);
Status expertLinearGradInputKernel(const KernelArgs &a);
Status expertLinearGradWeightKernel(const KernelArgs &a);

// LossKernels.cpp
Status crossEntropyKernel(const KernelArgs &a);
Status crossEntropyGradKernel(const KernelArgs &a);
Status crossEntropyFusedKernel(const KernelArgs &a);
Status vocabCeStatsKernel(const KernelArgs &a);
Status vocabCrossEntropyKernel(const KernelArgs &a);
Status vocabCrossEntropyGradKernel(const KernelArgs &a);
Status lossAccumulateKernel(const KernelArgs &a);

// OptimizerKernels.cpp
Status accumulateKernel(const KernelArgs &a);
Status zeroKernel(const KernelArgs &a);
Status adamwKernel(const KernelArgs &a);

} // namespace piper::runtime::detail

#endif // PIPER_RUNTIME_KERNELS_KERNELUTIL_H
