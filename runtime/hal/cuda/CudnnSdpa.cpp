// Fused causal attention through cuDNN's backend API: see CudnnSdpa.h.
#include "runtime/hal/cuda/CudnnSdpa.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>

namespace piper::runtime::hal {

namespace {

using Dims = std::array<int64_t, 4>;

/// Byte alignment of every tensor: bf16 rows are headDim * 2 bytes apart,
/// a multiple of 16 since headDim is a multiple of 8.
constexpr int64_t kAlignment = 16;
/// Where scratch tensors and the engine's workspace start, in bytes.
constexpr size_t kScratchAlignment = 256;

size_t alignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

/// a * b * ... into `out`, false on int64 overflow.
bool product(std::initializer_list<int64_t> factors, int64_t &out) {
  out = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(out, f, &out))
      return false;
  return true;
}

/// Checked cuDNN backend calls: a failure is an error naming the call (and
/// attribute), cuDNN's status and its last-error text.
class Calls {
public:
  explicit Calls(const CudnnLibrary &lib) : lib(lib) {}

  Status create(cudnnBackendDescriptorType_t type, const char *what,
                CudnnDescriptor &out) {
    cudnnBackendDescriptor_t desc = nullptr;
    cudnnStatus_t st = lib.cudnnBackendCreateDescriptor(type, &desc);
    if (st != CUDNN_STATUS_SUCCESS)
      return Status::error(lib.errorText(
          std::string("cudnnBackendCreateDescriptor(") + what + ")", st));
    out = CudnnDescriptor(&lib, desc);
    return Status::ok();
  }
  Status set(cudnnBackendDescriptor_t desc, cudnnBackendAttributeName_t attr,
             const char *attrName, cudnnBackendAttributeType_t type,
             int64_t count, const void *value) {
    cudnnStatus_t st =
        lib.cudnnBackendSetAttribute(desc, attr, type, count, value);
    if (st != CUDNN_STATUS_SUCCESS)
      return Status::error(lib.errorText(
          std::string("cudnnBackendSetAttribute(") + attrName + ")", st));
    return Status::ok();
  }
  Status get(cudnnBackendDescriptor_t desc, cudnnBackendAttributeName_t attr,
             const char *attrName, cudnnBackendAttributeType_t type,
             int64_t requested, int64_t *count, void *value) {
    cudnnStatus_t st =
        lib.cudnnBackendGetAttribute(desc, attr, type, requested, count, value);
    if (st != CUDNN_STATUS_SUCCESS)
      return Status::error(lib.errorText(
          std::string("cudnnBackendGetAttribute(") + attrName + ")", st));
    return Status::ok();
  }
  Status finalize(cudnnBackendDescriptor_t desc, const std::string &what) {
    cudnnStatus_t st = lib.cudnnBackendFinalize(desc);
    if (st != CUDNN_STATUS_SUCCESS)
      return Status::error(
          lib.errorText("cudnnBackendFinalize(" + what + ")", st));
    return Status::ok();
  }

  /// cudnnGetVersion's code of the library (e.g. 91900).
  size_t version() const { return lib.version; }

private:
  const CudnnLibrary &lib;
};

/// An attribute and its name, for Calls::set and Calls::get.
#define PIPER_CUDNN_ATTR(name) name, #name

/// One tensor of the graph: what CUDNN_BACKEND_TENSOR_DESCRIPTOR needs.
struct TensorSpec {
  const char *name;
  int64_t uid;
  cudnnDataType_t type;
  Dims dims, strides;
  bool isVirtual = true;
  bool byValue = false;
};

/// Builds one operation graph into `g`, which owns every descriptor made.
class GraphBuilder {
public:
  GraphBuilder(const CudnnLibrary &lib, SdpaGraph &g) : c(lib), g(g) {}

  /// Creates a descriptor that g.parts owns.
  Status create(cudnnBackendDescriptorType_t type, const char *what,
                cudnnBackendDescriptor_t &out) {
    CudnnDescriptor desc;
    PIPER_RETURN_IF_ERROR(c.create(type, what, desc));
    out = desc.get();
    g.parts.push_back(std::move(desc));
    return Status::ok();
  }
  Status set(cudnnBackendDescriptor_t desc, cudnnBackendAttributeName_t attr,
             const char *attrName, cudnnBackendAttributeType_t type,
             int64_t count, const void *value) {
    return c.set(desc, attr, attrName, type, count, value);
  }
  Status finalize(cudnnBackendDescriptor_t desc, const std::string &what) {
    return c.finalize(desc, what);
  }

  Status tensor(const TensorSpec &t, cudnnBackendDescriptor_t &out) {
    PIPER_RETURN_IF_ERROR(
        create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor", out));
    PIPER_RETURN_IF_ERROR(set(out,
                              PIPER_CUDNN_ATTR(CUDNN_ATTR_TENSOR_DATA_TYPE),
                              CUDNN_TYPE_DATA_TYPE, 1, &t.type));
    PIPER_RETURN_IF_ERROR(set(out,
                              PIPER_CUDNN_ATTR(CUDNN_ATTR_TENSOR_DIMENSIONS),
                              CUDNN_TYPE_INT64, 4, t.dims.data()));
    PIPER_RETURN_IF_ERROR(set(out, PIPER_CUDNN_ATTR(CUDNN_ATTR_TENSOR_STRIDES),
                              CUDNN_TYPE_INT64, 4, t.strides.data()));
    PIPER_RETURN_IF_ERROR(set(out,
                              PIPER_CUDNN_ATTR(CUDNN_ATTR_TENSOR_UNIQUE_ID),
                              CUDNN_TYPE_INT64, 1, &t.uid));
    PIPER_RETURN_IF_ERROR(
        set(out, PIPER_CUDNN_ATTR(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT),
            CUDNN_TYPE_INT64, 1, &kAlignment));
    if (t.isVirtual)
      PIPER_RETURN_IF_ERROR(set(out,
                                PIPER_CUDNN_ATTR(CUDNN_ATTR_TENSOR_IS_VIRTUAL),
                                CUDNN_TYPE_BOOLEAN, 1, &t.isVirtual));
    if (t.byValue)
      PIPER_RETURN_IF_ERROR(set(out,
                                PIPER_CUDNN_ATTR(CUDNN_ATTR_TENSOR_IS_BY_VALUE),
                                CUDNN_TYPE_BOOLEAN, 1, &t.byValue));
    return finalize(out, std::string("tensor ") + t.name);
  }

  /// A virtual tensor of `type`, `dims` and `strides`.
  Status temp(const char *name, cudnnDataType_t type, const Dims &dims,
              const Dims &strides, cudnnBackendDescriptor_t &out) {
    return tensor({name, nextVirtual++, type, dims, strides}, out);
  }

  /// A by-value fp32 scalar, [1, 1, 1, 1] (a pointwise operation's operands
  /// must have the same rank); the variant pack binds the address of its
  /// value in g.scalars.
  Status scalar(const char *name, int64_t uid, float value,
                cudnnBackendDescriptor_t &out) {
    TensorSpec t{name, uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}};
    t.isVirtual = false;
    t.byValue = true;
    g.scalars.push_back({uid, value});
    return tensor(t, out);
  }

