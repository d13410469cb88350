// Operand and attribute validation shared by all CPU kernels, and the one
// place that calls cblas_sgemm.
#include "runtime/kernels/KernelUtil.h"

#include <cblas.h>

#include <climits>
#include <cmath>

#include "support/Precision.h"

namespace piper::runtime::detail {

std::string shapeString(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i)
      s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

const char *dtypeName(plan::DType dtype) {
  switch (dtype) {
  case plan::F32:
    return "f32";
  case plan::I32:
    return "i32";
  case plan::BF16:
    return "bf16";
  default:
    return "unspecified";
  }
}

static std::string plural(size_t n, const char *noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

namespace {
Status checkStorage(const KernelArgs &a, const TensorRef &t,
                    const std::string &what) {
  int64_t numel = 1;
  for (int64_t d : t.shape) {
    if (d < 0)
      return a.error(what + " has negative dimension in shape " +
                     shapeString(t.shape));
    if (__builtin_mul_overflow(numel, d, &numel) || numel > (INT64_MAX >> 3))
      return a.error(what + " has too many elements, shape " +
                     shapeString(t.shape));
  }
  if (numel > 0 && !t.data)
    return a.error(what + " has no storage");
  return Status::ok();
}
} // namespace

Status checkOperandStorage(const KernelArgs &a) {
  for (size_t i = 0; i < a.inputs.size(); ++i)
    PIPER_RETURN_IF_ERROR(
        checkStorage(a, a.inputs[i], "input " + std::to_string(i)));
  for (size_t i = 0; i < a.outputs.size(); ++i)
    PIPER_RETURN_IF_ERROR(
        checkStorage(a, a.outputs[i], "output " + std::to_string(i)));
  return Status::ok();
}

Status expectCounts(const KernelArgs &a, size_t minInputs, size_t maxInputs,
                    size_t numOutputs) {
  size_t numInputs = a.inputs.size();
  if (numInputs < minInputs || numInputs > maxInputs) {
    std::string want =
        minInputs == maxInputs
            ? plural(minInputs, "input")
            : std::to_string(minInputs) + " or " + plural(maxInputs, "input");
    return a.error("expected " + want + ", got " + std::to_string(numInputs));
  }
  if (a.outputs.size() != numOutputs)
    return a.error("expected " + plural(numOutputs, "output") + ", got " +
                   std::to_string(a.outputs.size()));
  return Status::ok();
}

Status expectDType(const KernelArgs &a, const TensorRef &t, const char *name,
                   plan::DType dtype) {
  if (t.dtype != dtype)
    return a.error(std::string(name) + " must be " + dtypeName(dtype) +
                   ", got " + dtypeName(t.dtype));
  return Status::ok();
}

Status expectTensor(const KernelArgs &a, const TensorRef &t, const char *name,
                    plan::DType dtype, const std::vector<int64_t> &shape) {
  PIPER_RETURN_IF_ERROR(expectDType(a, t, name, dtype));
  if (t.shape != shape)
    return a.error(std::string(name) + " has shape " + shapeString(t.shape) +
                   ", expected " + shapeString(shape));
  return Status::ok();
}

Status expectMatrix(const KernelArgs &a, const TensorRef &t, const char *name,
                    plan::DType dtype, int64_t &rows, int64_t &cols) {
  PIPER_RETURN_IF_ERROR(expectDType(a, t, name, dtype));
  if (t.shape.size() != 2)
    return a.error(std::string(name) + " has shape " + shapeString(t.shape) +
                   ", expected rank 2");
  rows = t.shape[0];
  cols = t.shape[1];
  return Status::ok();
}

bool hasValidCols(const KernelArgs &a) {
  return a.attrs[KernelAttr::kValidCols].kind != KernelAttrs::Value::kAbsent;
}

plan::DType packableDType(const KernelArgs &a, const TensorRef &t) {
  return a.ctx.lowPrecision && t.dtype == plan::BF16 ? plan::BF16 : plan::F32;
}

// The dtype a GEMM's operand may have: f32, or packed bf16 where it is
// `packable` and the call is in mixed precision.
static plan::DType gemmDType(const KernelArgs &a, const TensorRef &t,
                             bool packable) {
  return packable ? packableDType(a, t) : plan::F32;
}

Status expectGemmMatrix(const KernelArgs &a, const TensorRef &t,
                        const char *name, int64_t &rows, int64_t &cols) {
  return expectMatrix(a, t, name, gemmDType(a, t, true), rows, cols);
}

Status expectPackableOutput(const KernelArgs &a, const TensorRef &t,
                            const char *name,
                            const std::vector<int64_t> &shape) {
  return expectTensor(a, t, name, gemmDType(a, t, true), shape);
}

float *outputRow(const TensorRef &t, int64_t n, int64_t cols,
                 std::vector<float> &scratch) {
  if (t.dtype != plan::BF16)
    return t.f32() + n * cols;
  scratch.resize(static_cast<size_t>(cols));
  return scratch.data();
}

void storeRow(const TensorRef &t, int64_t n, int64_t ld, int64_t cols,
              const float *row) {
  if (t.dtype == plan::BF16)
    packBf16(static_cast<uint16_t *>(t.data) + n * ld, row, cols);
}

const float *fp32Data(const TensorRef &t, std::vector<float> &tmp) {
  if (t.dtype != plan::BF16)
    return t.f32();
  tmp.resize(static_cast<size_t>(t.numel()));
  unpackBf16(tmp.data(), static_cast<const uint16_t *>(t.data), t.numel());
  return tmp.data();
}

Status expectPaddedMatrix(const KernelArgs &a, const TensorRef &t,
                          const char *name, int64_t &rows, int64_t &cols,
                          int64_t &ld, bool packable) {
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, t, name, gemmDType(a, t, packable), rows, ld));
  cols = ld;
  if (!hasValidCols(a))
    return Status::ok();
  int64_t valid = 0;
  PIPER_RETURN_IF_ERROR(readPositiveInt(a, KernelAttr::kValidCols, {}, valid));
  if (valid > ld)
    return a.error(std::string(name) + " has shape " + shapeString(t.shape) +
                   ", fewer columns than valid_cols=" + std::to_string(valid));
  cols = valid;
  return Status::ok();
}

Status expectPaddedRows(const KernelArgs &a, const TensorRef &t,
                        const char *name, int64_t rows, int64_t cols,
                        int64_t &ld, bool packable) {
  int64_t r = 0, c = 0;
  PIPER_RETURN_IF_ERROR(expectPaddedMatrix(a, t, name, r, c, ld, packable));
  if (r == rows && c == cols)
    return Status::ok();
  const bool padded = hasValidCols(a);
  return a.error(std::string(name) + " has shape " + shapeString(t.shape) +
                 (padded ? " with valid_cols=" + std::to_string(c) : "") +
                 ", expected [" + std::to_string(rows) + "," +
                 std::to_string(cols) + "]" + (padded ? " valid columns" : ""));
}

Status expectScalar(const KernelArgs &a, const TensorRef &t, const char *name) {
  PIPER_RETURN_IF_ERROR(expectDType(a, t, name, plan::F32));
  if (t.shape.size() > 1 || t.numel() != 1)
    return a.error(std::string(name) + " has shape " + shapeString(t.shape) +
                   ", expected a scalar");
  return Status::ok();
}

Status expectTokens(const KernelArgs &a, const TensorRef &t, const char *name,
                    int64_t &count) {
  PIPER_RETURN_IF_ERROR(expectDType(a, t, name, plan::I32));
  if (t.shape.empty() || t.shape.size() > 2)
    return a.error(std::string(name) + " has shape " + shapeString(t.shape) +
                   ", expected [batch,seq]");
  count = t.numel();
  return Status::ok();
}

Status expectTokensBelow(const KernelArgs &a, const TensorRef &t,
                         const char *name, int64_t limit) {
  const int32_t *ids = t.i32();
  for (int64_t n = 0, e = t.numel(); n < e; ++n)
    if (ids[n] < 0 || ids[n] >= limit)
      return a.error(std::string(name) + "[" + std::to_string(n) +
                     "] = " + std::to_string(ids[n]) + " is out of range [0, " +
                     std::to_string(limit) + ")");
  return Status::ok();
}