  /// y = mode(x[, b[, t]]), computed in `prec`.
  Status pointwise(const char *name, cudnnPointwiseMode_t mode,
                   cudnnDataType_t prec, cudnnBackendDescriptor_t x,
                   cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t,
                   cudnnBackendDescriptor_t y, int64_t axis = -1) {
    cudnnBackendDescriptor_t pw, op;
    PIPER_RETURN_IF_ERROR(
        create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise", pw));
    PIPER_RETURN_IF_ERROR(set(pw, PIPER_CUDNN_ATTR(CUDNN_ATTR_POINTWISE_MODE),
                              CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
    PIPER_RETURN_IF_ERROR(set(pw,
                              PIPER_CUDNN_ATTR(CUDNN_ATTR_POINTWISE_MATH_PREC),
                              CUDNN_TYPE_DATA_TYPE, 1, &prec));
    if (mode == CUDNN_POINTWISE_GEN_INDEX)
      PIPER_RETURN_IF_ERROR(set(pw, PIPER_CUDNN_ATTR(CUDNN_ATTR_POINTWISE_AXIS),
                                CUDNN_TYPE_INT64, 1, &axis));
    PIPER_RETURN_IF_ERROR(finalize(pw, std::string("pointwise ") + name));
    PIPER_RETURN_IF_ERROR(
        create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, name, op));
    PIPER_RETURN_IF_ERROR(
        set(op, PIPER_CUDNN_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR),
            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw));
    PIPER_RETURN_IF_ERROR(
        set(op, PIPER_CUDNN_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_XDESC),
            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    if (b)
      PIPER_RETURN_IF_ERROR(
          set(op, PIPER_CUDNN_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_BDESC),
              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
    if (t)
      PIPER_RETURN_IF_ERROR(
          set(op, PIPER_CUDNN_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_TDESC),
              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t));
    PIPER_RETURN_IF_ERROR(
        set(op, PIPER_CUDNN_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_YDESC),
            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    const float alpha = 1.0f;
    PIPER_RETURN_IF_ERROR(
        set(op, PIPER_CUDNN_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1),
            CUDNN_TYPE_FLOAT, 1, &alpha));
    PIPER_RETURN_IF_ERROR(
        set(op, PIPER_CUDNN_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2),
            CUDNN_TYPE_FLOAT, 1, &alpha));
    PIPER_RETURN_IF_ERROR(finalize(op, std::string("operation ") + name));
    ops.push_back(op);
    return Status::ok();
  }

  /// c = a @ b (batched over the first two dimensions, b's heads broadcast
  /// over groups of a's), fp32 accumulation.
  Status matmul(const char *name, cudnnBackendDescriptor_t a,
                cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm, op;
    PIPER_RETURN_IF_ERROR(
        create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul", mm));
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    PIPER_RETURN_IF_ERROR(set(mm, PIPER_CUDNN_ATTR(CUDNN_ATTR_MATMUL_COMP_TYPE),
                              CUDNN_TYPE_DATA_TYPE, 1, &comp));
    PIPER_RETURN_IF_ERROR(finalize(mm, std::string("matmul ") + name));
    PIPER_RETURN_IF_ERROR(
        create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, name, op));
    PIPER_RETURN_IF_ERROR(
        set(op, PIPER_CUDNN_ATTR(CUDNN_ATTR_OPERATION_MATMUL_ADESC),
            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a));
    PIPER_RETURN_IF_ERROR(
        set(op, PIPER_CUDNN_ATTR(CUDNN_ATTR_OPERATION_MATMUL_BDESC),
            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
    PIPER_RETURN_IF_ERROR(
        set(op, PIPER_CUDNN_ATTR(CUDNN_ATTR_OPERATION_MATMUL_CDESC),
            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c));
    PIPER_RETURN_IF_ERROR(
        set(op, PIPER_CUDNN_ATTR(CUDNN_ATTR_OPERATION_MATMUL_DESC),
            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm));
    PIPER_RETURN_IF_ERROR(finalize(op, std::string("operation ") + name));
    ops.push_back(op);
    return Status::ok();
  }

  /// y = reduce(x) over the dimensions where y is 1 (or, for a head
  /// dimension of y smaller than x's, over each group of heads).
  Status reduction(const char *name, cudnnReduceTensorOp_t mode,
                   cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t red, op;
    PIPER_RETURN_IF_ERROR(
        create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction", red));
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    PIPER_RETURN_IF_ERROR(set(red,
                              PIPER_CUDNN_ATTR(CUDNN_ATTR_REDUCTION_COMP_TYPE),
                              CUDNN_TYPE_DATA_TYPE, 1, &comp));
    PIPER_RETURN_IF_ERROR(set(red,
                              PIPER_CUDNN_ATTR(CUDNN_ATTR_REDUCTION_OPERATOR),
                              CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode));
    PIPER_RETURN_IF_ERROR(finalize(red, std::string("reduction ") + name));
    PIPER_RETURN_IF_ERROR(
        create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, name, op));
    PIPER_RETURN_IF_ERROR(
        set(op, PIPER_CUDNN_ATTR(CUDNN_ATTR_OPERATION_REDUCTION_XDESC),
            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    PIPER_RETURN_IF_ERROR(
        set(op, PIPER_CUDNN_ATTR(CUDNN_ATTR_OPERATION_REDUCTION_YDESC),
            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    PIPER_RETURN_IF_ERROR(
        set(op, PIPER_CUDNN_ATTR(CUDNN_ATTR_OPERATION_REDUCTION_DESC),
            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &red));
    PIPER_RETURN_IF_ERROR(finalize(op, std::string("operation ") + name));
    ops.push_back(op);
    return Status::ok();
  }

  /// y = x seen through y's dimensions and strides (no data movement).
  Status reshape(const char *name, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op;
    PIPER_RETURN_IF_ERROR(
        create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, name, op));
    PIPER_RETURN_IF_ERROR(
        set(op, PIPER_CUDNN_ATTR(CUDNN_ATTR_OPERATION_RESHAPE_XDESC),
            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    PIPER_RETURN_IF_ERROR(
        set(op, PIPER_CUDNN_ATTR(CUDNN_ATTR_OPERATION_RESHAPE_YDESC),
            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    PIPER_RETURN_IF_ERROR(finalize(op, std::string("operation ") + name));
    ops.push_back(op);
    return Status::ok();
  }

  /// Finalizes the operation graph of every operation added (no handle:
  /// CUDNN_ATTR_OPERATIONGRAPH_HANDLE is deprecated in cuDNN 9).
  Status graph() {
    PIPER_RETURN_IF_ERROR(c.create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR,
                                   "operation graph", g.graph));
    cudnnBackendDescriptor_t desc = g.graph.get();
    PIPER_RETURN_IF_ERROR(
        set(desc, PIPER_CUDNN_ATTR(CUDNN_ATTR_OPERATIONGRAPH_OPS),
            CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops.size()), ops.data()));
    PIPER_RETURN_IF_ERROR(finalize(desc, "operation graph"));
    int64_t count = 0, n = 0;
    PIPER_RETURN_IF_ERROR(c.get(
        desc, PIPER_CUDNN_ATTR(CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT),
        CUDNN_TYPE_INT64, 1, &n, &count));
    g.engineCount = count;
    return Status::ok();
  }

  /// What the causal mask writes (sdpaMaskValue).
  float maskValue() const { return sdpaMaskValue(c.version()); }

  /// Reserves `bytes` of scratch in the workspace for tensor `uid`.
  void addScratch(int64_t uid, size_t bytes) {
    g.scratch.push_back({uid, g.scratchBytes, bytes});
    g.scratchBytes = alignUp(g.scratchBytes + bytes, kScratchAlignment);
  }

private:
  Calls c;
  SdpaGraph &g;
  std::vector<cudnnBackendDescriptor_t> ops;
  int64_t nextVirtual = SdpaUid::FirstVirtual;
};

/// The tensors both passes share, in Piper's packed layout.
struct Layout {
  int64_t b, h, kv, t, d, qkvCols;
  float scale;
  Dims q, qStride;         // [B, H, T, D] in qkv
  Dims kt, ktStride;       // K (or V) transposed: [B, KV, D, T] in qkv
  Dims kvDims, kvStride;   // K or V: [B, KV, T, D] in qkv
  Dims o, oStride;         // O, dO: [B, H, T, D] in [B*T, H*D]
  Dims stats, statsStride; // [B, H, T, 1]
  Dims s, sStride;         // scores [B, H, T, T]
  Dims sT;                 // scores transposed (strides only)
  Dims full, fullStride;   // per-query-head dK/dV [B, H, T, D], contiguous
  explicit Layout(const SdpaShape &sh)
      : b(sh.batch), h(sh.heads), kv(sh.kvHeads), t(sh.seq), d(sh.headDim),
        qkvCols((sh.heads + 2 * sh.kvHeads) * sh.headDim), scale(sh.scale) {
    q = {b, h, t, d};
    qStride = {t * qkvCols, d, qkvCols, 1};
    kt = {b, kv, d, t};
    ktStride = {t * qkvCols, d, 1, qkvCols};
    kvDims = {b, kv, t, d};
    kvStride = {t * qkvCols, d, qkvCols, 1};
    o = {b, h, t, d};
    oStride = {t * h * d, d, h * d, 1};
    stats = {b, h, t, 1};
    statsStride = {h * t, t, 1, 1};
    s = {b, h, t, t};
    sStride = {h * t * t, t * t, t, 1};
    sT = {h * t * t, t * t, 1, t};
    full = {b, h, t, d};
    fullStride = {h * t * d, t * d, d, 1};
  }
};

/// Applies the causal mask to `x` (scores [B, H, T, T]) into `y`: row index
/// >= column index keeps the score, anything else becomes -inf. The form is
/// cudnn-frontend's right-bound diagonal band mask before cuDNN 9.21
/// (GEN_INDEX on axes 2 and 3, CMP_GE, BINARY_SELECT), the one the fused
/// engines match.
Status causalMask(GraphBuilder &gb, const Layout &l, cudnnBackendDescriptor_t x,
                  cudnnBackendDescriptor_t negInf,
                  cudnnBackendDescriptor_t &y) {
  cudnnBackendDescriptor_t row, col, keep;
  PIPER_RETURN_IF_ERROR(gb.temp("row", CUDNN_DATA_INT32, l.s, l.sStride, row));
  PIPER_RETURN_IF_ERROR(gb.pointwise("gen_row_index", CUDNN_POINTWISE_GEN_INDEX,
                                     CUDNN_DATA_FLOAT, x, nullptr, nullptr, row,
                                     2));
  PIPER_RETURN_IF_ERROR(gb.temp("col", CUDNN_DATA_INT32, l.s, l.sStride, col));
  PIPER_RETURN_IF_ERROR(gb.pointwise("gen_col_index", CUDNN_POINTWISE_GEN_INDEX,
                                     CUDNN_DATA_FLOAT, x, nullptr, nullptr, col,
                                     3));
  PIPER_RETURN_IF_ERROR(
      gb.temp("keep", CUDNN_DATA_BOOLEAN, l.s, l.sStride, keep));
  PIPER_RETURN_IF_ERROR(gb.pointwise("row_ge_col", CUDNN_POINTWISE_CMP_GE,
                                     CUDNN_DATA_BOOLEAN, row, col, nullptr,
                                     keep));
  PIPER_RETURN_IF_ERROR(gb.temp("masked", CUDNN_DATA_FLOAT, l.s, l.sStride, y));
  return gb.pointwise("binary_select", CUDNN_POINTWISE_BINARY_SELECT,
                      CUDNN_DATA_FLOAT, x, negInf, keep, y);
}

/// Q @ K^T * scale: the scaled scores both passes start from.
Status scaledScores(GraphBuilder &gb, const Layout &l,
                    cudnnBackendDescriptor_t q, cudnnBackendDescriptor_t kt,
                    cudnnBackendDescriptor_t scale,
                    cudnnBackendDescriptor_t &out) {
  cudnnBackendDescriptor_t s;
  PIPER_RETURN_IF_ERROR(gb.temp("s", CUDNN_DATA_FLOAT, l.s, l.sStride, s));
  PIPER_RETURN_IF_ERROR(gb.matmul("bmm1", q, kt, s));
  PIPER_RETURN_IF_ERROR(
      gb.temp("s_scaled", CUDNN_DATA_FLOAT, l.s, l.sStride, out));
  return gb.pointwise("attn_scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s,
                      scale, nullptr, out);
}

Status buildForward(GraphBuilder &gb, const Layout &l) {
  cudnnBackendDescriptor_t q, kt, v, o, stats, scale, negInf;
  PIPER_RETURN_IF_ERROR(gb.tensor(
      {"Q", SdpaUid::Q, CUDNN_DATA_BFLOAT16, l.q, l.qStride, false}, q));
  PIPER_RETURN_IF_ERROR(gb.tensor(
      {"K", SdpaUid::K, CUDNN_DATA_BFLOAT16, l.kt, l.ktStride, false}, kt));
  PIPER_RETURN_IF_ERROR(gb.tensor(
      {"V", SdpaUid::V, CUDNN_DATA_BFLOAT16, l.kvDims, l.kvStride, false}, v));
  PIPER_RETURN_IF_ERROR(gb.tensor(
      {"O", SdpaUid::O, CUDNN_DATA_BFLOAT16, l.o, l.oStride, false}, o));
  PIPER_RETURN_IF_ERROR(gb.tensor({"Stats", SdpaUid::Stats, CUDNN_DATA_FLOAT,
                                   l.stats, l.statsStride, false},
                                  stats));
  PIPER_RETURN_IF_ERROR(gb.scalar("scale", SdpaUid::Scale, l.scale, scale));
  PIPER_RETURN_IF_ERROR(
      gb.scalar("neg_inf", SdpaUid::NegInf, gb.maskValue(), negInf));

  cudnnBackendDescriptor_t s, masked;
  PIPER_RETURN_IF_ERROR(scaledScores(gb, l, q, kt, scale, s));
  PIPER_RETURN_IF_ERROR(causalMask(gb, l, s, negInf, masked));

  // Softmax as cudnn-frontend's composite lowers it with Stats requested:
  // max, x - max, exp, sum, and Stats = max + log(sum); P = exp / sum.
  cudnnBackendDescriptor_t mx, shifted, e, sum, logSum, p;
  PIPER_RETURN_IF_ERROR(
      gb.temp("max", CUDNN_DATA_FLOAT, l.stats, l.statsStride, mx));
  PIPER_RETURN_IF_ERROR(
      gb.reduction("max", CUDNN_REDUCE_TENSOR_MAX, masked, mx));
  PIPER_RETURN_IF_ERROR(
      gb.temp("sub_max", CUDNN_DATA_FLOAT, l.s, l.sStride, shifted));
  PIPER_RETURN_IF_ERROR(gb.pointwise("sub", CUDNN_POINTWISE_SUB,
                                     CUDNN_DATA_FLOAT, masked, mx, nullptr,
                                     shifted));
  PIPER_RETURN_IF_ERROR(gb.temp("exp", CUDNN_DATA_FLOAT, l.s, l.sStride, e));
  PIPER_RETURN_IF_ERROR(gb.pointwise("exp", CUDNN_POINTWISE_EXP,
                                     CUDNN_DATA_FLOAT, shifted, nullptr,
                                     nullptr, e));
  PIPER_RETURN_IF_ERROR(
      gb.temp("sum", CUDNN_DATA_FLOAT, l.stats, l.statsStride, sum));
  PIPER_RETURN_IF_ERROR(gb.reduction("sum", CUDNN_REDUCE_TENSOR_ADD, e, sum));
  PIPER_RETURN_IF_ERROR(
      gb.temp("log", CUDNN_DATA_FLOAT, l.stats, l.statsStride, logSum));
  PIPER_RETURN_IF_ERROR(gb.pointwise("log", CUDNN_POINTWISE_LOG,
                                     CUDNN_DATA_FLOAT, sum, nullptr, nullptr,
                                     logSum));
  PIPER_RETURN_IF_ERROR(gb.pointwise("add", CUDNN_POINTWISE_ADD,
                                     CUDNN_DATA_FLOAT, mx, logSum, nullptr,
                                     stats));
  // P feeds the second matmul in the input type: the engine rounds it to
  // bf16 before P @ V.
  PIPER_RETURN_IF_ERROR(gb.temp("p", CUDNN_DATA_BFLOAT16, l.s, l.sStride, p));
  PIPER_RETURN_IF_ERROR(gb.pointwise("div", CUDNN_POINTWISE_DIV,
                                     CUDNN_DATA_FLOAT, e, sum, nullptr, p));
  return gb.matmul("bmm2", p, v, o);
}

/// dK or dV: `pT @ rhs` into `out` ([B, KV, T, D] in dqkv); with grouped
/// heads the per-query-head products are summed over each group, as
/// cudnn-frontend does (a bf16 [B, H, T, D] product, then a reduction).
Status headGradient(GraphBuilder &gb, const Layout &l, const char *name,
                    cudnnBackendDescriptor_t pT, cudnnBackendDescriptor_t rhs,
                    cudnnBackendDescriptor_t out) {
  if (l.h == l.kv)
    return gb.matmul(name, pT, rhs, out);
  cudnnBackendDescriptor_t full;
  PIPER_RETURN_IF_ERROR(
      gb.temp(name, CUDNN_DATA_BFLOAT16, l.full, l.fullStride, full));
  PIPER_RETURN_IF_ERROR(gb.matmul(name, pT, rhs, full));
  return gb.reduction(name, CUDNN_REDUCE_TENSOR_ADD, full, out);
}

Status buildBackward(GraphBuilder &gb, const Layout &l, bool accumulateDq) {
  cudnnBackendDescriptor_t q, kt, vt, o, dO, stats, dq, dk, dv, scale, negInf,
      one;
  PIPER_RETURN_IF_ERROR(gb.tensor(
      {"Q", SdpaUid::Q, CUDNN_DATA_BFLOAT16, l.q, l.qStride, false}, q));
  PIPER_RETURN_IF_ERROR(gb.tensor(
      {"K", SdpaUid::K, CUDNN_DATA_BFLOAT16, l.kt, l.ktStride, false}, kt));
  PIPER_RETURN_IF_ERROR(gb.tensor(
      {"V", SdpaUid::V, CUDNN_DATA_BFLOAT16, l.kt, l.ktStride, false}, vt));
  PIPER_RETURN_IF_ERROR(gb.tensor(
      {"O", SdpaUid::O, CUDNN_DATA_BFLOAT16, l.o, l.oStride, false}, o));
  PIPER_RETURN_IF_ERROR(gb.tensor(
      {"dO", SdpaUid::DO, CUDNN_DATA_BFLOAT16, l.o, l.oStride, false}, dO));
  PIPER_RETURN_IF_ERROR(gb.tensor({"Stats", SdpaUid::Stats, CUDNN_DATA_FLOAT,
                                   l.stats, l.statsStride, false},
                                  stats));
  PIPER_RETURN_IF_ERROR(gb.tensor(
      {"dQ", SdpaUid::DQ, CUDNN_DATA_BFLOAT16, l.q, l.qStride, false}, dq));
  PIPER_RETURN_IF_ERROR(gb.tensor(
      {"dK", SdpaUid::DK, CUDNN_DATA_BFLOAT16, l.kvDims, l.kvStride, false},
      dk));
  PIPER_RETURN_IF_ERROR(gb.tensor(
      {"dV", SdpaUid::DV, CUDNN_DATA_BFLOAT16, l.kvDims, l.kvStride, false},
      dv));
  PIPER_RETURN_IF_ERROR(gb.scalar("scale", SdpaUid::Scale, l.scale, scale));
  PIPER_RETURN_IF_ERROR(
      gb.scalar("neg_inf", SdpaUid::NegInf, gb.maskValue(), negInf));
  PIPER_RETURN_IF_ERROR(gb.scalar("one", SdpaUid::One, 1.0f, one));

  // softmax_sum = rowsum(dO * O), fp32 scratch in the workspace.
  cudnnBackendDescriptor_t dOO, rowSum, softmaxSum;
  const Dims dOOStride = {l.h * l.t * l.d, l.t * l.d, l.h * l.d, 1};
  PIPER_RETURN_IF_ERROR(gb.temp("dO_O", CUDNN_DATA_FLOAT, l.o, dOOStride, dOO));
  PIPER_RETURN_IF_ERROR(gb.pointwise("mul_dO_O", CUDNN_POINTWISE_MUL,
                                     CUDNN_DATA_FLOAT, dO, o, nullptr, dOO));
  PIPER_RETURN_IF_ERROR(
      gb.temp("reduce_dO_O", CUDNN_DATA_FLOAT, l.stats, l.statsStride, rowSum));
  PIPER_RETURN_IF_ERROR(
      gb.reduction("reduce_dO_O", CUDNN_REDUCE_TENSOR_ADD, dOO, rowSum));
  PIPER_RETURN_IF_ERROR(
      gb.tensor({"softmax_sum", SdpaUid::SoftmaxSum, CUDNN_DATA_FLOAT, l.stats,
                 l.statsStride, false},
                softmaxSum));
  gb.addScratch(SdpaUid::SoftmaxSum, size_t(l.b * l.h * l.t) * sizeof(float));
  PIPER_RETURN_IF_ERROR(gb.pointwise("scale_dropout_inv", CUDNN_POINTWISE_MUL,
                                     CUDNN_DATA_FLOAT, rowSum, one, nullptr,
                                     softmaxSum));

  // P (unnormalized by construction: exp(s - logsumexp)) recomputed.
  cudnnBackendDescriptor_t s, shifted, masked, e, pT;
  PIPER_RETURN_IF_ERROR(scaledScores(gb, l, q, kt, scale, s));
  PIPER_RETURN_IF_ERROR(
      gb.temp("sub_stats", CUDNN_DATA_FLOAT, l.s, l.sStride, shifted));
  PIPER_RETURN_IF_ERROR(gb.pointwise("sub_s_m", CUDNN_POINTWISE_SUB,
                                     CUDNN_DATA_FLOAT, s, stats, nullptr,
                                     shifted));
  PIPER_RETURN_IF_ERROR(causalMask(gb, l, shifted, negInf, masked));
  PIPER_RETURN_IF_ERROR(gb.temp("exp_s", CUDNN_DATA_FLOAT, l.s, l.sStride, e));
  PIPER_RETURN_IF_ERROR(gb.pointwise("exp_s", CUDNN_POINTWISE_EXP,
                                     CUDNN_DATA_FLOAT, masked, nullptr, nullptr,
                                     e));

  // dV = P^T @ dO.
  PIPER_RETURN_IF_ERROR(gb.temp("p_t", CUDNN_DATA_BFLOAT16, l.s, l.sT, pT));
  PIPER_RETURN_IF_ERROR(gb.reshape("reshape_p", e, pT));
  PIPER_RETURN_IF_ERROR(headGradient(gb, l, "matmul_pT_dO", pT, dO, dv));

  // dS = P * (dO @ V^T - softmax_sum) * scale.
  cudnnBackendDescriptor_t dP, dPSub, dS, dSScaled, dST;
  PIPER_RETURN_IF_ERROR(gb.temp("dP", CUDNN_DATA_FLOAT, l.s, l.sStride, dP));
  PIPER_RETURN_IF_ERROR(gb.matmul("matmul_dO_VT", dO, vt, dP));
  PIPER_RETURN_IF_ERROR(
      gb.temp("dP_sub", CUDNN_DATA_FLOAT, l.s, l.sStride, dPSub));
  PIPER_RETURN_IF_ERROR(gb.pointwise("sub_dP_softmax_sum", CUDNN_POINTWISE_SUB,
                                     CUDNN_DATA_FLOAT, dP, softmaxSum, nullptr,
                                     dPSub));
  PIPER_RETURN_IF_ERROR(gb.temp("dS", CUDNN_DATA_FLOAT, l.s, l.sStride, dS));
  PIPER_RETURN_IF_ERROR(gb.pointwise("mul_dP_exp_s", CUDNN_POINTWISE_MUL,
                                     CUDNN_DATA_FLOAT, dPSub, e, nullptr, dS));
  PIPER_RETURN_IF_ERROR(
      gb.temp("dS_scaled", CUDNN_DATA_FLOAT, l.s, l.sStride, dSScaled));
  PIPER_RETURN_IF_ERROR(gb.pointwise("mul_dS_attn_scale", CUDNN_POINTWISE_MUL,
                                     CUDNN_DATA_FLOAT, dS, scale, nullptr,
                                     dSScaled));

  // dK = dS^T @ Q.
  PIPER_RETURN_IF_ERROR(gb.temp("dS_t", CUDNN_DATA_BFLOAT16, l.s, l.sT, dST));
  PIPER_RETURN_IF_ERROR(gb.reshape("reshape_dS", dSScaled, dST));
  PIPER_RETURN_IF_ERROR(headGradient(gb, l, "matmul_dST_Q", dST, q, dk));

  // dQ = dS @ K, K seen untransposed through a reshape of K^T. The reshape's
  // output is an fp32 virtual tensor, as cudnn-frontend declares it.
  cudnnBackendDescriptor_t k;
  PIPER_RETURN_IF_ERROR(
      gb.temp("k", CUDNN_DATA_FLOAT, l.kvDims, l.kvStride, k));
  PIPER_RETURN_IF_ERROR(gb.reshape("reshape_k", kt, k));
  if (!accumulateDq)
    return gb.matmul("matmul_dS_K", dSScaled, k, dq);
  cudnnBackendDescriptor_t acc;
  PIPER_RETURN_IF_ERROR(
      gb.tensor({"dQ_accum", SdpaUid::DqAccum, CUDNN_DATA_FLOAT, l.full,
                 l.fullStride, false},
                acc));
  gb.addScratch(SdpaUid::DqAccum,
                size_t(l.b * l.h * l.t * l.d) * sizeof(float));
  PIPER_RETURN_IF_ERROR(gb.matmul("matmul_dS_K", dSScaled, k, acc));
  return gb.pointwise("identity_dQ", CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT,
                      acc, nullptr, nullptr, dq);
}

} // namespace

CudnnDescriptor &CudnnDescriptor::operator=(CudnnDescriptor &&other) noexcept {
  if (this != &other) {
    reset();
    lib = other.lib;
    desc = other.desc;
    other.desc = nullptr;
  }
  return *this;
}

void CudnnDescriptor::reset() {
  if (desc && lib)
    lib->cudnnBackendDestroyDescriptor(desc);
  desc = nullptr;
}

std::string describeSdpaShape(const SdpaShape &s) {
  return "batch " + std::to_string(s.batch) + ", seq " + std::to_string(s.seq) +
         ", " + std::to_string(s.heads) + " query / " +
         std::to_string(s.kvHeads) + " key-value heads of " +
         std::to_string(s.headDim);
}

Status validateSdpaShape(const SdpaShape &s, bool backward) {
  auto bad = [&](const std::string &why) {
    return Status::error("invalid attention shape (" + describeSdpaShape(s) +
                         "): " + why);
  };
  if (s.batch <= 0 || s.heads <= 0 || s.kvHeads <= 0 || s.seq <= 0 ||
      s.headDim <= 0)
    return bad("every size must be positive");
  if (!std::isfinite(s.scale) || s.scale <= 0)
    return bad("the scale must be finite and positive, not " +
               std::to_string(s.scale));
  if (s.heads % s.kvHeads != 0)
    return bad("the query heads must be a multiple of the key-value heads");
  if (s.headDim % 8 != 0)
    return bad("the head dimension must be a multiple of 8 (16-byte rows)");
  if (s.headDim > 256)
    return bad("cuDNN's flash attention takes head dimensions up to 256");
  if (backward && s.seq < 2)
    return bad("cuDNN's flash attention backward needs seq >= 2");
  int64_t cols, n;
  if (!product({s.heads + 2 * s.kvHeads, s.headDim}, cols) ||
      !product({s.batch, s.seq, cols}, n) ||
      !product({s.batch, s.heads, s.seq, s.seq}, n) ||
      !product({s.batch, s.heads, s.seq, s.headDim, 4}, n))
    return bad("its element counts overflow int64");
  return Status::ok();
}

Status checkSdpaVersion(size_t version, const SdpaShape &s, bool backward) {
  const std::string v = std::to_string(version / 10000) + "." +
                        std::to_string(version / 100 % 100) + "." +
                        std::to_string(version % 100);
  if (backward && (version == 91000 || version == 91001))
    return Status::error("cuDNN " + v +
                         "'s flash attention backward has known bugs "
                         "(cudnn-frontend refuses it); load another cuDNN "
                         "($PIPER_CUDNN_LIBRARY)");
  // Before 9.15.1 the backward can give NaN or wrong gradients where the
  // sequence is not a multiple of 128 (cudnn-frontend issue 160; the
  // frontend pads such sequences with a mask until 9.15.1). The forward is
  // refused with it, so that both passes of a call run on the same kernels.
  if (version < 91501 && s.seq % 128 != 0)
    return Status::error(
        "cuDNN " + v +
        "'s flash attention backward is wrong for sequences "
        "that are not a multiple of 128 (seq " +
        std::to_string(s.seq) +
        "; fixed in cuDNN 9.15.1): load a newer cuDNN ($PIPER_CUDNN_LIBRARY)");
  return Status::ok();
}

float sdpaMaskValue(size_t version) {
  // cudnn-frontend binds the lowest float before 9.10 ("older cuDNN
  // prefers lowest for the softmax mask"), -inf from 9.10 on.
  return version < 91000 ? std::numeric_limits<float>::lowest()
                         : -std::numeric_limits<float>::infinity();
}

Status buildSdpaGraph(const CudnnLibrary &lib, const SdpaShape &shape,
                      bool backward, SdpaGraph &out, bool accumulateDq) {
  PIPER_RETURN_IF_ERROR(validateSdpaShape(shape, backward));
  PIPER_RETURN_IF_ERROR(
      checkSdpaVersion(lib.version, shape, backward)
          .withContext("cuDNN attention (" + describeSdpaShape(shape) + ")"));
  SdpaGraph g;
  g.shape = shape;
  g.backward = backward;
  g.accumulateDq = backward && accumulateDq;
  GraphBuilder gb(lib, g);
  Layout l(shape);
  Status st =
      backward ? buildBackward(gb, l, g.accumulateDq) : buildForward(gb, l);
  if (st)
    st = gb.graph();
  if (!st)
    return st.withContext(
        std::string("building cuDNN's ") + (backward ? "backward" : "forward") +
        " attention graph (" + describeSdpaShape(shape) + ")");
  out = std::move(g);
  return Status::ok();
}

namespace {

/// A finalized CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR from its JSON.
Status devicePropFromJson(const CudnnLibrary &lib, const std::string &json,
                          CudnnDescriptor &out) {
  if (lib.version < 90800)
    return Status::error("deviceless planning needs cuDNN 9.8 or newer, not " +
                         std::to_string(lib.version));
  Calls c(lib);
  PIPER_RETURN_IF_ERROR(
      c.create(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "device properties", out));
  PIPER_RETURN_IF_ERROR(c.set(
      out.get(), PIPER_CUDNN_ATTR(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION),
      CUDNN_TYPE_CHAR, int64_t(json.size()), json.data()));
  return c.finalize(out.get(), "device properties");
}

/// The knobs cuDNN's attention engines use, by name; others by number.
std::string knobName(cudnnBackendKnobType_t type) {
  switch (type) {
  case CUDNN_KNOB_TYPE_STAGES:
    return "stages";
  case CUDNN_KNOB_TYPE_KERNEL_CFG:
    return "kernel_cfg";
  case CUDNN_KNOB_TYPE_WORKSPACE:
    return "workspace";
  case CUDNN_KNOB_TYPE_TILE_M:
    return "tile_m";
  case CUDNN_KNOB_TYPE_TILE_N:
    return "tile_n";
  case CUDNN_KNOB_TYPE_STREAM_K:
    return "stream_k";
  default:
    return "knob " + std::to_string(int(type));
  }
}

/// The knob choices of an engine configuration, "kernel_cfg=7, stages=2".
std::string knobText(const CudnnLibrary &lib, cudnnBackendDescriptor_t cfg) {
  Calls c(lib);
  std::vector<CudnnDescriptor> owned(CUDNN_KNOB_TYPE_COUNTS);
  std::vector<cudnnBackendDescriptor_t> raw(CUDNN_KNOB_TYPE_COUNTS);
  for (size_t i = 0; i < owned.size(); ++i) {
    if (!c.create(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, "knob choice",
                  owned[i]))
      return "";
    raw[i] = owned[i].get();
  }
  int64_t n = 0;
  if (!c.get(cfg, PIPER_CUDNN_ATTR(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES),
             CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(raw.size()), &n,
             raw.data()))
    return "";
  std::string text;
  for (int64_t i = 0; i < n; ++i) {
    cudnnBackendKnobType_t type;
    int64_t value = 0, got = 0;
    if (!c.get(raw[i], PIPER_CUDNN_ATTR(CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE),
               CUDNN_TYPE_KNOB_TYPE, 1, &got, &type) ||
        !c.get(raw[i], PIPER_CUDNN_ATTR(CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE),
               CUDNN_TYPE_INT64, 1, &got, &value))
      return text;
    text += (text.empty() ? "" : ", ") + knobName(type) + "=" +
            std::to_string(value);
  }
  return text;
}

/// What one heuristics result is: its engine's index and numerical notes.
struct Candidate {
  CudnnDescriptor config;
  int64_t engine = -1;
  bool nondeterministic = false;
  std::string notes; // "tensor core, nondeterministic"
};

const char *noteName(cudnnBackendNumericalNote_t note) {
  switch (note) {
  case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:
    return "tensor core";
  case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS:
    return "down-converts inputs";
  case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION:
    return "reduced-precision reduction";
  case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC:
    return "nondeterministic";
  default:
    return "other";
  }
}

Status inspect(const CudnnLibrary &lib, Candidate &cand) {
  Calls c(lib);
  CudnnDescriptor engine;
  PIPER_RETURN_IF_ERROR(
      c.create(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine", engine));
  cudnnBackendDescriptor_t raw = engine.get();
  int64_t n = 0;
  PIPER_RETURN_IF_ERROR(c.get(cand.config.get(),
                              PIPER_CUDNN_ATTR(CUDNN_ATTR_ENGINECFG_ENGINE),
                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &raw));
  PIPER_RETURN_IF_ERROR(c.get(raw,
                              PIPER_CUDNN_ATTR(CUDNN_ATTR_ENGINE_GLOBAL_INDEX),
                              CUDNN_TYPE_INT64, 1, &n, &cand.engine));
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT>
      notes;
  PIPER_RETURN_IF_ERROR(c.get(
      raw, PIPER_CUDNN_ATTR(CUDNN_ATTR_ENGINE_NUMERICAL_NOTE),
      CUDNN_TYPE_NUMERICAL_NOTE, int64_t(notes.size()), &n, notes.data()));
  for (int64_t i = 0; i < n && i < int64_t(notes.size()); ++i) {
    cand.nondeterministic |= notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
    cand.notes +=
        (cand.notes.empty() ? "" : ", ") + std::string(noteName(notes[i]));
  }
  return Status::ok();
}

/// The engine configurations heuristics `mode` proposes for `graph`, for
/// the GPU of the handle the plan later runs on or the one `deviceProp`
/// describes.
Status heuristics(const CudnnLibrary &lib, cudnnBackendDescriptor_t graph,
                  cudnnBackendHeurMode_t mode,
                  cudnnBackendDescriptor_t deviceProp,
                  std::vector<Candidate> &out) {
  Calls c(lib);
  CudnnDescriptor heur;
  PIPER_RETURN_IF_ERROR(
      c.create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics", heur));
  PIPER_RETURN_IF_ERROR(
      c.set(heur.get(), PIPER_CUDNN_ATTR(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH),
            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph));
  PIPER_RETURN_IF_ERROR(c.set(heur.get(),
                              PIPER_CUDNN_ATTR(CUDNN_ATTR_ENGINEHEUR_MODE),
                              CUDNN_TYPE_HEUR_MODE, 1, &mode));
  if (deviceProp)
    PIPER_RETURN_IF_ERROR(
        c.set(heur.get(), PIPER_CUDNN_ATTR(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP),
              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &deviceProp));
  PIPER_RETURN_IF_ERROR(c.finalize(heur.get(), "engine heuristics"));
  int64_t count = 0;
  PIPER_RETURN_IF_ERROR(
      c.get(heur.get(), PIPER_CUDNN_ATTR(CUDNN_ATTR_ENGINEHEUR_RESULTS),
            CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  std::vector<CudnnDescriptor> configs(size_t(std::max<int64_t>(count, 0)));
  std::vector<cudnnBackendDescriptor_t> raw(configs.size());
  for (size_t i = 0; i < configs.size(); ++i) {
    PIPER_RETURN_IF_ERROR(c.create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
                                   "engine config", configs[i]));
    raw[i] = configs[i].get();
  }
  int64_t got = 0;
  if (count > 0)
    PIPER_RETURN_IF_ERROR(
        c.get(heur.get(), PIPER_CUDNN_ATTR(CUDNN_ATTR_ENGINEHEUR_RESULTS),
              CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()));
  for (int64_t i = 0; i < got && i < int64_t(configs.size()); ++i) {
    Candidate cand;
    cand.config = std::move(configs[size_t(i)]);
    PIPER_RETURN_IF_ERROR(inspect(lib, cand));
    out.push_back(std::move(cand));
  }
  return Status::ok();
}

} // namespace

Status cudnnDevicePropJson(const CudnnLibrary &lib, int deviceOrdinal,
                           std::string &json) {
  if (lib.version < 90800)
    return Status::error("device properties need cuDNN 9.8 or newer, not " +
                         std::to_string(lib.version));
  Calls c(lib);
  CudnnDescriptor prop;
  int32_t id = deviceOrdinal;
  PIPER_RETURN_IF_ERROR(
      c.create(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "device properties", prop));
  PIPER_RETURN_IF_ERROR(c.set(prop.get(),
                              PIPER_CUDNN_ATTR(CUDNN_ATTR_DEVICEPROP_DEVICE_ID),
                              CUDNN_TYPE_INT32, 1, &id));
  Status st = c.finalize(prop.get(), "device properties");
  if (!st)
    return st.withContext("reading the properties of GPU " +
                          std::to_string(deviceOrdinal));
  int64_t size = 0;
  PIPER_RETURN_IF_ERROR(c.get(
      prop.get(), PIPER_CUDNN_ATTR(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION),
      CUDNN_TYPE_CHAR, 0, &size, nullptr));
  std::string text(size_t(std::max<int64_t>(size, 0)), '\0');
  PIPER_RETURN_IF_ERROR(c.get(
      prop.get(), PIPER_CUDNN_ATTR(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION),
      CUDNN_TYPE_CHAR, size, &size, text.data()));
  // The count includes a terminating NUL.
  while (!text.empty() && text.back() == '\0')
    text.pop_back();
  json = std::move(text);
  return Status::ok();
}

Status SdpaPlan::create(const CudnnLibrary &lib, cudnnHandle_t handle,
                        const SdpaShape &shape, bool backward,
                        bool allowNondeterministic,
                        std::unique_ptr<SdpaPlan> &out) {
  if (!handle)
    return Status::error("planning cuDNN attention needs a cuDNN handle "
                         "(cudnnCreate on the GPU it runs on)");
  return plan(lib, handle, nullptr, shape, backward, allowNondeterministic,
              out);
}

Status SdpaPlan::createDeviceless(const CudnnLibrary &lib,
                                  const std::string &devicePropJson,
                                  const SdpaShape &shape, bool backward,
                                  bool allowNondeterministic,
                                  std::unique_ptr<SdpaPlan> &out) {
  return plan(lib, nullptr, &devicePropJson, shape, backward,
              allowNondeterministic, out);
}

namespace {

/// Finalizes an execution plan of `cfg` and reads its workspace size.
/// Finalizing compiles the engine's kernel (NVRTC for the flash engines)
/// and loads it into the driver; without a GPU (`deviceless`) the load
/// fails, and the plan is then left unfinalized (`plan` empty, the reason
/// in `unfinalized`) with the engine configuration's workspace size.
Status finalizePlan(const CudnnLibrary &lib, cudnnBackendDescriptor_t cfg,
                    bool deviceless, CudnnDescriptor &plan, int64_t &bytes,
                    std::string &unfinalized) {
  Calls c(lib);
  PIPER_RETURN_IF_ERROR(c.create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
                                 "execution plan", plan));
  PIPER_RETURN_IF_ERROR(c.set(
      plan.get(), PIPER_CUDNN_ATTR(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG),
      CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg));
  cudnnStatus_t st = lib.cudnnBackendFinalize(plan.get());
  int64_t n = 0;
  if (st == CUDNN_STATUS_SUCCESS)
    return c.get(plan.get(),
                 PIPER_CUDNN_ATTR(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE),
                 CUDNN_TYPE_INT64, 1, &n, &bytes);
  std::string why = lib.errorText("cudnnBackendFinalize(execution plan)", st);
  const bool noDriver =
      st == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER ||
      st == CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING;
  if (!deviceless || !noDriver)
    return Status::error(why);
  plan.reset();
  unfinalized = why;
  return c.get(cfg, PIPER_CUDNN_ATTR(CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE),
               CUDNN_TYPE_INT64, 1, &n, &bytes);
}

} // namespace

Status SdpaPlan::plan(const CudnnLibrary &lib, cudnnHandle_t handle,
                      const std::string *devicePropJson, const SdpaShape &shape,
                      bool backward, bool allowNondeterministic,
                      std::unique_ptr<SdpaPlan> &out) {
  // Plans bind no handle (CUDNN_ATTR_EXECUTION_PLAN_HANDLE is deprecated in
  // cuDNN 9): heuristics and finalization use the calling thread's current
  // device, and execution names the handle.
  (void)handle;
  const std::string what = std::string("causal attention ") +
                           (backward ? "backward" : "forward") + " (" +
                           describeSdpaShape(shape) + ")";
  std::unique_ptr<SdpaPlan> p(new SdpaPlan());
  p->lib = &lib;
  if (devicePropJson) {
    Status st = devicePropFromJson(lib, *devicePropJson, p->deviceProp);
    if (!st)
      return st.withContext("planning cuDNN's " + what + " without a GPU");
  }
  // Backward: the direct-dQ graph is what cuDNN's deterministic engines
  // implement; where nondeterminism is allowed, the fp32-accumulator graph
  // (atomics, less workspace) is tried first.
  std::vector<bool> variants = {false};
  if (backward && allowNondeterministic)
    variants = {true, false};
  std::string refused;
  auto refuse = [&](const std::string &why) {
    refused += (refused.empty() ? "" : "; ") + why;
  };
  for (bool accumulateDq : variants) {
    SdpaGraph graph;
    PIPER_RETURN_IF_ERROR(
        buildSdpaGraph(lib, shape, backward, graph, accumulateDq));
    std::vector<Candidate> cands;
    for (cudnnBackendHeurMode_t mode :
         {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      Status st =
          heuristics(lib, graph.graph.get(), mode, p->deviceProp.get(), cands);
      if (!st)
        refuse(std::string("heuristics ") +
               (mode == CUDNN_HEUR_MODE_A ? "A" : "FALLBACK") + ": " +
               st.message());
    }
    std::vector<std::string> tried; // both modes may propose a config
    for (Candidate &cand : cands) {
      std::string knobs = knobText(lib, cand.config.get());
      std::string name = "engine " + std::to_string(cand.engine) +
                         (knobs.empty() ? "" : " (knobs " + knobs + ")");
      if (std::find(tried.begin(), tried.end(), name) != tried.end())
        continue;
      tried.push_back(name);
      if (cand.nondeterministic && !allowNondeterministic) {
        refuse(name + ": nondeterministic");
        continue;
      }
      CudnnDescriptor plan;
      int64_t bytes = 0;
      std::string unfinalized;
      Status st = finalizePlan(lib, cand.config.get(), devicePropJson, plan,
                               bytes, unfinalized);
      if (!st) {
        refuse(name + ": " + st.message());
        continue;
      }
      p->graph = std::move(graph);
      p->engineConfig = std::move(cand.config);
      p->executionPlan = std::move(plan);
      p->engineBytes = alignUp(size_t(std::max<int64_t>(bytes, 0)), 16);
      p->engineText = name + (cand.notes.empty() ? "" : ", " + cand.notes) +
                      (p->graph.accumulateDq ? ", fp32 dQ accumulator" : "");
      if (!unfinalized.empty())
        p->engineText +=
            "; execution plan not finalized without a GPU: " + unfinalized;
      p->canExecute = devicePropJson == nullptr;
      out = std::move(p);
      return Status::ok();
    }
  }
  if (refused.empty())
    refused = "heuristics proposed none (cuDNN's flash engines compile at "
              "run time and need the CUDA driver, libcuda.so.1; "
              "CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr shows cuDNN's "
              "reasons)";
  return Status::error(std::string("cuDNN has no ") +
                       (allowNondeterministic ? "" : "deterministic ") +
                       "engine for " + what + ": " + refused);
}

Status SdpaPlan::planJson(std::string &json) const {
  if (!executionPlan.get())
    return Status::error("this cuDNN attention plan has no finalized "
                         "execution plan (it was planned without a GPU)");
  Calls c(*lib);
  int64_t size = 0;
  PIPER_RETURN_IF_ERROR(
      c.get(executionPlan.get(),
            PIPER_CUDNN_ATTR(CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION),
            CUDNN_TYPE_CHAR, 0, &size, nullptr));
  std::string text(size_t(std::max<int64_t>(size, 0)), '\0');
  PIPER_RETURN_IF_ERROR(
      c.get(executionPlan.get(),
            PIPER_CUDNN_ATTR(CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION),
            CUDNN_TYPE_CHAR, size, &size, text.data()));
  while (!text.empty() && text.back() == '\0')
    text.pop_back();
  json = std::move(text);
  return Status::ok();
}

Status SdpaPlan::execute(cudnnHandle_t handle, std::vector<int64_t> uids,
                         std::vector<void *> pointers, void *workspace) const {
  if (!canExecute)
    return Status::error("this cuDNN attention plan was made without a GPU "
                         "and cannot run");
  if (workspaceBytes() > 0 && !workspace)
    return Status::error("cuDNN attention needs " +
                         std::to_string(workspaceBytes()) +
                         " bytes of workspace, and none was given");
  for (const SdpaGraph::Scalar &s : graph.scalars) {
    uids.push_back(s.uid);
    pointers.push_back(const_cast<float *>(&s.value));
  }
  char *ws = static_cast<char *>(workspace);
  for (const SdpaGraph::Scratch &s : graph.scratch) {
    uids.push_back(s.uid);
    pointers.push_back(ws + s.offset);
  }
  void *engineWorkspace = engineBytes ? ws + graph.scratchBytes : nullptr;
  Calls c(*lib);
  CudnnDescriptor pack;
  PIPER_RETURN_IF_ERROR(
      c.create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack", pack));
  PIPER_RETURN_IF_ERROR(
      c.set(pack.get(), PIPER_CUDNN_ATTR(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS),
            CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data()));
  PIPER_RETURN_IF_ERROR(
      c.set(pack.get(), PIPER_CUDNN_ATTR(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS),
            CUDNN_TYPE_VOID_PTR, int64_t(pointers.size()), pointers.data()));
  PIPER_RETURN_IF_ERROR(
      c.set(pack.get(), PIPER_CUDNN_ATTR(CUDNN_ATTR_VARIANT_PACK_WORKSPACE),
            CUDNN_TYPE_VOID_PTR, 1, &engineWorkspace));
  PIPER_RETURN_IF_ERROR(c.finalize(pack.get(), "variant pack"));
  cudnnStatus_t st =
      lib->cudnnBackendExecute(handle, executionPlan.get(), pack.get());
  if (st != CUDNN_STATUS_SUCCESS)
    return Status::error(lib->errorText("cudnnBackendExecute", st))
        .withContext(std::string("cuDNN attention ") +
                     (graph.backward ? "backward" : "forward") + " (" +
                     describeSdpaShape(graph.shape) + ", " + engineText + ")");
  return Status::ok();
}

Status SdpaPlan::forward(cudnnHandle_t handle, const void *qkv, void *o,
                         float *stats, void *workspace) const {
  if (graph.backward)
    return Status::error("forward called on a backward attention plan");
  const SdpaShape &s = graph.shape;
  auto *base = static_cast<char *>(const_cast<void *>(qkv));
  const size_t bf16 = 2;
  return execute(
      handle, {SdpaUid::Q, SdpaUid::K, SdpaUid::V, SdpaUid::O, SdpaUid::Stats},
      {base, base + size_t(s.heads * s.headDim) * bf16,
       base + size_t((s.heads + s.kvHeads) * s.headDim) * bf16, o, stats},
      workspace);
}

Status SdpaPlan::backward(cudnnHandle_t handle, const void *qkv, const void *o,
                          const void *dO, const float *stats, void *dqkv,
                          void *workspace) const {
  if (!graph.backward)
    return Status::error("backward called on a forward attention plan");
  const SdpaShape &s = graph.shape;
  auto *in = static_cast<char *>(const_cast<void *>(qkv));
  auto *grad = static_cast<char *>(dqkv);
  const size_t bf16 = 2;
  const size_t kOffset = size_t(s.heads * s.headDim) * bf16;
  const size_t vOffset = size_t((s.heads + s.kvHeads) * s.headDim) * bf16;
  return execute(handle,
                 {SdpaUid::Q, SdpaUid::K, SdpaUid::V, SdpaUid::O, SdpaUid::DO,
                  SdpaUid::Stats, SdpaUid::DQ, SdpaUid::DK, SdpaUid::DV},
                 {in, in + kOffset, in + vOffset, const_cast<void *>(o),
                  const_cast<void *>(dO), const_cast<float *>(stats), grad,
                  grad + kOffset, grad + vOffset},
                 workspace);
}

} // namespace piper::runtime::hal