Status expectBlasDims(const KernelArgs &a,
                      std::initializer_list<int64_t> dims) {
  for (int64_t d : dims)
    if (d > INT_MAX)
      return a.error("dimension " + std::to_string(d) +
                     " is too large for blas");
  return Status::ok();
}

namespace {
// Error paths only: building the name's string is no cost on a good call.
Status missingAttr(const KernelArgs &a, KernelAttr id) {
  return a.error("missing attribute '" + std::string(kernelAttrName(id)) + "'");
}
Status badAttr(const KernelArgs &a, KernelAttr id, const std::string &what) {
  return a.error("attribute '" + std::string(kernelAttrName(id)) + "' " + what);
}
} // namespace

Status readVocabShard(const KernelArgs &a, int64_t vocab, bool required,
                      int64_t &members, int64_t &first) {
  PIPER_RETURN_IF_ERROR(
      readInt(a, KernelAttr::kMembers,
              required ? std::nullopt : std::optional<int64_t>(1), members));
  if (members < 1 || (required && members < 2))
    return a.error("members " + std::to_string(members) + " must be at least " +
                   (required ? "2" : "1"));
  int64_t member = members == 1 ? 0 : a.ctx.tensorMember;
  if (member < 0 || member >= members)
    return a.error("tensor-parallel member " +
                   std::to_string(a.ctx.tensorMember) + " is not one of " +
                   std::to_string(members));
  first = member * vocab;
  return Status::ok();
}

Status readInt(const KernelArgs &a, KernelAttr id, std::optional<int64_t> dflt,
               int64_t &value) {
  const KernelAttrs::Value &attr = a.attrs[id];
  switch (attr.kind) {
  case KernelAttrs::Value::kAbsent:
    if (!dflt)
      return missingAttr(a, id);
    value = *dflt;
    return Status::ok();
  case KernelAttrs::Value::kInt:
    value = attr.i;
    return Status::ok();
  case KernelAttrs::Value::kFloat:
    // Writers that only emit doubles still get integral attributes through.
    if (std::isfinite(attr.f) && std::trunc(attr.f) == attr.f &&
        std::fabs(attr.f) < 0x1p62) {
      value = static_cast<int64_t>(attr.f);
      return Status::ok();
    }
    break;
  case KernelAttrs::Value::kOther:
    break;
  }
  return badAttr(a, id, "must be an integer");
}

Status readPositiveInt(const KernelArgs &a, KernelAttr id,
                       std::optional<int64_t> dflt, int64_t &value) {
  PIPER_RETURN_IF_ERROR(readInt(a, id, dflt, value));
  if (value < 1)
    return badAttr(a, id, "must be positive, got " + std::to_string(value));
  return Status::ok();
}

Status readFloat(const KernelArgs &a, KernelAttr id, std::optional<double> dflt,
                 double &value) {
  const KernelAttrs::Value &attr = a.attrs[id];
  switch (attr.kind) {
  case KernelAttrs::Value::kAbsent:
    if (!dflt)
      return missingAttr(a, id);
    value = *dflt;
    return Status::ok();
  case KernelAttrs::Value::kFloat:
    value = attr.f;
    break;
  case KernelAttrs::Value::kInt:
    value = static_cast<double>(attr.i);
    break;
  case KernelAttrs::Value::kOther:
    return badAttr(a, id, "must be a number");
  }
  if (!std::isfinite(value))
    return badAttr(a, id, "must be finite");
  return Status::ok();
}

Status readFlag(const KernelArgs &a, KernelAttr id, bool &flag) {
  int64_t value = 0;
  PIPER_RETURN_IF_ERROR(readInt(a, id, 0, value));
  if (value != 0 && value != 1)
    return a.error(std::string("attribute '") + kernelAttrName(id) +
                   "' must be 0 or 1, got " + std::to_string(value));
  flag = value == 1;
  return Status::ok();
}

Status readTransposeW(const KernelArgs &a, bool &transposeW) {
  return readFlag(a, KernelAttr::kTransposeW, transposeW);
}

void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
          float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
          float beta, float *c, int64_t ldc) {
  if (m == 0 || n == 0)
    return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
              transB ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

} // namespace piper::runtime::detail
