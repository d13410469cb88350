// Unit tests of the CPU kernels: hand-computed forward cases, finite-difference
// checks of every gradient, the AdamW update and the error paths.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/kernels/AttentionChecks.h"
#include "runtime/kernels/KernelUtil.h"
#include "runtime/kernels/Kernels.h"
#include "runtime/support/Precision.h"

using namespace piper;
using namespace piper::runtime;

namespace {

/// An owning tensor for tests.
struct Tensor {
  plan::DType dtype = plan::F32;
  std::vector<int64_t> shape;
  std::vector<float> f;
  std::vector<int32_t> i;

  static Tensor f32(std::vector<int64_t> shape,
                    std::vector<float> values = {}) {
    Tensor t;
    t.shape = std::move(shape);
    t.f = std::move(values);
    if (t.f.empty())
      t.f.assign(t.numel(), 0.0f);
    REQUIRE(int64_t(t.f.size()) == t.numel());
    return t;
  }
  static Tensor i32(std::vector<int64_t> shape, std::vector<int32_t> values) {
    Tensor t;
    t.dtype = plan::I32;
    t.shape = std::move(shape);
    t.i = std::move(values);
    REQUIRE(int64_t(t.i.size()) == t.numel());
    return t;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
  TensorRef ref() {
    TensorRef r;
    r.dtype = dtype;
    r.shape = shape;
    r.data = dtype == plan::I32 ? static_cast<void *>(i.data())
                                : static_cast<void *>(f.data());
    return r;
  }
};

/// Builds a plan::Kernel: K("attention").i("heads", 2).f("eps", 1e-5).
struct K {
  plan::Kernel kernel;
  explicit K(const std::string &op) { kernel.set_op(op); }
  K &i(const std::string &name, int64_t v) {
    (*kernel.mutable_attrs())[name].set_i(v);
    return *this;
  }
  K &f(const std::string &name, double v) {
    (*kernel.mutable_attrs())[name].set_f(v);
    return *this;
  }
  K &s(const std::string &name, const std::string &v) {
    (*kernel.mutable_attrs())[name].set_s(v);
    return *this;
  }
  operator const plan::Kernel &() const { return kernel; }
};

Status run(const plan::Kernel &kernel, std::vector<Tensor> &ins,
           std::vector<Tensor> &outs, KernelContext &ctx) {
  std::vector<TensorRef> inRefs, outRefs;
  for (Tensor &t : ins)
    inRefs.push_back(t.ref());
  for (Tensor &t : outs)
    outRefs.push_back(t.ref());
  return runKernel(kernel, inRefs, outRefs, ctx);
}

Status run(const plan::Kernel &kernel, std::vector<Tensor> &ins,
           std::vector<Tensor> &outs) {
  KernelContext ctx;
  return run(kernel, ins, outs, ctx);
}

/// Runs a kernel that must succeed.
void mustRun(const plan::Kernel &kernel, std::vector<Tensor> &ins,
             std::vector<Tensor> &outs) {
  Status s = run(kernel, ins, outs);
  INFO(kernel.op() << ": " << s.message());
  REQUIRE(s.isOk());
}

/// Runs a kernel that must fail with an error naming its op.
std::string mustFail(const plan::Kernel &kernel, std::vector<Tensor> ins,
                     std::vector<Tensor> outs = {}) {
  Status s = run(kernel, ins, outs);
  INFO(kernel.op());
  REQUIRE_FALSE(s.isOk());
  CHECK(s.message().rfind(kernel.op() + ": ", 0) == 0);
  CHECK(s.message().back() != '.');
  return s.message();
}

/// Deterministic uniform numbers in [lo, hi) (splitmix64), the same on every
/// standard library.
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed) {}
  double next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return double(z >> 11) * 0x1p-53;
  }
  float uniform(double lo, double hi) { return float(lo + (hi - lo) * next()); }
  std::vector<float> vec(int64_t n, double lo = -1.0, double hi = 1.0) {
    std::vector<float> v(n);
    for (float &x : v)
      x = uniform(lo, hi);
    return v;
  }
};

Tensor randomF32(Rng &rng, std::vector<int64_t> shape, double lo = -1.0,
                 double hi = 1.0) {
  Tensor t = Tensor::f32(std::move(shape));
  t.f = rng.vec(t.numel(), lo, hi);
  return t;
}

/// L = sum(y * r) over output `which` of the forward kernel, whose outputs
/// are shaped like `outs`, in double.
double probeLoss(const plan::Kernel &forward, std::vector<Tensor> ins,
                 std::vector<Tensor> outs, size_t which,
                 const std::vector<float> &r) {
  Status s = run(forward, ins, outs);
  if (!s.isOk())
    FAIL(s.message());
  double loss = 0;
  for (size_t e = 0; e < r.size(); ++e)
    loss += double(outs[which].f[e]) * r[e];
  return loss;
}

/// Compares `analytic` = dL/d(ins[wrt]) with central differences of
/// probeLoss on output `which` of a forward whose outputs are shaped like
/// `outs`, element by element. The forward runs in fp32, so the step is
/// large (1e-2) and |fd - analytic| <= atol + rtol |fd|; observed errors are
/// below 3e-5, so a wrong term of any size that matters fails.
void checkGradientOf(const plan::Kernel &forward, std::vector<Tensor> ins,
                     size_t wrt, const std::vector<Tensor> &outs, size_t which,
                     const std::vector<float> &r,
                     const std::vector<float> &analytic, double step = 1e-2,
                     double atol = 2e-4, double rtol = 1e-3) {
  REQUIRE(analytic.size() == ins[wrt].f.size());
  double worst = 0, worstFd = 0, worstAnalytic = 0;
  size_t worstAt = 0;
  bool ok = true;
  for (size_t e = 0; e < analytic.size(); ++e) {
    float orig = ins[wrt].f[e];
    float plus = orig + float(step), minus = orig - float(step);
    ins[wrt].f[e] = plus;
    double lossPlus = probeLoss(forward, ins, outs, which, r);
    ins[wrt].f[e] = minus;
    double lossMinus = probeLoss(forward, ins, outs, which, r);
    ins[wrt].f[e] = orig;
    double fd = (lossPlus - lossMinus) / (double(plus) - double(minus));
    double err = std::fabs(fd - analytic[e]);
    if (err > atol + rtol * std::fabs(fd))
      ok = false;
    if (err > worst) {
      worst = err;
      worstAt = e;
      worstFd = fd;
      worstAnalytic = analytic[e];
    }
  }
  INFO(forward.op() << " input " << wrt << " output " << which
                    << ": worst element " << worstAt << " finite difference "
                    << worstFd << " analytic " << worstAnalytic << " error "
                    << worst);
  CHECK(ok);
}

/// checkGradientOf for a forward kernel with the single output y[outShape].
void checkGradient(const plan::Kernel &forward, std::vector<Tensor> ins,
                   size_t wrt, const std::vector<int64_t> &outShape,
                   const std::vector<float> &r,
                   const std::vector<float> &analytic, double step = 1e-2,
                   double atol = 2e-4, double rtol = 1e-3) {
  checkGradientOf(forward, std::move(ins), wrt, {Tensor::f32(outShape)}, 0, r,
                  analytic, step, atol, rtol);
}

/// attention's outputs: y [rows, width] and lse [rows, 2 heads].
std::vector<Tensor> attentionOuts(int64_t rows, int64_t width, int64_t heads) {
  return {Tensor::f32({rows, width}), Tensor::f32({rows, 2 * heads})};
}

/// The gradients these tests compare must not be trivially zero.
void requireNonZero(const std::vector<float> &g) {
  double norm = 0;
  for (float v : g)
    norm += std::fabs(v);
  REQUIRE(norm > 1e-3);
}

} // namespace

// ---------------------------------------------------------------------------
// Registry and attributes.

TEST_CASE("kernelNames lists every kernel once", "[kernels]") {
  std::vector<std::string> names = kernelNames();
  std::set<std::string> unique(names.begin(), names.end());
  CHECK(unique.size() == names.size());
  const std::vector<std::string> spec = {"embedding",
                                         "position_add",
                                         "layer_norm",
                                         "rms_norm",
                                         "qk_norm",
                                         "linear",
                                         "gelu",
                                         "swiglu",
                                         "add",
                                         "bias_add",
                                         "sp_split",
                                         "columns",
                                         "tp_kv_assemble",
                                         "attention",
                                         "attention_block",
                                         "cp_ulysses_split",
                                         "cp_ulysses_merge",
                                         "cp_ulysses_natural",
                                         "cp_ulysses_zigzag",
                                         "cp_split",
                                         "moe_router",
                                         "moe_dispatch",
                                         "expert_linear",
                                         "moe_combine",
                                         "moe_aux_loss",
                                         "moe_ep_counts",
                                         "moe_ep_pack",
                                         "moe_ep_unpack",
                                         "moe_ep_gather",
                                         "moe_ep_scatter",
                                         "cross_entropy",
                                         "vocab_ce_stats",
                                         "vocab_cross_entropy",
                                         "loss_accumulate",
                                         "embedding_grad",
                                         "position_add_grad",
                                         "layer_norm_grad_input",
                                         "layer_norm_grad_weight",
                                         "rms_norm_grad_input",
                                         "rms_norm_grad_weight",
                                         "qk_norm_grad_input",
                                         "qk_norm_grad_weight",
                                         "linear_grad_input",
                                         "columns_grad",
                                         "cp_split_grad",
                                         "tp_kv_assemble_grad",
                                         "linear_grad_weight",
                                         "bias_grad",
                                         "gelu_grad",
                                         "swiglu_grad",
                                         "attention_grad",
                                         "attention_block_grad",
                                         "moe_router_grad",
                                         "moe_dispatch_grad",
                                         "expert_linear_grad_input",
                                         "expert_linear_grad_weight",
                                         "moe_combine_grad",
                                         "moe_aux_loss_grad",
                                         "cross_entropy_grad",
                                         "vocab_cross_entropy_grad",
                                         "accumulate",
                                         "zero",
                                         "adamw"};
  for (const std::string &want : spec)
    CHECK(unique.count(want) == 1);
  CHECK(names.size() == spec.size());
}

TEST_CASE("attrInt and attrFloat read attributes or defaults", "[kernels]") {
  K k("linear");
  k.i("transpose_w", 1).f("eps", 0.25).f("whole", 3.0).s("name", "x");
  CHECK(attrInt(k, "transpose_w", 0) == 1);
  CHECK(attrInt(k, "missing", 7) == 7);
  CHECK(attrInt(k, "whole", 0) == 3);
  CHECK(attrInt(k, "name", 5) == 5);
  CHECK(attrFloat(k, "eps", 1.0) == 0.25);
  CHECK(attrFloat(k, "transpose_w", 0.0) == 1.0);
  CHECK(attrFloat(k, "missing", 0.5) == 0.5);
  CHECK(attrFloat(k, "name", 0.5) == 0.5);
}

TEST_CASE("decodeKernelAttrs maps every attribute name to its id",
          "[kernels][attrs]") {
  const size_t count = static_cast<size_t>(KernelAttr::kCount);
  std::set<std::string> names;
  for (size_t n = 0; n < count; ++n) {
    const KernelAttr id = static_cast<KernelAttr>(n);
    names.insert(kernelAttrName(id));
    K k("linear");
    k.i(kernelAttrName(id), int64_t(n) + 10).f("not_an_attribute", 1.0);
    KernelAttrs attrs = decodeKernelAttrs(k);
    for (size_t m = 0; m < count; ++m) {
      const KernelAttrs::Value &v = attrs[static_cast<KernelAttr>(m)];
      INFO(kernelAttrName(id) << " / " << kernelAttrName(KernelAttr(m)));
      if (m == n) {
        CHECK(v.kind == KernelAttrs::Value::kInt);
        CHECK(v.i == int64_t(n) + 10);
      } else {
        CHECK(v.kind == KernelAttrs::Value::kAbsent);
      }
    }
  }
  CHECK(names.size() == count);
  const std::vector<std::pair<KernelAttr, std::string>> spelled = {
      {KernelAttr::kBeta1, "beta1"},
      {KernelAttr::kBeta2, "beta2"},
      {KernelAttr::kCapacity, "capacity"},
      {KernelAttr::kCp, "cp"},
      {KernelAttr::kEps, "eps"},
      {KernelAttr::kExperts, "experts"},
      {KernelAttr::kHeads, "heads"},
      {KernelAttr::kKvHeads, "kv_heads"},
      {KernelAttr::kLr, "lr"},
      {KernelAttr::kMembers, "members"},
      {KernelAttr::kNormTopk, "norm_topk"},
      {KernelAttr::kQuery, "query"},
      {KernelAttr::kRopeFactor, "rope_factor"},
      {KernelAttr::kRopeHighFreqFactor, "rope_high_freq_factor"},
      {KernelAttr::kRopeLowFreqFactor, "rope_low_freq_factor"},
      {KernelAttr::kRopeOriginalMaxPosition, "rope_original_max_position"},
      {KernelAttr::kRopeTheta, "rope_theta"},
      {KernelAttr::kScale, "scale"},
      {KernelAttr::kSeq, "seq"},
      {KernelAttr::kStart, "start"},
      {KernelAttr::kStep, "step"},
      {KernelAttr::kTopK, "top_k"},
      {KernelAttr::kTransposeW, "transpose_w"},
      {KernelAttr::kVocab, "vocab"},
      {KernelAttr::kWeightDecay, "weight_decay"},
  };
  CHECK(spelled.size() == count);
  for (const auto &[id, name] : spelled)
    CHECK(kernelAttrName(id) == name);
}

TEST_CASE("decoded attributes read back with the readers' defaults and errors",
          "[kernels][attrs]") {
  K k("linear");
  k.i("heads", 4)
      .f("eps", 0.25)
      .f("experts", 3.0)        // an integral double reads as an integer
      .f("top_k", 1.5)          // not integral
      .f("members", 0x1p62)     // integral, but too large
      .s("seq", "x")            // not a number
      .f("lr", INFINITY)        // not finite
      .f("beta1", NAN)          // not finite
      .i("capacity", 0)         // not positive
      .i("vocab", -2)           // not positive
      .i("transpose_w", 2)      // neither 0 nor 1
      .f("rope_theta", -1e300); // finite
  (*k.kernel.mutable_attrs())["weight_decay"]; // an AttrValue with no value
  const KernelAttrs attrs = decodeKernelAttrs(k);
  CHECK(attrs[KernelAttr::kHeads].kind == KernelAttrs::Value::kInt);
  CHECK(attrs[KernelAttr::kEps].kind == KernelAttrs::Value::kFloat);
  CHECK(attrs[KernelAttr::kSeq].kind == KernelAttrs::Value::kOther);
  CHECK(attrs[KernelAttr::kWeightDecay].kind == KernelAttrs::Value::kOther);
  CHECK(attrs[KernelAttr::kScale].kind == KernelAttrs::Value::kAbsent);

  std::vector<TensorRef> none;
  KernelContext ctx;
  const detail::KernelArgs a{k, attrs, none, none, ctx};
  auto message = [](const Status &s) {
    return s.isOk() ? std::string("ok") : s.message();
  };

  int64_t i = 0;
  REQUIRE(detail::readInt(a, KernelAttr::kHeads, std::nullopt, i));
  CHECK(i == 4);
  REQUIRE(detail::readInt(a, KernelAttr::kExperts, std::nullopt, i));
  CHECK(i == 3);
  REQUIRE(detail::readInt(a, KernelAttr::kScale, 7, i));
  CHECK(i == 7);
  CHECK(message(detail::readInt(a, KernelAttr::kScale, std::nullopt, i)) ==
        "linear: missing attribute 'scale'");
  CHECK(message(detail::readInt(a, KernelAttr::kTopK, 1, i)) ==
        "linear: attribute 'top_k' must be an integer");
  CHECK(message(detail::readInt(a, KernelAttr::kMembers, 1, i)) ==
        "linear: attribute 'members' must be an integer");
  CHECK(message(detail::readInt(a, KernelAttr::kSeq, 1, i)) ==
        "linear: attribute 'seq' must be an integer");
  CHECK(message(detail::readInt(a, KernelAttr::kLr, 1, i)) ==
        "linear: attribute 'lr' must be an integer");
  CHECK(message(detail::readInt(a, KernelAttr::kWeightDecay, 1, i)) ==
        "linear: attribute 'weight_decay' must be an integer");

  REQUIRE(detail::readPositiveInt(a, KernelAttr::kHeads, std::nullopt, i));
  CHECK(i == 4);
  REQUIRE(detail::readPositiveInt(a, KernelAttr::kScale, 2, i));
  CHECK(i == 2);
  CHECK(message(detail::readPositiveInt(a, KernelAttr::kCapacity, 1, i)) ==
        "linear: attribute 'capacity' must be positive, got 0");
  CHECK(message(detail::readPositiveInt(a, KernelAttr::kVocab, 1, i)) ==
        "linear: attribute 'vocab' must be positive, got -2");
  CHECK(message(detail::readPositiveInt(a, KernelAttr::kScale, 0, i)) ==
        "linear: attribute 'scale' must be positive, got 0");
  CHECK(message(
            detail::readPositiveInt(a, KernelAttr::kScale, std::nullopt, i)) ==
        "linear: missing attribute 'scale'");
  CHECK(message(detail::readPositiveInt(a, KernelAttr::kTopK, 1, i)) ==
        "linear: attribute 'top_k' must be an integer");

  double f = 0;
  REQUIRE(detail::readFloat(a, KernelAttr::kEps, std::nullopt, f));
  CHECK(f == 0.25);
  REQUIRE(detail::readFloat(a, KernelAttr::kHeads, std::nullopt, f));
  CHECK(f == 4.0);
  REQUIRE(detail::readFloat(a, KernelAttr::kRopeTheta, 0.0, f));
  CHECK(f == -1e300);
  REQUIRE(detail::readFloat(a, KernelAttr::kScale, 0.5, f));
  CHECK(f == 0.5);
  CHECK(message(detail::readFloat(a, KernelAttr::kScale, std::nullopt, f)) ==
        "linear: missing attribute 'scale'");
  CHECK(message(detail::readFloat(a, KernelAttr::kLr, 1.0, f)) ==
        "linear: attribute 'lr' must be finite");
  CHECK(message(detail::readFloat(a, KernelAttr::kBeta1, 1.0, f)) ==
        "linear: attribute 'beta1' must be finite");
  CHECK(message(detail::readFloat(a, KernelAttr::kSeq, 1.0, f)) ==
        "linear: attribute 'seq' must be a number");
  CHECK(message(detail::readFloat(a, KernelAttr::kWeightDecay, 1.0, f)) ==
        "linear: attribute 'weight_decay' must be a number");

  bool transposeW = true;
  CHECK(message(detail::readTransposeW(a, transposeW)) ==
        "linear: attribute 'transpose_w' must be 0 or 1, got 2");
  const KernelAttrs noAttrs = decodeKernelAttrs(K("linear"));
  const detail::KernelArgs plain{k, noAttrs, none, none, ctx};
  REQUIRE(detail::readTransposeW(plain, transposeW));
  CHECK_FALSE(transposeW);
  const KernelAttrs flagged =
      decodeKernelAttrs(K("linear").f("transpose_w", 1));
  const detail::KernelArgs withFlag{k, flagged, none, none, ctx};
  REQUIRE(detail::readTransposeW(withFlag, transposeW));
  CHECK(transposeW);
}

TEST_CASE("kernels read the decoded attributes, not the plan's map",
          "[kernels][attrs]") {
  K k("loss_accumulate");
  k.f("scale", 2.0);
  const KernelAttrs attrs = decodeKernelAttrs(k);
  k.f("scale", 5.0); // after decoding: not seen by the call
  const KernelInfo *info = findKernel("loss_accumulate");
  REQUIRE(info);
  float loss = 1.5f;
  std::vector<TensorRef> ins = {TensorRef{plan::F32, {}, &loss}}, outs;
  double total = 0;
  KernelContext ctx;
  ctx.lossAccumulator = &total;
  REQUIRE(runKernel(*info, k, attrs, ins, outs, ctx));
  CHECK(total == 3.0);
  // The convenience overload decodes the kernel it is given.
  REQUIRE(runKernel(k, ins, outs, ctx));
  CHECK(total == 3.0 + 7.5);
}

// ---------------------------------------------------------------------------
// Forward kernels on hand-computed cases.

TEST_CASE("embedding gathers table rows", "[kernels][forward]") {
  std::vector<Tensor> ins = {Tensor::i32({2, 2}, {2, 0, 2, 1}),
                             Tensor::f32({3, 2}, {1, 2, 3, 4, 5, 6})};
  std::vector<Tensor> outs = {Tensor::f32({4, 2})};
  mustRun(K("embedding"), ins, outs);
  CHECK(outs[0].f == std::vector<float>{5, 6, 1, 2, 5, 6, 3, 4});
}

TEST_CASE("position_add adds pos[n % seq]", "[kernels][forward]") {
  std::vector<Tensor> ins = {Tensor::f32({4, 2}, {0, 0, 1, 1, 2, 2, 3, 3}),
                             Tensor::f32({3, 2}, {10, 20, 30, 40, 50, 60})};
  std::vector<Tensor> outs = {Tensor::f32({4, 2})};
  mustRun(K("position_add").i("seq", 2), ins, outs);
  CHECK(outs[0].f == std::vector<float>{10, 20, 31, 41, 12, 22, 33, 43});
}

TEST_CASE("layer_norm normalizes rows, then scales and shifts",
          "[kernels][forward]") {
  Rng rng(1);
  Tensor x = randomF32(rng, {3, 8}, -2.0, 5.0);
  std::vector<Tensor> ins = {x, Tensor::f32({8}), Tensor::f32({8})};
  std::fill(ins[1].f.begin(), ins[1].f.end(), 1.0f);
  std::vector<Tensor> outs = {Tensor::f32({3, 8})};
  mustRun(K("layer_norm").f("eps", 0.0), ins, outs);
  for (int n = 0; n < 3; ++n) {
    double mean = 0, var = 0;
    for (int j = 0; j < 8; ++j)
      mean += outs[0].f[n * 8 + j];
    mean /= 8;
    for (int j = 0; j < 8; ++j)
      var += (outs[0].f[n * 8 + j] - mean) * (outs[0].f[n * 8 + j] - mean);
    var /= 8; // biased, like torch.nn.LayerNorm
    CHECK(mean == Approx(0.0).margin(1e-6));
    CHECK(var == Approx(1.0).epsilon(1e-5));
  }

  // Row [1, 3]: mean 2, biased variance 1, so xhat = [-1, 1].
  std::vector<Tensor> small = {Tensor::f32({1, 2}, {1, 3}),
                               Tensor::f32({2}, {2, 3}),
                               Tensor::f32({2}, {0.5, -1})};
  std::vector<Tensor> smallOut = {Tensor::f32({1, 2})};
  mustRun(K("layer_norm"), small, smallOut);
  double rstd = 1.0 / std::sqrt(1.0 + 1e-5); // default eps
  CHECK(smallOut[0].f[0] == Approx(-2 * rstd + 0.5));
  CHECK(smallOut[0].f[1] == Approx(3 * rstd - 1));
}

TEST_CASE("linear matches hand-computed products", "[kernels][forward]") {
  // x = [[1,2],[3,4]], w = [[1,0,2],[0,1,3]] ([K=2,M=3]), b = [1,1,1].
  Tensor x = Tensor::f32({2, 2}, {1, 2, 3, 4});
  Tensor w = Tensor::f32({2, 3}, {1, 0, 2, 0, 1, 3});
  Tensor b = Tensor::f32({3}, {1, 1, 1});
  std::vector<float> want = {1, 2, 8, 3, 4, 18};

  std::vector<Tensor> ins = {x, w};
  std::vector<Tensor> outs = {Tensor::f32({2, 3})};
  mustRun(K("linear"), ins, outs);
  CHECK(outs[0].f == want);

  ins.push_back(b);
  outs[0].f.assign(6, 123.0f); // must be overwritten, not accumulated into
  mustRun(K("linear"), ins, outs);
  CHECK(outs[0].f == std::vector<float>{2, 3, 9, 4, 5, 19});

  // The same product with w stored transposed ([M=3,K=2]).
  Tensor wt = Tensor::f32({3, 2}, {1, 0, 0, 1, 2, 3});
  std::vector<Tensor> tins = {x, wt};
  std::vector<Tensor> touts = {Tensor::f32({2, 3})};
  mustRun(K("linear").i("transpose_w", 1), tins, touts);
  CHECK(touts[0].f == want);
}

TEST_CASE("linear matches a naive product on odd sizes", "[kernels][forward]") {
  Rng rng(2);
  const int64_t n = 7, k = 13, m = 5;
  Tensor x = randomF32(rng, {n, k}), w = randomF32(rng, {k, m});
  Tensor b = randomF32(rng, {m});
  std::vector<Tensor> ins = {x, w, b};
  std::vector<Tensor> outs = {Tensor::f32({n, m})};
  mustRun(K("linear"), ins, outs);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < m; ++c) {
      double want = b.f[c];
      for (int64_t j = 0; j < k; ++j)
        want += double(x.f[r * k + j]) * w.f[j * m + c];
      CHECK(outs[0].f[r * m + c] == Approx(want).margin(1e-5));
    }
}

TEST_CASE("gelu uses the tanh approximation", "[kernels][forward]") {
  std::vector<Tensor> ins = {Tensor::f32({5}, {0, 1, -1, 2, -3})};
  std::vector<Tensor> outs = {Tensor::f32({5})};
  mustRun(K("gelu"), ins, outs);
  // torch.nn.functional.gelu(x, approximate='tanh').
  CHECK(outs[0].f[0] == 0.0f);
  CHECK(outs[0].f[1] == Approx(0.8411920).margin(1e-6));
  CHECK(outs[0].f[2] == Approx(-0.1588080).margin(1e-6));
  CHECK(outs[0].f[3] == Approx(1.9545977).margin(1e-6));
  CHECK(outs[0].f[4] == Approx(-0.0036374).margin(1e-6));
}

TEST_CASE("add sums elementwise", "[kernels][forward]") {
  std::vector<Tensor> ins = {Tensor::f32({2, 2}, {1, 2, 3, 4}),
                             Tensor::f32({2, 2}, {10, 20, 30, 40})};
  std::vector<Tensor> outs = {Tensor::f32({2, 2})};
  mustRun(K("add"), ins, outs);
  CHECK(outs[0].f == std::vector<float>{11, 22, 33, 44});
}

TEST_CASE("bias_add adds the bias to every row", "[kernels][forward]") {
  std::vector<Tensor> ins = {Tensor::f32({2, 3}, {1, 2, 3, 4, 5, 6}),
                             Tensor::f32({3}, {10, 20, 30})};
  std::vector<Tensor> outs = {Tensor::f32({2, 3})};
  mustRun(K("bias_add"), ins, outs);
  CHECK(outs[0].f == std::vector<float>{11, 22, 33, 14, 25, 36});
  // Its bias gradient is bias_grad (column sums of dy), checked against
  // finite differences of bias_add.
  Rng rng(31);
  std::vector<Tensor> fwdIns = {randomF32(rng, {4, 5}, -1.0, 1.0),
                                randomF32(rng, {5}, -1.0, 1.0)};
  Tensor dy = randomF32(rng, {4, 5}, -1.0, 1.0);
  std::vector<Tensor> db = {Tensor::f32({5})};
  std::vector<Tensor> dyIn = {dy};
  mustRun(K("bias_grad"), dyIn, db);
  requireNonZero(db[0].f);
  checkGradient(K("bias_add"), fwdIns, 1, {4, 5}, dy.f, db[0].f);
  // And its input gradient is dy itself.
  checkGradient(K("bias_add"), fwdIns, 0, {4, 5}, dy.f, dy.f);
}

TEST_CASE("sp_split keeps the context's member's rows", "[kernels][forward]") {
  // 4 rows of 2 over 2 members: member 1 keeps rows 2 and 3.
  std::vector<Tensor> ins = {Tensor::f32({4, 2}, {0, 1, 2, 3, 4, 5, 6, 7})};
  std::vector<Tensor> outs = {Tensor::f32({2, 2})};
  KernelContext ctx;
  ctx.tensorMember = 1;
  REQUIRE(run(K("sp_split").i("members", 2), ins, outs, ctx).isOk());
  CHECK(outs[0].f == std::vector<float>{4, 5, 6, 7});
  ctx.tensorMember = 0;
  REQUIRE(run(K("sp_split").i("members", 2), ins, outs, ctx).isOk());
  CHECK(outs[0].f == std::vector<float>{0, 1, 2, 3});
  // Errors: members that do not divide the rows, a member out of range.
  std::vector<Tensor> three = {Tensor::f32({3, 2})};
  CHECK(run(K("sp_split").i("members", 2), three, outs, ctx)
            .message()
            .find("must be at least 2 and divide the 3 rows") !=
        std::string::npos);
  ctx.tensorMember = 2;
  CHECK(run(K("sp_split").i("members", 2), ins, outs, ctx)
            .message()
            .find("tensor-parallel member 2 is not one of 2") !=
        std::string::npos);
}

TEST_CASE("columns and columns_grad copy consecutive columns",
          "[kernels][forward]") {
  std::vector<Tensor> ins = {Tensor::f32({2, 4}, {0, 1, 2, 3, 4, 5, 6, 7})};
  std::vector<Tensor> outs = {Tensor::f32({2, 2})};
  mustRun(K("columns").i("start", 1), ins, outs);
  CHECK(outs[0].f == std::vector<float>{1, 2, 5, 6});
  // The gradient puts them back among zeros (overwriting the output).
  std::vector<Tensor> wide = {Tensor::f32({2, 4}, std::vector<float>(8, 9))};
  mustRun(K("columns_grad").i("start", 1), outs, wide);
  CHECK(wide[0].f == std::vector<float>{0, 1, 2, 0, 0, 5, 6, 0});
  // Errors: columns past the end, rows that differ, no start.
  CHECK(run(K("columns").i("start", 3), ins, outs)
            .message()
            .find("columns [3, 5) are not columns of a matrix of 4") !=
        std::string::npos);
  std::vector<Tensor> threeRows = {Tensor::f32({3, 2})};
  CHECK(run(K("columns").i("start", 0), ins, threeRows)
            .message()
            .find("must have the same rows") != std::string::npos);
  CHECK(run(K("columns"), ins, outs).message().find("start") !=
        std::string::npos);
}

TEST_CASE("tp_kv_assemble gives each member its key/value head whole",
          "[kernels][forward]") {
  // T = 4 members, K = 2 key/value heads of hd = 2: members 0, 1 share head
  // 0, members 2, 3 head 1; each holds one column (p = 1) of its head's k
  // and of its v, after q = 2 query columns. Two rows (h = 2).
  const int64_t members = 4, rows = 2;
  // Gathered pieces [members * rows, 2]: member j's row i is
  // [k = 10 j + i, v = 100 + 10 j + i].
  std::vector<float> pieces;
  for (int64_t j = 0; j < members; ++j)
    for (int64_t i = 0; i < rows; ++i)
      pieces.insert(pieces.end(), {float(10 * j + i), float(100 + 10 * j + i)});
  for (int64_t m = 0; m < members; ++m) {
    KernelContext ctx;
    ctx.tensorMember = m;
    // The member's own weight: q columns [-1, -2] (row 0), [-3, -4] (row
    // 1), then its pieces.
    std::vector<Tensor> ins = {
        Tensor::f32({rows, 4},
                    {-1, -2, pieces[(m * rows) * 2], pieces[(m * rows) * 2 + 1],
                     -3, -4, pieces[(m * rows + 1) * 2],
                     pieces[(m * rows + 1) * 2 + 1]}),
        Tensor::f32({members * rows, 2}, pieces)};
    std::vector<Tensor> outs = {Tensor::f32({rows, 6})};
    K k("tp_kv_assemble");
    k.i("members", members).i("query", 2);
    REQUIRE(run(k, ins, outs, ctx).isOk());
    const float a = float(10 * (m / 2 * 2)), b = a + 10;
    CHECK(outs[0].f == std::vector<float>{-1, -2, a, b, 100 + a, 100 + b, -3,
                                          -4, a + 1, b + 1, 101 + a, 101 + b});
    // Its gradient is the adjoint on the pieces: <assemble(w, P), dy> =
    // <w's query columns, dy's> + <P, assemble_grad(dy)>, exact on integers.
    Rng rng(40 + m);
    std::vector<float> dy(rows * 6);
    for (float &x : dy)
      x = float(int(rng.uniform(-8, 8)));
    std::vector<Tensor> dyIn = {Tensor::f32({rows, 6}, dy)};
    std::vector<Tensor> dp = {
        Tensor::f32({members * rows, 2}, std::vector<float>(16, 7))};
    K g("tp_kv_assemble_grad");
    g.i("members", members).i("query", 2);
    REQUIRE(run(g, dyIn, dp, ctx).isOk());
    double lhs = 0, rhs = 0;
    for (size_t e = 0; e < dy.size(); ++e)
      lhs += double(outs[0].f[e]) * dy[e];
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < 2; ++j)
        rhs += double(ins[0].f[i * 4 + j]) * dy[i * 6 + j];
    for (size_t e = 0; e < pieces.size(); ++e)
      rhs += double(pieces[e]) * dp[0].f[e];
    CHECK(lhs == rhs);
    // Rows of members outside the head's group are zero.
    for (int64_t j = 0; j < members; ++j)
      if (j / 2 != m / 2)
        for (int64_t e = 0; e < rows * 2; ++e)
          CHECK(dp[0].f[j * rows * 2 + e] == 0);
  }
  // Errors: pieces of the wrong rows, an assembled width that is not a
  // multiple of the pieces, a member out of range.
  KernelContext ctx;
  K k("tp_kv_assemble");
  k.i("members", members).i("query", 2);
  std::vector<Tensor> w = {Tensor::f32({rows, 4}), Tensor::f32({6, 2})};
  std::vector<Tensor> y = {Tensor::f32({rows, 6})};
  CHECK(run(k, w, y, ctx).message().find("the pieces must be") !=
        std::string::npos);
  w[1] = Tensor::f32({members * rows, 2});
  std::vector<Tensor> odd = {Tensor::f32({rows, 5})};
  CHECK(run(k, w, odd, ctx)
            .message()
            .find("key/value columns must be r "
                  "times") != std::string::npos);
  ctx.tensorMember = 4;
  CHECK(run(k, w, y, ctx)
            .message()
            .find("tensor-parallel member 4 is not "
                  "one of 4") != std::string::npos);
}

TEST_CASE("attention on one and two tokens", "[kernels][forward]") {
  // One head, hd = 2. Rows are [q | k | v].
  SECTION("a single token attends only to itself") {
    std::vector<Tensor> ins = {Tensor::f32({1, 6}, {3, -1, 2, 5, 7, 8})};
    std::vector<Tensor> outs = attentionOuts(1, 2, 1);
    mustRun(K("attention").i("heads", 1).i("seq", 1), ins, outs);
    CHECK(outs[0].f == std::vector<float>{7, 8});
    // One score, q.k / sqrt(2) = 1 / sqrt(2): its log-sum-exp is itself.
    CHECK(detail::loadRingLse(outs[1].f.data(), 1, 0, 0) ==
          Approx(1 / std::sqrt(2.0)).margin(1e-6));
  }
  SECTION("the second token mixes both values by softmax of q.k/sqrt(hd)") {
    std::vector<Tensor> ins = {
        Tensor::f32({2, 6}, {9, 9, 1, 0, 1, 2, // token 0: q ignored by the mask
                             1, 2, 0, 1, 3, 4})}; // token 1
    std::vector<Tensor> outs = attentionOuts(2, 2, 1);
    mustRun(K("attention").i("heads", 1).i("seq", 2), ins, outs);
    // q1.k0 = 1, q1.k1 = 2, scaled by 1/sqrt(2).
    double s0 = 1 / std::sqrt(2.0), s1 = 2 / std::sqrt(2.0);
    double p0 = std::exp(s0) / (std::exp(s0) + std::exp(s1)), p1 = 1 - p0;
    CHECK(outs[0].f[0] == Approx(1));
    CHECK(outs[0].f[1] == Approx(2));
    CHECK(outs[0].f[2] == Approx(p0 * 1 + p1 * 3));
    CHECK(outs[0].f[3] == Approx(p0 * 2 + p1 * 4));
  }
  SECTION("sequences in a microbatch are independent") {
    // Two sequences of one token each: each output is its own value.
    std::vector<Tensor> ins = {
        Tensor::f32({2, 6}, {1, 1, 1, 1, 5, 6, 1, 1, 1, 1, -5, -6})};
    std::vector<Tensor> outs = attentionOuts(2, 2, 1);
    mustRun(K("attention").i("heads", 1).i("seq", 1), ins, outs);
    CHECK(outs[0].f == std::vector<float>{5, 6, -5, -6});
  }
}

TEST_CASE("attention matches a naive double-precision reference",
          "[kernels][forward]") {
  Rng rng(3);
  const int64_t batch = 2, seq = 5, heads = 3, hd = 4, hidden = heads * hd;
  const int64_t rows = batch * seq;
  Tensor qkv = randomF32(rng, {rows, 3 * hidden}, -2.0, 2.0);
  std::vector<Tensor> ins = {qkv};
  std::vector<Tensor> outs = attentionOuts(rows, hidden, heads);
  mustRun(K("attention").i("heads", heads).i("seq", seq), ins, outs);

  auto at = [&](int64_t row, int64_t part, int64_t h, int64_t c) {
    return double(qkv.f[row * 3 * hidden + part * hidden + h * hd + c]);
  };
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < seq; ++i) {
        std::vector<double> score(i + 1);
        double maxScore = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < hd; ++c)
            dot += at(b * seq + i, 0, h, c) * at(b * seq + j, 1, h, c);
          score[j] = dot / std::sqrt(double(hd));
          maxScore = std::max(maxScore, score[j]);
        }
        for (double &s : score)
          sum += (s = std::exp(s - maxScore));
        // lse: the log-sum-exp of the row's scaled scores.
        CHECK(detail::loadRingLse(outs[1].f.data(), heads, b * seq + i, h) ==
              Approx(maxScore + std::log(sum)).margin(1e-5));
        for (int64_t c = 0; c < hd; ++c) {
          double want = 0;
          for (int64_t j = 0; j <= i; ++j)
            want += score[j] / sum * at(b * seq + j, 2, h, c);
          CHECK(outs[0].f[(b * seq + i) * hidden + h * hd + c] ==
                Approx(want).margin(1e-5));
        }
      }
}

TEST_CASE("rms_norm divides by the root mean square, then scales",
          "[kernels][forward]") {
  // Row [3, 4]: mean(x^2) = 12.5. Row [1, 1]: mean(x^2) = 1.
  std::vector<Tensor> ins = {Tensor::f32({2, 2}, {3, 4, 1, 1}),
                             Tensor::f32({2}, {2, -1})};
  std::vector<Tensor> outs = {Tensor::f32({2, 2})};
  mustRun(K("rms_norm"), ins, outs);
  double r0 = 1.0 / std::sqrt(12.5 + 1e-6), r1 = 1.0 / std::sqrt(1.0 + 1e-6);
  CHECK(outs[0].f[0] == Approx(3 * r0 * 2));
  CHECK(outs[0].f[1] == Approx(4 * r0 * -1));
  CHECK(outs[0].f[2] == Approx(2 * r1));
  CHECK(outs[0].f[3] == Approx(-1 * r1));

  // The default eps is 1e-6, not layer_norm's 1e-5: on a row of tiny values
  // the two differ visibly. mean(x^2) = 1e-6, so y = x / sqrt(2e-6).
  std::vector<Tensor> tiny = {Tensor::f32({1, 2}, {1e-3f, -1e-3f}),
                              Tensor::f32({2}, {1, 1})};
  std::vector<Tensor> tinyOut = {Tensor::f32({1, 2})};
  mustRun(K("rms_norm"), tiny, tinyOut);
  CHECK(tinyOut[0].f[0] == Approx(1e-3 / std::sqrt(2e-6)));
  CHECK(tinyOut[0].f[1] == Approx(-1e-3 / std::sqrt(2e-6)));

  // With unit gamma and eps 0 every row has mean square 1, and the mean is
  // not subtracted.
  Rng rng(4);
  Tensor x = randomF32(rng, {3, 8}, 1.0, 5.0); // all positive
  std::vector<Tensor> rins = {x, Tensor::f32({8})};
  std::fill(rins[1].f.begin(), rins[1].f.end(), 1.0f);
  std::vector<Tensor> routs = {Tensor::f32({3, 8})};
  mustRun(K("rms_norm").f("eps", 0.0), rins, routs);
  for (int n = 0; n < 3; ++n) {
    double sq = 0;
    for (int j = 0; j < 8; ++j) {
      sq += double(routs[0].f[n * 8 + j]) * routs[0].f[n * 8 + j];
      CHECK(routs[0].f[n * 8 + j] > 0.0f);
    }
    CHECK(sq / 8 == Approx(1.0).epsilon(1e-6));
  }
}

TEST_CASE("swiglu multiplies silu(gate) by up", "[kernels][forward]") {
  // F = 3; rows are [gate(3) | up(3)].
  std::vector<Tensor> ins = {Tensor::f32({2, 6}, {0, 1, -2, 5, 2, 3, //
                                                  4, -30, 30, 1, 1, -0.5f})};
  std::vector<Tensor> outs = {Tensor::f32({2, 3})};
  mustRun(K("swiglu"), ins, outs);
  auto silu = [](double g) { return g / (1.0 + std::exp(-g)); };
  CHECK(outs[0].f[0] == 0.0f);
  CHECK(outs[0].f[1] == Approx(0.7310586 * 2).margin(1e-6));  // silu(1) * 2
  CHECK(outs[0].f[2] == Approx(-0.2384058 * 3).margin(1e-6)); // silu(-2) * 3
  CHECK(outs[0].f[3] == Approx(silu(4)));
  CHECK(outs[0].f[4] == Approx(silu(-30)).margin(1e-10)); // ~ -2.8e-12
  CHECK(outs[0].f[5] == Approx(-15.0));                   // silu(30) ~ 30
}

namespace {

/// Causal GQA attention with rotary embeddings, computed directly in double
/// from the spec: qkv rows are [q(heads*hd) | k(kv*hd) | v(kv*hd)].
std::vector<double> referenceAttention(const std::vector<float> &qkv,
                                       int64_t batch, int64_t seq,
                                       int64_t heads, int64_t kv, int64_t hd,
                                       double theta) {
  const int64_t cols = (heads + 2 * kv) * hd, width = heads * hd;
  auto vec = [&](int64_t row, int64_t offset, bool rotate) {
    std::vector<double> x(hd);
    for (int64_t c = 0; c < hd; ++c)
      x[c] = qkv[row * cols + offset + c];
    if (!rotate || theta == 0)
      return x;
    std::vector<double> r(hd);
    double pos = double(row % seq);
    for (int64_t i = 0; i < hd / 2; ++i) {
      double angle = pos * std::pow(theta, -2.0 * i / hd);
      r[i] = x[i] * std::cos(angle) - x[i + hd / 2] * std::sin(angle);
      r[i + hd / 2] = x[i + hd / 2] * std::cos(angle) + x[i] * std::sin(angle);
    }
    return r;
  };
  std::vector<double> y(batch * seq * width);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      int64_t g = h / (heads / kv);
      for (int64_t i = 0; i < seq; ++i) {
        std::vector<double> q = vec(b * seq + i, h * hd, true);
        std::vector<double> score(i + 1);
        double maxScore = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          std::vector<double> k = vec(b * seq + j, (heads + g) * hd, true);
          double dot = 0;
          for (int64_t c = 0; c < hd; ++c)
            dot += q[c] * k[c];
          score[j] = dot / std::sqrt(double(hd));
          maxScore = std::max(maxScore, score[j]);
        }
        for (double &s : score)
          sum += (s = std::exp(s - maxScore));
        for (int64_t j = 0; j <= i; ++j) {
          std::vector<double> v =
              vec(b * seq + j, (heads + kv + g) * hd, false);
          for (int64_t c = 0; c < hd; ++c)
            y[(b * seq + i) * width + h * hd + c] += score[j] / sum * v[c];
        }
      }
    }
  return y;
}

} // namespace

TEST_CASE("attention with rotary embeddings rotates q and k by position",
          "[kernels][forward]") {
  // One head, hd = 2, theta irrelevant for i = 0: freq_0 = 1, so the token
  // at position 1 is rotated by 1 radian. q1 = k0 = k1 = [1, 0]; after the
  // rotation q1.k0 = cos(1) and q1.k1 = 1 (relative position 0).
  std::vector<Tensor> ins = {Tensor::f32({2, 6}, {9, 9, 1, 0, 1, 2, //
                                                  1, 0, 1, 0, 3, 4})};
  std::vector<Tensor> outs = attentionOuts(2, 2, 1);
  mustRun(K("attention").i("heads", 1).i("seq", 2).f("rope_theta", 10000.0),
          ins, outs);
  double s0 = std::cos(1.0) / std::sqrt(2.0), s1 = 1 / std::sqrt(2.0);
  double p0 = std::exp(s0) / (std::exp(s0) + std::exp(s1)), p1 = 1 - p0;
  CHECK(outs[0].f[0] == Approx(1)); // v is never rotated
  CHECK(outs[0].f[1] == Approx(2));
  CHECK(outs[0].f[2] == Approx(p0 * 1 + p1 * 3));
  CHECK(outs[0].f[3] == Approx(p0 * 2 + p1 * 4));
}

TEST_CASE("grouped-query attention with rotary embeddings matches a "
          "double-precision reference",
          "[kernels][forward]") {
  struct Config {
    int64_t heads, kv, hd;
    double theta;
  };
  const Config config = GENERATE(
      Config{4, 2, 4, 10000.0}, Config{6, 2, 6, 500000.0},
      Config{4, 1, 2, 10.0}, Config{3, 3, 4, 0.0}, Config{4, 2, 3, 0.0});
  INFO("heads=" << config.heads << " kv_heads=" << config.kv
                << " hd=" << config.hd << " rope_theta=" << config.theta);
  Rng rng(5);
  const int64_t batch = 2, seq = 7, rows = batch * seq;
  const int64_t cols = (config.heads + 2 * config.kv) * config.hd;
  const int64_t width = config.heads * config.hd;
  Tensor qkv = randomF32(rng, {rows, cols}, -2.0, 2.0);
  std::vector<Tensor> ins = {qkv};
  std::vector<Tensor> outs = attentionOuts(rows, width, config.heads);
  mustRun(K("attention")
              .i("heads", config.heads)
              .i("kv_heads", config.kv)
              .i("seq", seq)
              .f("rope_theta", config.theta),
          ins, outs);
  std::vector<double> want = referenceAttention(
      qkv.f, batch, seq, config.heads, config.kv, config.hd, config.theta);
  for (int64_t e = 0; e < rows * width; ++e) {
    INFO("element " << e);
    CHECK(outs[0].f[e] == Approx(want[e]).margin(2e-5));
  }
}

TEST_CASE("grouped-query attention equals attention with repeated k and v",
          "[kernels][forward]") {
  // heads 4 over kv_heads 2 is MHA whose k and v heads are [k0 k0 k1 k1].
  Rng rng(6);
  const int64_t seq = 4, rows = 2 * seq, hd = 2, heads = 4, kv = 2;
  const int64_t cols = (heads + 2 * kv) * hd, mhaCols = 3 * heads * hd;
  Tensor qkv = randomF32(rng, {rows, cols}, -2.0, 2.0);
  Tensor mha = Tensor::f32({rows, mhaCols});
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t c = 0; c < heads * hd; ++c)
      mha.f[n * mhaCols + c] = qkv.f[n * cols + c];
    for (int64_t part = 1; part <= 2; ++part)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t c = 0; c < hd; ++c)
          mha.f[n * mhaCols + part * heads * hd + h * hd + c] =
              qkv.f[n * cols + heads * hd + (part - 1) * kv * hd +
                    (h / 2) * hd + c];
  }
  for (double theta : {0.0, 10000.0}) {
    std::vector<Tensor> gqaIns = {qkv}, mhaIns = {mha};
    std::vector<Tensor> gqaOut = attentionOuts(rows, heads * hd, heads);
    std::vector<Tensor> mhaOut = attentionOuts(rows, heads * hd, heads);
    mustRun(K("attention")
                .i("heads", heads)
                .i("kv_heads", kv)
                .i("seq", seq)
                .f("rope_theta", theta),
            gqaIns, gqaOut);
    mustRun(
        K("attention").i("heads", heads).i("seq", seq).f("rope_theta", theta),
        mhaIns, mhaOut);
    for (int64_t e = 0; e < rows * heads * hd; ++e)
      CHECK(gqaOut[0].f[e] == Approx(mhaOut[0].f[e]).margin(1e-6));
  }
}

TEST_CASE("explicit default kv_heads and rope_theta change nothing",
          "[kernels][forward]") {
  Rng rng(7);
  Tensor qkv = randomF32(rng, {6, 18}, -2.0, 2.0);
  std::vector<Tensor> ins = {qkv};
  std::vector<Tensor> plain = attentionOuts(6, 6, 2);
  std::vector<Tensor> explicitOut = attentionOuts(6, 6, 2);
  mustRun(K("attention").i("heads", 2).i("seq", 3), ins, plain);
  mustRun(K("attention")
              .i("heads", 2)
              .i("kv_heads", 2)
              .i("seq", 3)
              .f("rope_theta", 0.0),
          ins, explicitOut);
  CHECK(plain[0].f == explicitOut[0].f);
}

TEST_CASE("cross_entropy of uniform logits is ln V", "[kernels][forward]") {
  const int64_t vocab = 7;
  std::vector<Tensor> ins = {Tensor::f32({3, vocab}),
                             Tensor::i32({1, 3}, {0, 6, 3})};
  std::fill(ins[0].f.begin(), ins[0].f.end(), 2.5f);
  std::vector<Tensor> outs = {Tensor::f32({})};
  mustRun(K("cross_entropy"), ins, outs);
  CHECK(outs[0].f[0] == Approx(std::log(7.0)));
}

TEST_CASE("cross_entropy is stable for large logits and averages rows",
          "[kernels][forward]") {
  // Row 0: the target is far ahead, loss ~ 0. Row 1: far behind, loss ~ 1000.
  std::vector<Tensor> ins = {Tensor::f32({2, 2}, {1000, 0, 1000, 0}),
                             Tensor::i32({2, 1}, {0, 1})};
  std::vector<Tensor> outs = {Tensor::f32({1})};
  mustRun(K("cross_entropy"), ins, outs);
  CHECK(std::isfinite(outs[0].f[0]));
  CHECK(outs[0].f[0] == Approx(500.0));

  std::vector<Tensor> gradOuts = {Tensor::f32({2, 2})};
  mustRun(K("cross_entropy_grad"), ins, gradOuts);
  CHECK(gradOuts[0].f[0] == Approx(0.0).margin(1e-12));
  CHECK(gradOuts[0].f[2] == Approx(0.5));
  CHECK(gradOuts[0].f[3] == Approx(-0.5));
}

TEST_CASE("loss_accumulate adds scale * loss to the context",
          "[kernels][forward]") {
  double total = 1.0;
  KernelContext ctx;
  ctx.lossAccumulator = &total;
  std::vector<Tensor> ins = {Tensor::f32({}, {2.0f})};
  std::vector<Tensor> outs;
  REQUIRE(run(K("loss_accumulate").f("scale", 0.25), ins, outs, ctx).isOk());
  REQUIRE(run(K("loss_accumulate").f("scale", 0.25), ins, outs, ctx).isOk());
  CHECK(total == 2.0);
}

// ---------------------------------------------------------------------------
// Finite-difference checks of every backward kernel.

TEST_CASE("embedding_grad is the gradient of embedding", "[kernels][grad]") {
  Rng rng(10);
  const int64_t vocab = 6, hidden = 4;
  Tensor ids = Tensor::i32({2, 3}, {1, 4, 1, 0, 4, 1}); // 1 and 4 repeat
  Tensor table = randomF32(rng, {vocab, hidden});
  std::vector<float> r = rng.vec(6 * hidden);

  std::vector<Tensor> ins = {ids, Tensor::f32({6, hidden}, r)};
  std::vector<Tensor> outs = {Tensor::f32({vocab, hidden})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f); // must be zeroed
  mustRun(K("embedding_grad").i("vocab", vocab), ins, outs);
  requireNonZero(outs[0].f);
  for (int64_t j = 0; j < hidden; ++j) {
    CHECK(outs[0].f[2 * hidden + j] == 0.0f); // ids never seen
    CHECK(outs[0].f[5 * hidden + j] == 0.0f);
  }
  checkGradient(K("embedding"), {ids, table}, 1, {6, hidden}, r, outs[0].f);
}

TEST_CASE("position_add gradients", "[kernels][grad]") {
  Rng rng(11);
  const int64_t seq = 3, positions = 5, hidden = 4, rows = 2 * seq;
  Tensor x = randomF32(rng, {rows, hidden});
  Tensor pos = randomF32(rng, {positions, hidden});
  std::vector<float> r = rng.vec(rows * hidden);
  K forward = K("position_add").i("seq", seq);

  // dx is dy itself: the runtime passes it through without a kernel.
  checkGradient(forward, {x, pos}, 0, {rows, hidden}, r, r);

  std::vector<Tensor> ins = {Tensor::f32({rows, hidden}, r)};
  std::vector<Tensor> outs = {Tensor::f32({positions, hidden})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f);
  mustRun(K("position_add_grad").i("seq", seq), ins, outs);
  requireNonZero(outs[0].f);
  for (int64_t j = seq * hidden; j < positions * hidden; ++j)
    CHECK(outs[0].f[j] == 0.0f); // positions past seq
  checkGradient(forward, {x, pos}, 1, {rows, hidden}, r, outs[0].f);
}

TEST_CASE("position_add under context parallelism adds global positions",
          "[kernels][forward][grad]") {
  // Members m of cp hold chunks m and 2 cp - 1 - m of each sequence: each
  // member's rows equal the whole sequence's at those positions, and the
  // members' position gradients sum to the whole one.
  const int64_t cp = GENERATE(2, 4);
  Rng rng(23);
  const int64_t seq = 4 * cp, batch = 2, hidden = 3, positions = seq + 2;
  const int64_t local = seq / cp, chunk = seq / (2 * cp);
  Tensor x = randomF32(rng, {batch * seq, hidden});
  Tensor pos = randomF32(rng, {positions, hidden});
  Tensor dy = randomF32(rng, {batch * seq, hidden});
  std::vector<Tensor> ins = {x, pos};
  std::vector<Tensor> whole = {Tensor::f32({batch * seq, hidden})};
  mustRun(K("position_add").i("seq", seq), ins, whole);
  std::vector<Tensor> dyIn = {dy};
  std::vector<Tensor> wholeGrad = {Tensor::f32({positions, hidden})};
  mustRun(K("position_add_grad").i("seq", seq), dyIn, wholeGrad);
  std::vector<double> sum(positions * hidden, 0.0);
  for (int64_t m = 0; m < cp; ++m) {
    auto row = [&](int64_t r) {
      int64_t b = r / local, t = r % local;
      return b * seq +
             (t < chunk ? m * chunk + t : (2 * cp - 1 - m) * chunk + t - chunk);
    };
    Tensor xm = Tensor::f32({batch * local, hidden});
    Tensor dym = Tensor::f32({batch * local, hidden});
    for (int64_t r = 0; r < batch * local; ++r)
      for (int64_t j = 0; j < hidden; ++j) {
        xm.f[r * hidden + j] = x.f[row(r) * hidden + j];
        dym.f[r * hidden + j] = dy.f[row(r) * hidden + j];
      }
    KernelContext ctx;
    ctx.contextMember = m;
    std::vector<Tensor> in = {xm, pos};
    std::vector<Tensor> out = {Tensor::f32({batch * local, hidden})};
    REQUIRE(
        run(K("position_add").i("seq", seq).i("cp", cp), in, out, ctx).isOk());
    for (int64_t r = 0; r < batch * local; ++r)
      for (int64_t j = 0; j < hidden; ++j)
        CHECK(out[0].f[r * hidden + j] == whole[0].f[row(r) * hidden + j]);
    std::vector<Tensor> gin = {dym};
    std::vector<Tensor> gout = {Tensor::f32({positions, hidden})};
    std::fill(gout[0].f.begin(), gout[0].f.end(), 9.0f);
    REQUIRE(
        run(K("position_add_grad").i("seq", seq).i("cp", cp), gin, gout, ctx)
            .isOk());
    for (int64_t i = 0; i < positions * hidden; ++i)
      sum[i] += gout[0].f[i];
  }
  // Each position is one member's: its sum is that member's, exactly.
  for (int64_t i = 0; i < positions * hidden; ++i)
    CHECK(float(sum[i]) == wholeGrad[0].f[i]);
  KernelContext outside;
  outside.contextMember = cp;
  std::vector<Tensor> in = {Tensor::f32({local, hidden}), pos};
  std::vector<Tensor> out = {Tensor::f32({local, hidden})};
  Status s = run(K("position_add").i("seq", seq).i("cp", cp), in, out, outside);
  CHECK(s.message().find("the context member " + std::to_string(cp) +
                         " is not one of " + std::to_string(cp)) !=
        std::string::npos);
  mustFail(K("position_add").i("seq", 6).i("cp", 2),
           {Tensor::f32({3, hidden}), Tensor::f32({6, hidden})},
           {Tensor::f32({3, hidden})});
}

TEST_CASE("linear gradients", "[kernels][grad]") {
  const int64_t transposeW = GENERATE(0, 1);
  const bool withBias = GENERATE(false, true);
  INFO("transpose_w=" << transposeW << " bias=" << withBias);
  Rng rng(13 + transposeW);
  const int64_t rows = 5, in = 4, out = 3;
  std::vector<int64_t> wShape = transposeW ? std::vector<int64_t>{out, in}
                                           : std::vector<int64_t>{in, out};
  Tensor x = randomF32(rng, {rows, in});
  Tensor w = randomF32(rng, wShape);
  std::vector<Tensor> fwdIns = {x, w};
  if (withBias)
    fwdIns.push_back(randomF32(rng, {out}));
  std::vector<float> r = rng.vec(rows * out);
  K forward = K("linear").i("transpose_w", transposeW);
  Tensor dy = Tensor::f32({rows, out}, r);

  std::vector<Tensor> ins = {dy, w};
  std::vector<Tensor> outs = {Tensor::f32({rows, in})};
  mustRun(K("linear_grad_input").i("transpose_w", transposeW), ins, outs);
  requireNonZero(outs[0].f);
  checkGradient(forward, fwdIns, 0, {rows, out}, r, outs[0].f);

  ins = {x, dy};
  outs = {Tensor::f32(wShape)};
  mustRun(K("linear_grad_weight").i("transpose_w", transposeW), ins, outs);
  requireNonZero(outs[0].f);
  checkGradient(forward, fwdIns, 1, {rows, out}, r, outs[0].f);

  if (withBias) {
    ins = {dy};
    outs = {Tensor::f32({out})};
    mustRun(K("bias_grad"), ins, outs);
    requireNonZero(outs[0].f);
    checkGradient(forward, fwdIns, 2, {rows, out}, r, outs[0].f);
  }
}

TEST_CASE("gelu_grad is the gradient of gelu", "[kernels][grad]") {
  Rng rng(14);
  Tensor x = randomF32(rng, {3, 7}, -3.0, 3.0);
  std::vector<float> r = rng.vec(21);
  std::vector<Tensor> ins = {x, Tensor::f32({3, 7}, r)};
  std::vector<Tensor> outs = {Tensor::f32({3, 7})};
  mustRun(K("gelu_grad"), ins, outs);
  requireNonZero(outs[0].f);
  checkGradient(K("gelu"), {x}, 0, {3, 7}, r, outs[0].f);
}

TEST_CASE("add passes the gradient to both inputs", "[kernels][grad]") {
  // add has no backward kernel: both inputs receive dy unchanged.
  Rng rng(15);
  Tensor a = randomF32(rng, {2, 3}), b = randomF32(rng, {2, 3});
  std::vector<float> r = rng.vec(6);
  checkGradient(K("add"), {a, b}, 0, {2, 3}, r, r);
  checkGradient(K("add"), {a, b}, 1, {2, 3}, r, r);
}

TEST_CASE("attention_grad is the gradient of attention", "[kernels][grad]") {
  Rng rng(16);
  const int64_t batch = 2, seq = 3, heads = 2, hd = 3, hidden = heads * hd;
  const int64_t rows = batch * seq;
  Tensor qkv = randomF32(rng, {rows, 3 * hidden}, -1.5, 1.5);
  std::vector<float> r = rng.vec(rows * hidden);
  K forward = K("attention").i("heads", heads).i("seq", seq);
  std::vector<Tensor> fwdIns = {qkv}, fwd = attentionOuts(rows, hidden, heads);
  mustRun(forward, fwdIns, fwd);

  // From the forward's q|k|v, y and lse.
  std::vector<Tensor> ins = {qkv, fwd[0], fwd[1],
                             Tensor::f32({rows, hidden}, r)};
  std::vector<Tensor> outs = {Tensor::f32({rows, 3 * hidden})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f); // must be overwritten
  K backward = K("attention_grad").i("heads", heads).i("seq", seq);
  mustRun(backward, ins, outs);
  requireNonZero(outs[0].f);
  checkGradientOf(forward, {qkv}, 0, attentionOuts(rows, hidden, heads), 0, r,
                  outs[0].f);

  // y and lse must have the forward's shapes; attention writes both.
  CHECK(mustFail(backward,
                 {qkv, Tensor::f32({rows, hidden + 1}), fwd[1],
                  Tensor::f32({rows, hidden}, r)},
                 outs)
            .find("y has shape") != std::string::npos);
  CHECK(mustFail(backward,
                 {qkv, fwd[0], Tensor::f32({rows, heads}),
                  Tensor::f32({rows, hidden}, r)},
                 outs)
            .find("lse has shape") != std::string::npos);
  CHECK(mustFail(backward, {qkv, Tensor::f32({rows, hidden}, r)}, outs)
            .find("expected 4 inputs, got 2") != std::string::npos);
  CHECK(mustFail(forward, {qkv}, {Tensor::f32({rows, hidden})})
            .find("expected 2 outputs, got 1") != std::string::npos);
}

TEST_CASE("attention_grad with grouped-query heads and rotary embeddings",
          "[kernels][grad]") {
  struct Config {
    int64_t heads, kv, hd;
    double theta;
  };
  // Llama-style GQA with rope; MQA without rope; the old default (kv_heads
  // and rope_theta absent) with an odd head dim.
  const Config config = GENERATE(Config{4, 2, 4, 10000.0}, Config{2, 1, 3, 0.0},
                                 Config{2, 2, 3, -1.0}, Config{4, 1, 2, 10.0});
  INFO("heads=" << config.heads << " kv_heads=" << config.kv
                << " hd=" << config.hd << " rope_theta=" << config.theta);
  Rng rng(18);
  const int64_t batch = 2, seq = 3, rows = batch * seq;
  const int64_t cols = (config.heads + 2 * config.kv) * config.hd;
  const int64_t width = config.heads * config.hd;
  Tensor qkv = randomF32(rng, {rows, cols}, -1.5, 1.5);
  std::vector<float> r = rng.vec(rows * width);
  K forward = K("attention").i("heads", config.heads).i("seq", seq);
  K backward = K("attention_grad").i("heads", config.heads).i("seq", seq);
  if (config.theta >= 0) { // -1: leave both attributes out
    forward.i("kv_heads", config.kv).f("rope_theta", config.theta);
    backward.i("kv_heads", config.kv).f("rope_theta", config.theta);
  }

  std::vector<Tensor> fwdIns = {qkv},
                      fwd = attentionOuts(rows, width, config.heads);
  mustRun(forward, fwdIns, fwd);
  std::vector<Tensor> ins = {qkv, fwd[0], fwd[1],
                             Tensor::f32({rows, width}, r)};
  std::vector<Tensor> outs = {Tensor::f32({rows, cols})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f); // must be overwritten
  mustRun(backward, ins, outs);
  requireNonZero(outs[0].f);
  checkGradientOf(forward, {qkv}, 0, attentionOuts(rows, width, config.heads),
                  0, r, outs[0].f);
}

// Ring attention (context parallelism): the members' steps, emulated in
// one process, give the whole-sequence attention and its gradient on each
// member's rows.
TEST_CASE("ring attention steps equal attention and attention_grad over "
          "the whole sequence",
          "[kernels][grad]") {
  struct Config {
    int64_t cp, heads, kv, hd;
    double theta;
  };
  const Config config =
      GENERATE(Config{2, 4, 2, 4, 10000.0}, Config{4, 2, 1, 2, 0.0},
               Config{2, 2, 2, 3, 0.0}, Config{4, 4, 4, 2, 10.0},
               Config{1, 2, 1, 4, 10000.0});
  const int64_t n = config.cp;
  INFO("cp=" << n << " heads=" << config.heads << " kv_heads=" << config.kv
             << " hd=" << config.hd << " rope_theta=" << config.theta);
  Rng rng(31);
  const int64_t batch = 2, seq = 4 * n, local = seq / n, rows = batch * seq;
  const int64_t qCols = config.heads * config.hd,
                kvCols = config.kv * config.hd;
  const int64_t cols = qCols + 2 * kvCols;
  auto attrs = [&](K k) {
    return k.i("heads", config.heads)
        .i("kv_heads", config.kv)
        .i("seq", seq)
        .f("rope_theta", config.theta);
  };
  Tensor qkv = randomF32(rng, {rows, cols}, -1.5, 1.5);
  Tensor dy = randomF32(rng, {rows, qCols});
  std::vector<Tensor> ins = {qkv},
                      want = attentionOuts(rows, qCols, config.heads);
  mustRun(attrs(K("attention")), ins, want);
  std::vector<Tensor> gradIns = {qkv, want[0], want[1], dy},
                      wantGrad = {Tensor::f32({rows, cols})};
  mustRun(attrs(K("attention_grad")), gradIns, wantGrad);

  // Member m's rows: chunks m and 2n-1-m of each sequence (written out
  // here, not through plan::contextPosition).
  auto globalRow = [&](int64_t m, int64_t r) {
    int64_t b = r / local, t = r % local, c = seq / (2 * n);
    int64_t pos = t < c ? m * c + t : (2 * n - 1 - m) * c + (t - c);
    return b * seq + pos;
  };
  auto gather = [&](const Tensor &whole, int64_t m, int64_t first,
                    int64_t width) {
    int64_t wholeCols = whole.shape[1];
    Tensor part = Tensor::f32({batch * local, width});
    for (int64_t r = 0; r < batch * local; ++r)
      for (int64_t c = 0; c < width; ++c)
        part.f[r * width + c] =
            whole.f[globalRow(m, r) * wholeCols + first + c];
    return part;
  };
  std::vector<Tensor> q(n), kv(n), y(n), lse(n), dq(n), dkv(n);
  for (int64_t m = 0; m < n; ++m) {
    q[m] = gather(qkv, m, 0, cols);
    kv[m] = gather(qkv, m, qCols, 2 * kvCols);
  }
  const int64_t l = batch * local;
  // Forward: at step s member m holds owner (m - s) mod n's shard.
  for (int64_t s = 0; s < n; ++s)
    for (int64_t m = 0; m < n; ++m) {
      KernelContext ctx;
      ctx.contextMember = m;
      std::vector<Tensor> in = {q[m], kv[(m - s + n) % n]};
      if (s > 0) {
        in.push_back(y[m]);
        in.push_back(lse[m]);
      }
      std::vector<Tensor> out = {
          Tensor::f32({l, qCols}, std::vector<float>(l * qCols, 9.0f)),
          Tensor::f32({l, 2 * config.heads})};
      Status st = run(attrs(K("attention_block")).i("cp", n).i("step", s), in,
                      out, ctx);
      REQUIRE(st);
      y[m] = out[0];
      lse[m] = out[1];
    }
  // Backward: at step s member m holds owner (m + s) mod n's shard and the
  // partial sum of its key/value gradient.
  for (int64_t s = 0; s < n; ++s)
    for (int64_t m = 0; m < n; ++m) {
      int64_t owner = (m + s) % n;
      KernelContext ctx;
      ctx.contextMember = m;
      std::vector<Tensor> in = {q[m], kv[owner], y[m], lse[m],
                                gather(dy, m, 0, qCols)};
      if (s > 0) {
        in.push_back(dq[m]);
        in.push_back(dkv[owner]);
      }
      std::vector<Tensor> out = {
          Tensor::f32({l, qCols}, std::vector<float>(l * qCols, 9.0f)),
          Tensor::f32({l, 2 * kvCols},
                      std::vector<float>(l * 2 * kvCols, 9.0f))};
      Status st = run(attrs(K("attention_block_grad")).i("cp", n).i("step", s),
                      in, out, ctx);
      REQUIRE(st);
      dq[m] = out[0];
      dkv[owner] = out[1];
    }
  // fp32 sums of at most seq terms of inputs below 1.5 in magnitude,
  // in another order than the whole-sequence kernels: the bound of the
  // attention tests against their double reference.
  for (int64_t m = 0; m < n; ++m) {
    Tensor wantY = gather(want[0], m, 0, qCols);
    Tensor wantDq = gather(wantGrad[0], m, 0, qCols);
    Tensor wantDkv = gather(wantGrad[0], m, qCols, 2 * kvCols);
    for (size_t e = 0; e < wantY.f.size(); ++e)
      CHECK(y[m].f[e] == Approx(wantY.f[e]).margin(2e-5));
    for (size_t e = 0; e < wantDq.f.size(); ++e)
      CHECK(dq[m].f[e] == Approx(wantDq.f[e]).margin(2e-5));
    for (size_t e = 0; e < wantDkv.f.size(); ++e)
      CHECK(dkv[m].f[e] == Approx(wantDkv.f[e]).margin(2e-5));
  }
}

TEST_CASE("Ulysses' layouts around emulated all-to-alls give attention "
          "over the whole sequence of each member's heads",
          "[kernels]") {
  struct Config {
    int64_t cp, heads, kv, hd;
  };
  const Config config = GENERATE(Config{2, 4, 2, 4}, Config{4, 8, 4, 2},
                                 Config{2, 2, 2, 6}, Config{4, 4, 4, 2});
  const int64_t n = config.cp;
  INFO("cp=" << n << " heads=" << config.heads << " kv_heads=" << config.kv
             << " hd=" << config.hd);
  Rng rng(37);
  const int64_t batch = 2, seq = 4 * n, local = seq / n, rows = batch * seq;
  const int64_t l = batch * local;
  const int64_t qCols = config.heads * config.hd,
                kvCols = config.kv * config.hd;
  const int64_t cols = qCols + 2 * kvCols;
  Tensor qkv = randomF32(rng, {rows, cols}, -1.5, 1.5);
  std::vector<Tensor> ins = {qkv},
                      want = attentionOuts(rows, qCols, config.heads);
  mustRun(K("attention")
              .i("heads", config.heads)
              .i("kv_heads", config.kv)
              .i("seq", seq)
              .f("rope_theta", 10000.0),
          ins, want);
  // Member m's rows: chunks m and 2n-1-m of each sequence (written out
  // here, not through UlyssesLayout.h).
  auto globalRow = [&](int64_t m, int64_t r) {
    int64_t b = r / local, t = r % local, c = seq / (2 * n);
    int64_t pos = t < c ? m * c + t : (2 * n - 1 - m) * c + (t - c);
    return b * seq + pos;
  };
  auto rowsOf = [&](const Tensor &whole, int64_t m) {
    int64_t width = whole.shape[1];
    Tensor part = Tensor::f32({l, width});
    for (int64_t r = 0; r < l; ++r)
      std::copy_n(whole.f.begin() + globalRow(m, r) * width, width,
                  part.f.begin() + r * width);
    return part;
  };
  // Member j's all-to-all result: block i is member i's block j.
  auto allToAll = [&](const std::vector<Tensor> &sent) {
    std::vector<Tensor> got(n);
    int64_t block = sent[0].numel() / n;
    for (int64_t j = 0; j < n; ++j) {
      got[j] = Tensor::f32(sent[0].shape);
      for (int64_t i = 0; i < n; ++i)
        std::copy_n(sent[i].f.begin() + j * block, block,
                    got[j].f.begin() + i * block);
    }
    return got;
  };
  auto cpCols = [&](K k, bool kv) {
    k.i("cp", n).i("heads", config.heads);
    if (kv)
      k.i("kv_heads", config.kv);
    return k;
  };
  std::vector<Tensor> blocks(n), counts(n);
  for (int64_t m = 0; m < n; ++m) {
    std::vector<Tensor> in = {rowsOf(qkv, m)};
    std::vector<Tensor> out = {Tensor::f32({rows, cols / n}),
                               Tensor::i32({n}, std::vector<int32_t>(n, -1))};
    mustRun(cpCols(K("cp_ulysses_split"), true), in, out);
    blocks[m] = out[0];
    CHECK(out[1].i == std::vector<int32_t>(n, int32_t(l)));
  }
  std::vector<Tensor> received = allToAll(blocks), back(n);
  const int64_t h = config.heads / n, kv = config.kv / n;
  for (int64_t m = 0; m < n; ++m) {
    std::vector<Tensor> in = {received[m]},
                        natural = {Tensor::f32({rows, cols / n})};
    mustRun(K("cp_ulysses_natural").i("cp", n).i("seq", seq), in, natural);
    // Every row, in sequence order, of member m's query, key and value
    // heads.
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols / n; ++c) {
        int64_t group = c < h * config.hd          ? 0
                        : c < (h + kv) * config.hd ? 1
                                                   : 2;
        int64_t wideCol =
            group == 0 ? m * h * config.hd + c
                       : qCols + (group - 1) * kvCols + m * kv * config.hd +
                             (c - h * config.hd - (group - 1) * kv * config.hd);
        REQUIRE(natural[0].f[r * (cols / n) + c] == qkv.f[r * cols + wideCol]);
      }
    std::vector<Tensor> yLse = attentionOuts(rows, qCols / n, h);
    mustRun(K("attention")
                .i("heads", h)
                .i("kv_heads", kv)
                .i("seq", seq)
                .f("rope_theta", 10000.0),
            natural, yLse);
    std::vector<Tensor> y = {yLse[0]};
    std::vector<Tensor> out = {Tensor::f32({rows, qCols / n}),
                               Tensor::i32({n}, std::vector<int32_t>(n, -1))};
    mustRun(K("cp_ulysses_zigzag").i("cp", n).i("seq", seq), y, out);
    CHECK(out[1].i == std::vector<int32_t>(n, int32_t(l)));
    back[m] = out[0];
  }
  std::vector<Tensor> returned = allToAll(back);
  for (int64_t m = 0; m < n; ++m) {
    std::vector<Tensor> in = {returned[m]}, y = {Tensor::f32({l, qCols})};
    mustRun(cpCols(K("cp_ulysses_merge"), false), in, y);
    // The same kernel on the same rows and heads: bit for bit.
    CHECK(y[0].f == rowsOf(want[0], m).f);
  }
  // The inverses: merge after split, zigzag after natural.
  std::vector<Tensor> in = {blocks[0]}, merged = {Tensor::f32({l, cols})};
  mustRun(cpCols(K("cp_ulysses_merge"), true), in, merged);
  CHECK(merged[0].f == rowsOf(qkv, 0).f);
}

TEST_CASE("cp_split keeps the member's rows and cp_split_grad puts them "
          "back",
          "[kernels]") {
  const int64_t cp = GENERATE(2, 4);
  const int64_t batch = 2, seq = 4 * cp, rows = batch * seq, cols = 3;
  const int64_t local = seq / cp, chunk = seq / (2 * cp);
  Rng rng(41);
  Tensor x = randomF32(rng, {rows, cols});
  std::vector<int> covered(rows, 0);
  for (int64_t m = 0; m < cp; ++m) {
    KernelContext ctx;
    ctx.contextMember = m;
    std::vector<Tensor> in = {x}, out = {Tensor::f32({rows / cp, cols})};
    REQUIRE(run(K("cp_split").i("cp", cp).i("seq", seq), in, out, ctx));
    std::vector<Tensor> back = {
        Tensor::f32({rows, cols}, std::vector<float>(rows * cols, 9.0f))};
    REQUIRE(run(K("cp_split_grad").i("cp", cp).i("seq", seq), out, back, ctx));
    // Row t of sequence b: chunk m, then chunk 2 cp - 1 - m (written out).
    for (int64_t r = 0; r < rows / cp; ++r) {
      int64_t b = r / local, t = r % local;
      int64_t pos =
          t < chunk ? m * chunk + t : (2 * cp - 1 - m) * chunk + (t - chunk);
      int64_t g = b * seq + pos;
      ++covered[g];
      for (int64_t c = 0; c < cols; ++c)
        CHECK(out[0].f[r * cols + c] == x.f[g * cols + c]);
    }
    for (int64_t g = 0; g < rows; ++g)
      for (int64_t c = 0; c < cols; ++c) {
        bool mine = false;
        for (int64_t r = 0; r < rows / cp; ++r) {
          int64_t b = r / local, t = r % local;
          int64_t pos = t < chunk ? m * chunk + t
                                  : (2 * cp - 1 - m) * chunk + (t - chunk);
          mine = mine || b * seq + pos == g;
        }
        CHECK(back[0].f[g * cols + c] == (mine ? x.f[g * cols + c] : 0.0f));
      }
  }
  CHECK(std::count(covered.begin(), covered.end(), 1) == rows);
  KernelContext outside;
  outside.contextMember = cp;
  std::vector<Tensor> in = {x}, out = {Tensor::f32({rows / cp, cols})};
  Status s = run(K("cp_split").i("cp", cp).i("seq", seq), in, out, outside);
  REQUIRE_FALSE(s);
  CHECK(s.message().find("context-parallel member " + std::to_string(cp) +
                         " is not one of") != std::string::npos);
  CHECK(mustFail(K("cp_split").i("cp", 2).i("seq", 8), {Tensor::f32({16, 3})},
                 {Tensor::f32({4, 3})})
            .find("y has shape [4,3]") != std::string::npos);
}

TEST_CASE("Ulysses' layouts reject bad heads, sequences and shapes",
          "[kernels]") {
  auto counts = [](int64_t n) {
    return Tensor::i32({n}, std::vector<int32_t>(n));
  };
  CHECK(mustFail(K("cp_ulysses_split").i("cp", 2).i("heads", 3),
                 {Tensor::f32({4, 6})}, {Tensor::f32({8, 3}), counts(2)})
            .find("heads (3) and kv_heads (0) must be multiples of cp = 2") !=
        std::string::npos);
  CHECK(mustFail(K("cp_ulysses_split").i("cp", 1).i("heads", 2),
                 {Tensor::f32({4, 6})}, {Tensor::f32({4, 6}), counts(1)})
            .find("cp must be at least 2") != std::string::npos);
  CHECK(
      mustFail(K("cp_ulysses_split").i("cp", 2).i("heads", 2).i("kv_heads", 2),
               {Tensor::f32({4, 12})}, {Tensor::f32({4, 6}), counts(2)})
          .find("the narrow matrix must be [8, 6]") != std::string::npos);
  CHECK(mustFail(K("cp_ulysses_merge").i("cp", 2).i("heads", 2),
                 {Tensor::f32({8, 3})}, {Tensor::f32({4, 5})})
            .find("are not (heads + 2 kv_heads) = 2 heads") !=
        std::string::npos);
  CHECK(mustFail(K("cp_ulysses_natural").i("cp", 2).i("seq", 6),
                 {Tensor::f32({12, 2})}, {Tensor::f32({12, 2})})
            .find("seq 6 must be a multiple of 2 cp = 4") != std::string::npos);
  CHECK(mustFail(K("cp_ulysses_zigzag").i("cp", 2).i("seq", 8),
                 {Tensor::f32({12, 2})}, {Tensor::f32({12, 2}), counts(2)})
            .find("rows 12 are not whole sequences of 8") != std::string::npos);
  CHECK(mustFail(K("cp_ulysses_zigzag").i("cp", 2).i("seq", 8),
                 {Tensor::f32({16, 2})}, {Tensor::f32({16, 2}), counts(3)})
            .find("counts") != std::string::npos);
}

TEST_CASE("ring attention's log-sum-exp pair survives bf16 storage",
          "[kernels]") {
  // hi is v rounded to bf16 and lo the exact rest: their fp32 sum is v,
  // and with lo rounded to bf16 too (mixed precision stores every value
  // so) the error is at most lo's bf16 rounding, |lo| u with u = 2^-8 (8
  // significant bits), |lo| being at most v's rounding, |v| u: |v| 2^-16.
  Rng rng(5);
  for (int i = 0; i < 1000; ++i) {
    float v = static_cast<float>(rng.uniform(-40.0, 40.0));
    float lse[4];
    detail::storeRingLse(lse, 2, 0, 1, v);
    CHECK(lse[1] == roundToBf16(lse[1]));
    CHECK(detail::loadRingLse(lse, 2, 0, 1) == v);
    lse[3] = roundToBf16(lse[3]);
    CHECK(std::abs(detail::loadRingLse(lse, 2, 0, 1) - v) <=
          std::abs(v) * std::ldexp(1.0f, -16));
  }
  float lse[2];
  detail::storeRingLse(lse, 1, 0, 0, -std::numeric_limits<float>::infinity());
  CHECK(lse[1] == 0.0f);
  CHECK(detail::loadRingLse(lse, 1, 0, 0) ==
        -std::numeric_limits<float>::infinity());
}

TEST_CASE("ring attention steps reject bad members, steps and shapes",
          "[kernels]") {
  auto block = [](int64_t cp, int64_t step) {
    return K("attention_block")
        .i("heads", 2)
        .i("seq", 8)
        .i("cp", cp)
        .i("step", step);
  };
  // heads 2, hd 2: qkv [8, 12], kv [8, 8]; 8 / 2 = 4 rows of each
  // sequence per member, 2 sequences.
  auto ins = [] {
    return std::vector<Tensor>{Tensor::f32({8, 12}), Tensor::f32({8, 8})};
  };
  auto outs = [] {
    return std::vector<Tensor>{Tensor::f32({8, 4}), Tensor::f32({8, 4})};
  };
  auto fails = [&](const plan::Kernel &k, std::vector<Tensor> in,
                   std::vector<Tensor> out, int64_t member,
                   const std::string &needle) {
    KernelContext ctx;
    ctx.contextMember = member;
    Status st = run(k, in, out, ctx);
    INFO("message: " << st.message());
    REQUIRE_FALSE(st);
    CHECK(st.message().find(needle) != std::string::npos);
  };
  {
    KernelContext ctx;
    ctx.contextMember = 1;
    std::vector<Tensor> in = ins(), out = outs();
    REQUIRE(run(block(2, 1), in, out, ctx));
  }
  fails(block(2, 2), ins(), outs(), 0,
        "attribute 'step' 2 is not in [0, cp 2)");
  fails(block(2, 0), ins(), outs(), 2, "context member 2 is not one of 2");
  fails(block(3, 0), ins(), outs(), 0, "seq 8 is not a multiple of 2 x cp 3");
  fails(block(2, 0), {Tensor::f32({6, 12}), Tensor::f32({6, 8})},
        {Tensor::f32({6, 4}), Tensor::f32({6, 4})}, 0,
        "qkv has 6 rows, not a multiple of the member's seq / cp 4");
  std::vector<Tensor> three = ins();
  three.push_back(Tensor::f32({8, 4}));
  fails(block(2, 1), three, outs(), 0, "got 3 inputs");
  std::vector<Tensor> narrowKv = {Tensor::f32({8, 12}), Tensor::f32({8, 4})};
  fails(block(2, 0), narrowKv, outs(), 0, "kv");
  fails(K("attention_block").i("heads", 2).i("seq", 8).i("step", 0), ins(),
        outs(), 0, "'cp'");
}

// The norm backwards come in two halves (zero-bubble schedules run the input
// gradient BI and the weight gradient BW at different times); each half
// recomputes the row statistics from x. Over edge shapes they must match a
// double-precision reference, overwrite their outputs, and give the same
// bits whether the rows are processed together (dx is computed in parallel
// chunks of rows) or one at a time.

namespace {

/// Equal bytes: stricter than ==, which takes -0 for +0.
bool sameBits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() &&
         (a.empty() ||
          std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

/// `op` with attribute eps, or without (the default) when eps < 0.
K withEps(const std::string &op, double eps) {
  K k(op);
  if (eps >= 0)
    k.f("eps", eps);
  return k;
}

/// The backward of layer_norm (rms = false) or rms_norm (rms = true) in
/// double: dx, dgamma and (layer_norm only) dbeta.
void refNormBackward(bool rms, const std::vector<float> &x,
                     const std::vector<float> &gamma,
                     const std::vector<float> &dy, int64_t rows, int64_t hidden,
                     double eps, std::vector<double> &dx,
                     std::vector<double> &dgamma, std::vector<double> &dbeta) {
  dx.assign(rows * hidden, 0.0);
  dgamma.assign(hidden, 0.0);
  dbeta.assign(hidden, 0.0);
  for (int64_t n = 0; n < rows; ++n) {
    const float *xr = x.data() + n * hidden, *dyr = dy.data() + n * hidden;
    double mean = 0, sq = 0;
    for (int64_t j = 0; j < hidden; ++j)
      mean += xr[j];
    mean = rms ? 0.0 : mean / hidden;
    for (int64_t j = 0; j < hidden; ++j)
      sq += (xr[j] - mean) * (xr[j] - mean);
    double r = 1.0 / std::sqrt(sq / hidden + eps);
    double gMean = 0, gxMean = 0;
    for (int64_t j = 0; j < hidden; ++j) {
      double xhat = (xr[j] - mean) * r, g = double(dyr[j]) * gamma[j];
      gMean += g / hidden;
      gxMean += g * xhat / hidden;
      dgamma[j] += dyr[j] * xhat;
      dbeta[j] += dyr[j];
    }
    for (int64_t j = 0; j < hidden; ++j) {
      double xhat = (xr[j] - mean) * r, g = double(dyr[j]) * gamma[j];
      dx[n * hidden + j] = r * (g - (rms ? 0.0 : gMean) - xhat * gxMean);
    }
  }
}

void checkNear(const std::vector<float> &got, const std::vector<double> &want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(std::fabs(got[i] - want[i]) <= 1e-5 * (1.0 + std::fabs(want[i])));
  }
}

/// Runs NORM_grad_input and NORM_grad_weight on x, gamma, dy and checks them
/// against refNormBackward, and dx against the same kernel run row by row.
void checkSplitNormBackward(const std::string &norm, int64_t rows,
                            int64_t hidden, double eps, uint64_t seed) {
  const bool rms = norm == "rms_norm";
  INFO(norm << " shape [" << rows << "," << hidden << "] eps=" << eps);
  Rng rng(seed);
  Tensor x = randomF32(rng, {rows, hidden}, -3.0, 3.0);
  Tensor gamma = randomF32(rng, {hidden}, -1.5, 1.5);
  Tensor dy = randomF32(rng, {rows, hidden}, -2.0, 2.0);

  std::vector<Tensor> ins = {x, gamma, dy};
  std::vector<Tensor> dx = {Tensor::f32({rows, hidden})};
  std::fill(dx[0].f.begin(), dx[0].f.end(), 7.0f); // overwritten
  mustRun(withEps(norm + "_grad_input", eps), ins, dx);

  std::vector<Tensor> wins = {x, dy};
  std::vector<Tensor> dw = {Tensor::f32({hidden})};
  if (!rms)
    dw.push_back(Tensor::f32({hidden}));
  for (Tensor &t : dw)
    std::fill(t.f.begin(), t.f.end(), 7.0f); // overwritten, even for N = 0
  mustRun(withEps(norm + "_grad_weight", eps), wins, dw);

  std::vector<double> refDx, refDgamma, refDbeta;
  refNormBackward(rms, x.f, gamma.f, dy.f, rows, hidden,
                  eps >= 0 ? eps : (rms ? 1e-6 : 1e-5), refDx, refDgamma,
                  refDbeta);
  checkNear(dx[0].f, refDx);
  checkNear(dw[0].f, refDgamma);
  if (!rms)
    checkNear(dw[1].f, refDbeta);

  // Rows are independent: one row at a time gives the same bits.
  std::vector<float> byRow;
  for (int64_t n = 0; n < rows; ++n) {
    auto row = [&](const Tensor &t) {
      return Tensor::f32({1, hidden},
                         std::vector<float>(t.f.begin() + n * hidden,
                                            t.f.begin() + (n + 1) * hidden));
    };
    std::vector<Tensor> rowIns = {row(x), gamma, row(dy)};
    std::vector<Tensor> rowDx = {Tensor::f32({1, hidden})};
    mustRun(withEps(norm + "_grad_input", eps), rowIns, rowDx);
    byRow.insert(byRow.end(), rowDx[0].f.begin(), rowDx[0].f.end());
  }
  CHECK(sameBits(dx[0].f, byRow));
}

} // namespace

TEST_CASE("split norm gradients match a double-precision reference on edge "
          "shapes",
          "[kernels][grad]") {
  const std::vector<int64_t> shape =
      GENERATE(std::vector<int64_t>{4, 6}, std::vector<int64_t>{9, 37},
               std::vector<int64_t>{1, 1}, std::vector<int64_t>{0, 5},
               std::vector<int64_t>{3, 0}, std::vector<int64_t>{300, 17});
  const double eps = GENERATE(-1.0, 1e-3, 0.25); // -1: the default eps
  const int64_t rows = shape[0], hidden = shape[1];
  checkSplitNormBackward("layer_norm", rows, hidden, eps,
                         uint64_t(100 + rows * 1000 + hidden));
  checkSplitNormBackward("rms_norm", rows, hidden, eps,
                         uint64_t(200 + rows * 1000 + hidden));
}

TEST_CASE("layer_norm_grad_input and layer_norm_grad_weight are the "
          "gradients of layer_norm",
          "[kernels][grad]") {
  Rng rng(31);
  const int64_t rows = 4, hidden = 6;
  Tensor x = randomF32(rng, {rows, hidden}, -2.0, 2.0);
  Tensor gamma = randomF32(rng, {hidden}, 0.5, 1.5);
  Tensor beta = randomF32(rng, {hidden});
  std::vector<float> r = rng.vec(rows * hidden);
  for (double eps : {1e-3, -1.0}) { // -1: the default eps
    INFO("eps=" << eps);
    K forward = withEps("layer_norm", eps);
    std::vector<Tensor> ins = {x, gamma, Tensor::f32({rows, hidden}, r)};
    std::vector<Tensor> dx = {Tensor::f32({rows, hidden})};
    mustRun(withEps("layer_norm_grad_input", eps), ins, dx);
    std::vector<Tensor> wins = {x, Tensor::f32({rows, hidden}, r)};
    std::vector<Tensor> dw = {Tensor::f32({hidden}), Tensor::f32({hidden})};
    mustRun(withEps("layer_norm_grad_weight", eps), wins, dw);
    requireNonZero(dx[0].f);
    for (const Tensor &g : dw)
      requireNonZero(g.f);
    checkGradient(forward, {x, gamma, beta}, 0, {rows, hidden}, r, dx[0].f);
    checkGradient(forward, {x, gamma, beta}, 1, {rows, hidden}, r, dw[0].f);
    checkGradient(forward, {x, gamma, beta}, 2, {rows, hidden}, r, dw[1].f);
  }
}

TEST_CASE("rms_norm_grad_input and rms_norm_grad_weight are the gradients "
          "of rms_norm",
          "[kernels][grad]") {
  Rng rng(32);
  const int64_t rows = 4, hidden = 6;
  Tensor x = randomF32(rng, {rows, hidden}, -2.0, 2.0);
  Tensor gamma = randomF32(rng, {hidden}, 0.5, 1.5);
  std::vector<float> r = rng.vec(rows * hidden);
  for (double eps : {1e-3, -1.0}) { // -1: the default eps
    INFO("eps=" << eps);
    K forward = withEps("rms_norm", eps);
    std::vector<Tensor> ins = {x, gamma, Tensor::f32({rows, hidden}, r)};
    std::vector<Tensor> dx = {Tensor::f32({rows, hidden})};
    mustRun(withEps("rms_norm_grad_input", eps), ins, dx);
    std::vector<Tensor> wins = {x, Tensor::f32({rows, hidden}, r)};
    std::vector<Tensor> dw = {Tensor::f32({hidden})};
    mustRun(withEps("rms_norm_grad_weight", eps), wins, dw);
    requireNonZero(dx[0].f);
    requireNonZero(dw[0].f);
    checkGradient(forward, {x, gamma}, 0, {rows, hidden}, r, dx[0].f);
    checkGradient(forward, {x, gamma}, 1, {rows, hidden}, r, dw[0].f);
  }
}

TEST_CASE("qk_norm is rms_norm on each q and k head, v copied", "[kernels]") {
  // 2 rows of heads 4, kv_heads 2, hd 3: q heads 0-3 with gamma[0:3], k
  // heads 4-5 with gamma[3:6], v heads 6-7 untouched. Each head is checked
  // against the rms_norm kernel on that head alone.
  Rng rng(41);
  const int64_t rows = 2, heads = 4, kv = 2, hd = 3, g = heads + 2 * kv;
  Tensor x = randomF32(rng, {rows, g * hd}, -2.0, 2.0);
  Tensor gamma = randomF32(rng, {2 * hd}, 0.5, 1.5);
  std::vector<Tensor> ins = {x, gamma};
  std::vector<Tensor> outs = {Tensor::f32({rows, g * hd})};
  mustRun(K("qk_norm").i("heads", heads).i("kv_heads", kv).f("eps", 1e-3), ins,
          outs);
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t j = 0; j < g; ++j) {
      INFO("row " << n << " head " << j);
      const float *xr = x.f.data() + (n * g + j) * hd;
      const float *yr = outs[0].f.data() + (n * g + j) * hd;
      if (j >= heads + kv) {
        for (int64_t t = 0; t < hd; ++t)
          CHECK(yr[t] == xr[t]);
        continue;
      }
      const int64_t c = j < heads ? 0 : 1;
      std::vector<Tensor> one = {
          Tensor::f32({1, hd}, std::vector<float>(xr, xr + hd)),
          Tensor::f32({hd},
                      std::vector<float>(gamma.f.begin() + c * hd,
                                         gamma.f.begin() + (c + 1) * hd))};
      std::vector<Tensor> want = {Tensor::f32({1, hd})};
      mustRun(K("rms_norm").f("eps", 1e-3), one, want);
      for (int64_t t = 0; t < hd; ++t)
        CHECK(yr[t] == want[0].f[t]);
    }
}

TEST_CASE("qk_norm_grad_input and qk_norm_grad_weight are the gradients of "
          "qk_norm",
          "[kernels][grad]") {
  Rng rng(42);
  // kv_heads given (grouped-query) and left out (= heads).
  for (int64_t kv : {1, 0}) {
    const int64_t rows = 3, heads = 2, hd = 4;
    const int64_t g = heads + 2 * (kv ? kv : heads);
    INFO("kv_heads=" << kv);
    auto attrs = [&](const std::string &op) {
      K k(op);
      k.i("heads", heads).f("eps", 1e-3);
      if (kv)
        k.i("kv_heads", kv);
      return k;
    };
    Tensor x = randomF32(rng, {rows, g * hd}, -2.0, 2.0);
    Tensor gamma = randomF32(rng, {2 * hd}, 0.5, 1.5);
    std::vector<float> r = rng.vec(rows * g * hd);
    std::vector<Tensor> ins = {x, gamma, Tensor::f32({rows, g * hd}, r)};
    std::vector<Tensor> dx = {Tensor::f32({rows, g * hd})};
    mustRun(attrs("qk_norm_grad_input"), ins, dx);
    std::vector<Tensor> wins = {x, Tensor::f32({rows, g * hd}, r)};
    std::vector<Tensor> dw = {Tensor::f32({2 * hd})};
    mustRun(attrs("qk_norm_grad_weight"), wins, dw);
    requireNonZero(dx[0].f);
    requireNonZero(dw[0].f);
    checkGradient(attrs("qk_norm"), {x, gamma}, 0, {rows, g * hd}, r, dx[0].f);
    checkGradient(attrs("qk_norm"), {x, gamma}, 1, {rows, g * hd}, r, dw[0].f);
  }
}

TEST_CASE("qk_norm rejects bad operands and attributes", "[kernels][errors]") {
  CHECK(mustFail(K("qk_norm"), {Tensor::f32({2, 6}), Tensor::f32({2})},
                 {Tensor::f32({2, 6})}) ==
        "qk_norm: missing attribute 'heads'");
  CHECK(mustFail(K("qk_norm").i("heads", 2).i("kv_heads", 0),
                 {Tensor::f32({2, 6}), Tensor::f32({2})}, {Tensor::f32({2, 6})})
            .find("kv_heads") != std::string::npos);
  CHECK(mustFail(K("qk_norm").i("heads", 2),
                 {Tensor::f32({2, 12}), Tensor::f32({3})},
                 {Tensor::f32({2, 12})}) ==
        "qk_norm: gamma has shape [3], expected [4]");
  CHECK(mustFail(K("qk_norm").i("heads", 2).f("eps", -1.0),
                 {Tensor::f32({2, 12}), Tensor::f32({4})},
                 {Tensor::f32({2, 12})}) ==
        "qk_norm: attribute 'eps' must not be negative");
  CHECK(mustFail(K("qk_norm_grad_weight").i("heads", 2),
                 {Tensor::f32({2, 12}), Tensor::f32({2, 6})},
                 {Tensor::f32({4})}) ==
        "qk_norm_grad_weight: dy has shape [2,6], expected [2,12]");
}

TEST_CASE("swiglu_grad is the gradient of swiglu", "[kernels][grad]") {
  Rng rng(20);
  const int64_t rows = 3, width = 5;
  Tensor gateUp = randomF32(rng, {rows, 2 * width}, -4.0, 4.0);
  std::vector<float> r = rng.vec(rows * width);
  std::vector<Tensor> ins = {gateUp, Tensor::f32({rows, width}, r)};
  std::vector<Tensor> outs = {Tensor::f32({rows, 2 * width})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f); // must be overwritten
  mustRun(K("swiglu_grad"), ins, outs);
  requireNonZero(outs[0].f);
  checkGradient(K("swiglu"), {gateUp}, 0, {rows, width}, r, outs[0].f);
}

TEST_CASE("cross_entropy_grad is the gradient of scale * cross_entropy",
          "[kernels][grad]") {
  Rng rng(17);
  const int64_t rows = 4, vocab = 5;
  Tensor logits = randomF32(rng, {rows, vocab}, -2.0, 2.0);
  Tensor targets = Tensor::i32({2, 2}, {0, 4, 2, 4});
  const double scale = 2.5;

  std::vector<Tensor> ins = {logits, targets};
  std::vector<Tensor> outs = {Tensor::f32({rows, vocab})};
  mustRun(K("cross_entropy_grad").f("scale", scale), ins, outs);
  requireNonZero(outs[0].f);
  for (int64_t n = 0; n < rows; ++n) {
    double rowSum = 0;
    for (int64_t j = 0; j < vocab; ++j)
      rowSum += outs[0].f[n * vocab + j];
    CHECK(rowSum == Approx(0.0).margin(1e-6)); // softmax minus one-hot
  }
  checkGradient(K("cross_entropy"), {logits, targets}, 0, {}, {float(scale)},
                outs[0].f);
}

// ---------------------------------------------------------------------------
// Vocabulary parallelism (docs/tensor-parallel.md §5c): T members each hold
// V / T columns of the logits (rows of the embedding table); the sum of
// their vocab_ce_stats gives every member the whole loss, and each member's
// gradient columns are those of cross_entropy_grad on the whole logits.

/// Columns [first, first + count) of a row-major [rows, cols] tensor.
Tensor columns(const Tensor &t, int64_t rows, int64_t cols, int64_t first,
               int64_t count) {
  Tensor out = Tensor::f32({rows, count});
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t j = 0; j < count; ++j)
      out.f[n * count + j] = t.f[n * cols + first + j];
  return out;
}

TEST_CASE("vocabulary-parallel cross entropy equals cross_entropy on the "
          "whole logits",
          "[kernels][forward][grad]") {
  for (int64_t members : {2, 3, 4}) {
    INFO("members " << members);
    Rng rng(40 + members);
    const int64_t rows = 6, local = 5, vocab = members * local;
    // Logits spread widely, so that the members' maxima differ by far
    // (exponents down to ~-60) and the rescaling matters.
    Tensor logits = randomF32(rng, {rows, vocab}, -30.0, 30.0);
    std::vector<int32_t> ids;
    for (int64_t n = 0; n < rows; ++n)
      ids.push_back(static_cast<int32_t>((n * 7 + 3) % vocab));
    Tensor targets = Tensor::i32({2, 3}, ids);
    std::vector<Tensor> wholeIns = {logits, targets};
    std::vector<Tensor> wholeLoss = {Tensor::f32({})};
    std::vector<Tensor> wholeGrad = {Tensor::f32({rows, vocab})};
    const double scale = 0.75;
    mustRun(K("cross_entropy"), wholeIns, wholeLoss);
    mustRun(K("cross_entropy_grad").f("scale", scale), wholeIns, wholeGrad);

    // Each member's statistics, summed: the all-reduce.
    const int64_t width = 4 * members + 1;
    Tensor stats = Tensor::f32({rows, width});
    std::vector<Tensor> parts;
    for (int64_t m = 0; m < members; ++m) {
      KernelContext ctx;
      ctx.tensorMember = m;
      std::vector<Tensor> ins = {columns(logits, rows, vocab, m * local, local),
                                 targets};
      std::vector<Tensor> outs = {Tensor::f32({rows, width})};
      std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f); // overwritten
      REQUIRE(run(K("vocab_ce_stats").i("members", members), ins, outs, ctx)
                  .isOk());
      for (int64_t n = 0; n < rows; ++n)
        for (int64_t j = 0; j < width; ++j) {
          bool own = j == m || j == members + m || j == 2 * members + m ||
                     j == 3 * members + m || j == 4 * members;
          if (!own)
            CHECK(outs[0].f[n * width + j] == 0.0f);
          stats.f[n * width + j] += outs[0].f[n * width + j];
        }
      parts.push_back(ins[0]);
    }
    for (int64_t n = 0; n < rows; ++n) // the target's logit, exactly
      CHECK(stats.f[n * width + 4 * members] ==
            logits.f[n * vocab + targets.i[n]]);
    for (int64_t m = 0; m < members; ++m) {
      KernelContext ctx;
      ctx.tensorMember = m;
      std::vector<Tensor> ins = {stats, parts[m], targets};
      std::vector<Tensor> loss = {Tensor::f32({})};
      REQUIRE(
          run(K("vocab_cross_entropy").i("members", members), ins, loss, ctx)
              .isOk());
      // The same log-sum-exp, regrouped by member: float round-off of the
      // members' sums (their float storage, 2^-24 relative).
      CHECK(loss[0].f[0] == Approx(wholeLoss[0].f[0]).epsilon(1e-6));
      std::vector<Tensor> grad = {Tensor::f32({rows, local})};
      REQUIRE(run(K("vocab_cross_entropy_grad")
                      .i("members", members)
                      .f("scale", scale),
                  ins, grad, ctx)
                  .isOk());
      Tensor want = columns(wholeGrad[0], rows, vocab, m * local, local);
      for (size_t i = 0; i < want.f.size(); ++i)
        CHECK(grad[0].f[i] == Approx(want.f[i]).epsilon(1e-5).margin(1e-9));
    }
  }
}

TEST_CASE("vocabulary-parallel kernels reject bad members and targets",
          "[kernels][forward]") {
  KernelContext ctx;
  ctx.tensorMember = 2;
  std::vector<Tensor> ins = {Tensor::f32({2, 3}), Tensor::i32({1, 2}, {0, 1})};
  std::vector<Tensor> outs = {Tensor::f32({2, 9})};
  CHECK(run(K("vocab_ce_stats").i("members", 2), ins, outs, ctx)
            .message()
            .find("tensor-parallel member 2 is not one of 2") !=
        std::string::npos);
  CHECK(mustFail(K("vocab_ce_stats"), ins, outs).find("members") !=
        std::string::npos);
  CHECK(mustFail(K("vocab_ce_stats").i("members", 1), ins, outs)
            .find("members 1 must be at least 2") != std::string::npos);
  // [2, 5] is not [rows, 4 members + 1].
  CHECK(
      mustFail(K("vocab_ce_stats").i("members", 2), ins, {Tensor::f32({2, 5})})
          .find("stats") != std::string::npos);
  // Targets are global ids: below members * local vocabulary (6).
  std::vector<Tensor> bad = {Tensor::f32({2, 3}), Tensor::i32({1, 2}, {0, 6})};
  CHECK(mustFail(K("vocab_ce_stats").i("members", 2), bad, outs)
            .find("targets") != std::string::npos);
  std::vector<Tensor> lossIns = {Tensor::f32({2, 9}), Tensor::f32({2, 3}),
                                 Tensor::i32({1, 2}, {0, 6})};
  CHECK(mustFail(K("vocab_cross_entropy").i("members", 2), lossIns,
                 {Tensor::f32({})})
            .find("targets") != std::string::npos);
  lossIns[2] = Tensor::i32({1, 2}, {0, 5});
  CHECK(mustFail(K("vocab_cross_entropy_grad").i("members", 2), lossIns,
                 {Tensor::f32({2, 4})})
            .find("dlogits") != std::string::npos);
}

TEST_CASE("vocabulary-parallel embedding: the members' rows sum to the "
          "whole lookup, and their gradients are its rows",
          "[kernels][forward][grad]") {
  Rng rng(44);
  const int64_t members = 3, local = 4, vocab = members * local, hidden = 5;
  Tensor ids = Tensor::i32({2, 4}, {0, 11, 4, 4, 7, 3, 8, 11});
  Tensor table = randomF32(rng, {vocab, hidden});
  Tensor dy = randomF32(rng, {8, hidden});
  std::vector<Tensor> wholeIns = {ids, table};
  std::vector<Tensor> whole = {Tensor::f32({8, hidden})};
  mustRun(K("embedding"), wholeIns, whole);
  std::vector<Tensor> gradIns = {ids, dy};
  std::vector<Tensor> wholeGrad = {Tensor::f32({vocab, hidden})};
  mustRun(K("embedding_grad").i("vocab", vocab), gradIns, wholeGrad);

  std::vector<float> sum(8 * hidden, 0.0f);
  for (int64_t m = 0; m < members; ++m) {
    KernelContext ctx;
    ctx.tensorMember = m;
    Tensor rows = Tensor::f32({local, hidden});
    std::copy_n(table.f.begin() + m * local * hidden, local * hidden,
                rows.f.begin());
    std::vector<Tensor> ins = {ids, rows};
    std::vector<Tensor> outs = {Tensor::f32({8, hidden})};
    std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f); // overwritten
    REQUIRE(run(K("embedding").i("members", members), ins, outs, ctx).isOk());
    for (size_t i = 0; i < sum.size(); ++i)
      sum[i] += outs[0].f[i]; // one non-zero term: exact
    std::vector<Tensor> grad = {Tensor::f32({local, hidden})};
    REQUIRE(run(K("embedding_grad").i("vocab", local).i("members", members),
                gradIns, grad, ctx)
                .isOk());
    CHECK(std::equal(grad[0].f.begin(), grad[0].f.end(),
                     wholeGrad[0].f.begin() + m * local * hidden));
  }
  CHECK(sum == whole[0].f);
  // An id of the global vocabulary's range only.
  KernelContext ctx;
  std::vector<Tensor> bad = {Tensor::i32({1, 1}, {12}),
                             Tensor::f32({local, hidden})};
  std::vector<Tensor> outs = {Tensor::f32({1, hidden})};
  CHECK(run(K("embedding").i("members", members), bad, outs, ctx)
            .message()
            .find("ids") != std::string::npos);
}

// ---------------------------------------------------------------------------
// State and optimizer kernels.

TEST_CASE("accumulate adds in place and zero clears", "[kernels][state]") {
  std::vector<Tensor> ins = {Tensor::f32({3}, {1, 2, 3})};
  std::vector<Tensor> outs = {Tensor::f32({3}, {10, 20, 30})};
  mustRun(K("accumulate"), ins, outs);
  mustRun(K("accumulate"), ins, outs);
  CHECK(outs[0].f == std::vector<float>{12, 24, 36});

  std::vector<Tensor> none;
  mustRun(K("zero"), none, outs);
  CHECK(outs[0].f == std::vector<float>{0, 0, 0});
  std::vector<Tensor> ints = {Tensor::i32({2}, {4, 5})};
  mustRun(K("zero"), none, ints);
  CHECK(ints[0].i == std::vector<int32_t>{0, 0});
}

TEST_CASE("adamw matches a double-precision AdamW over three steps",
          "[kernels][state]") {
  const double lr = 0.1, beta1 = 0.8, beta2 = 0.9, eps = 1e-6, wd = 0.05;
  const std::vector<std::vector<double>> grads = {
      {0.5, -1.0, 0.0, 2.0}, {0.25, 1.0, -0.5, 2.0}, {-0.75, 0.5, 0.1, -1.0}};
  std::vector<double> p = {1.0, -2.0, 0.5, 0.0}, m(4, 0.0), v(4, 0.0);

  std::vector<Tensor> outs = {Tensor::f32({2, 2}, {1.0f, -2.0f, 0.5f, 0.0f}),
                              Tensor::f32({2, 2}), Tensor::f32({2, 2})};
  K kernel = K("adamw")
                 .f("lr", lr)
                 .f("beta1", beta1)
                 .f("beta2", beta2)
                 .f("eps", eps)
                 .f("weight_decay", wd);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<double> &g = grads[step - 1];
    for (int i = 0; i < 4; ++i) {
      p[i] -= lr * wd * p[i];
      m[i] = beta1 * m[i] + (1 - beta1) * g[i];
      v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
      double mhat = m[i] / (1 - std::pow(beta1, step));
      double vhat = v[i] / (1 - std::pow(beta2, step));
      p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
    std::vector<Tensor> ins = {Tensor::f32(
        {2, 2}, {float(g[0]), float(g[1]), float(g[2]), float(g[3])})};
    KernelContext ctx;
    ctx.step = step;
    REQUIRE(run(kernel, ins, outs, ctx).isOk());
  }
  for (int i = 0; i < 4; ++i) {
    INFO("element " << i);
    CHECK(outs[0].f[i] == Approx(p[i]).margin(1e-6));
    CHECK(outs[1].f[i] == Approx(m[i]).margin(1e-6));
    CHECK(outs[2].f[i] == Approx(v[i]).margin(1e-6));
  }
}

TEST_CASE("adamw defaults follow the spec", "[kernels][state]") {
  // With only lr given: beta1 0.9, beta2 0.95, eps 1e-8, no weight decay. The
  // first bias-corrected step moves every parameter by lr * sign(g).
  std::vector<Tensor> ins = {Tensor::f32({3}, {0.3f, -2.0f, 0.0f})};
  std::vector<Tensor> outs = {Tensor::f32({3}, {1, 1, 1}), Tensor::f32({3}),
                              Tensor::f32({3})};
  mustRun(K("adamw").f("lr", 0.01), ins, outs);
  CHECK(outs[0].f[0] == Approx(0.99).margin(1e-6));
  CHECK(outs[0].f[1] == Approx(1.01).margin(1e-6));
  CHECK(outs[0].f[2] == 1.0f);
  CHECK(outs[1].f[0] == Approx(0.1 * 0.3));
  CHECK(outs[2].f[1] == Approx(0.05 * 4.0));
}

// ---------------------------------------------------------------------------
// Error paths: every bad input is a Status, never a crash.

TEST_CASE("unknown kernels are rejected", "[kernels][errors]") {
  std::vector<Tensor> none;
  Status s = run(K("conv2d"), none, none);
  REQUIRE_FALSE(s.isOk());
  CHECK(s.message() == "unknown kernel 'conv2d'");
}

TEST_CASE("every kernel rejects missing or extra operands",
          "[kernels][errors]") {
  for (const std::string &name : kernelNames()) {
    mustFail(K(name), {}, {});
    std::vector<Tensor> many(5, Tensor::f32({2, 2}));
    mustFail(K(name), many, many);
  }
}

TEST_CASE("wrong shapes are rejected", "[kernels][errors]") {
  CHECK(mustFail(K("linear"), {Tensor::f32({2, 3}), Tensor::f32({4, 5})},
                 {Tensor::f32({2, 5})}) ==
        "linear: w has shape [4,5], expected [3,*] (transpose_w=0)");
  mustFail(K("linear"), {Tensor::f32({2, 3}), Tensor::f32({3, 5})},
           {Tensor::f32({2, 4})});
  mustFail(K("linear"),
           {Tensor::f32({2, 3}), Tensor::f32({3, 5}), Tensor::f32({4})},
           {Tensor::f32({2, 5})});
  mustFail(K("linear").i("transpose_w", 1),
           {Tensor::f32({2, 3}), Tensor::f32({3, 5})}, {Tensor::f32({2, 3})});
  mustFail(K("linear").i("transpose_w", 2),
           {Tensor::f32({2, 3}), Tensor::f32({3, 5})}, {Tensor::f32({2, 5})});
  mustFail(K("linear_grad_input"), {Tensor::f32({2, 4}), Tensor::f32({3, 5})},
           {Tensor::f32({2, 3})});
  mustFail(K("linear_grad_weight"), {Tensor::f32({2, 3}), Tensor::f32({3, 5})},
           {Tensor::f32({3, 5})});
  mustFail(K("linear_grad_weight").i("transpose_w", 1),
           {Tensor::f32({2, 3}), Tensor::f32({2, 5})}, {Tensor::f32({3, 5})});
  mustFail(K("bias_grad"), {Tensor::f32({2, 3})}, {Tensor::f32({2})});
  mustFail(K("bias_add"), {Tensor::f32({2, 3}), Tensor::f32({2})},
           {Tensor::f32({2, 3})});
  mustFail(K("bias_add"), {Tensor::f32({2, 3}), Tensor::f32({3})},
           {Tensor::f32({3, 2})});
  mustFail(K("layer_norm"),
           {Tensor::f32({2, 3}), Tensor::f32({3}), Tensor::f32({2})},
           {Tensor::f32({2, 3})});
  mustFail(K("add"), {Tensor::f32({2, 3}), Tensor::f32({3, 2})},
           {Tensor::f32({2, 3})});
  mustFail(K("gelu"), {Tensor::f32({4})}, {Tensor::f32({2, 2})});
  mustFail(K("gelu_grad"), {Tensor::f32({4}), Tensor::f32({3})},
           {Tensor::f32({4})});
  mustFail(K("embedding"),
           {Tensor::i32({2, 2}, {0, 0, 0, 0}), Tensor::f32({3, 2})},
           {Tensor::f32({4, 3})});
  mustFail(K("embedding_grad").i("vocab", 4),
           {Tensor::i32({2}, {0, 0}), Tensor::f32({2, 2})},
           {Tensor::f32({3, 2})});
  mustFail(K("position_add").i("seq", 4),
           {Tensor::f32({4, 2}), Tensor::f32({3, 2})}, {Tensor::f32({4, 2})});
  mustFail(K("position_add").i("seq", 3),
           {Tensor::f32({4, 2}), Tensor::f32({3, 2})}, {Tensor::f32({4, 2})});
  mustFail(K("position_add").i("seq", 2),
           {Tensor::f32({4, 2}), Tensor::f32({3, 2})});
  mustFail(K("position_add_grad").i("seq", 2), {Tensor::f32({4, 2})},
           {Tensor::f32({1, 2})});
  mustFail(K("attention").i("heads", 4).i("seq", 2), {Tensor::f32({4, 18})},
           {Tensor::f32({4, 6})});
  mustFail(K("attention").i("heads", 2).i("seq", 3), {Tensor::f32({4, 18})},
           {Tensor::f32({4, 6})});
  mustFail(K("attention").i("heads", 2).i("seq", 2), {Tensor::f32({4, 17})},
           {Tensor::f32({4, 6})});
  mustFail(K("attention_grad").i("heads", 2).i("seq", 2),
           {Tensor::f32({4, 18}), Tensor::f32({4, 5})}, {Tensor::f32({4, 18})});
  mustFail(K("cross_entropy"),
           {Tensor::f32({3, 4}), Tensor::i32({1, 2}, {0, 0})},
           {Tensor::f32({})});
  mustFail(K("cross_entropy"),
           {Tensor::f32({2, 4}), Tensor::i32({1, 2}, {0, 0})},
           {Tensor::f32({2})});
  mustFail(K("cross_entropy_grad"),
           {Tensor::f32({2, 4}), Tensor::i32({1, 2}, {0, 0})},
           {Tensor::f32({2, 3})});
  mustFail(K("accumulate"), {Tensor::f32({3})}, {Tensor::f32({4})});
  mustFail(K("adamw").f("lr", 0.1), {Tensor::f32({3})},
           {Tensor::f32({3}), Tensor::f32({3}), Tensor::f32({2})});
}

TEST_CASE("wrong dtypes are rejected", "[kernels][errors]") {
  CHECK(mustFail(K("embedding"), {Tensor::f32({1, 2}), Tensor::f32({3, 2})},
                 {Tensor::f32({2, 2})}) ==
        "embedding: ids must be i32, got f32");
  mustFail(
      K("embedding"),
      {Tensor::i32({1, 2}, {0, 0}), Tensor::i32({3, 2}, {0, 0, 0, 0, 0, 0})},
      {Tensor::f32({2, 2})});
  mustFail(K("layer_norm"),
           {Tensor::i32({1, 2}, {1, 2}), Tensor::f32({2}), Tensor::f32({2})},
           {Tensor::f32({1, 2})});
  mustFail(K("cross_entropy"), {Tensor::f32({2, 3}), Tensor::f32({1, 2})},
           {Tensor::f32({})});
  mustFail(K("add"), {Tensor::f32({2}), Tensor::i32({2}, {1, 2})},
           {Tensor::f32({2})});
  mustFail(K("gelu"), {Tensor::f32({2})}, {Tensor::i32({2}, {0, 0})});
  Tensor unspecified = Tensor::f32({2});
  unspecified.dtype = plan::DTYPE_UNSPECIFIED;
  mustFail(K("zero"), {}, {unspecified});
}

TEST_CASE("rms_norm and swiglu reject bad operands", "[kernels][errors]") {
  CHECK(mustFail(K("rms_norm"), {Tensor::f32({2, 3}), Tensor::f32({2})},
                 {Tensor::f32({2, 3})}) ==
        "rms_norm: gamma has shape [2], expected [3]");
  mustFail(K("rms_norm"), {Tensor::f32({2, 3}), Tensor::f32({3})},
           {Tensor::f32({3, 2})});
  mustFail(K("rms_norm"), {Tensor::f32({6}), Tensor::f32({6})},
           {Tensor::f32({6})});
  mustFail(K("rms_norm"), {Tensor::i32({1, 2}, {1, 2}), Tensor::f32({2})},
           {Tensor::f32({1, 2})});
  CHECK(mustFail(K("rms_norm").f("eps", -1.0),
                 {Tensor::f32({1, 2}), Tensor::f32({2})},
                 {Tensor::f32({1, 2})}) ==
        "rms_norm: attribute 'eps' must not be negative");
  mustFail(K("rms_norm").s("eps", "small"),
           {Tensor::f32({1, 2}), Tensor::f32({2})}, {Tensor::f32({1, 2})});
  // rms_norm has no beta: three inputs is layer_norm's signature.
  CHECK(mustFail(K("rms_norm"),
                 {Tensor::f32({1, 2}), Tensor::f32({2}), Tensor::f32({2})},
                 {Tensor::f32({1, 2})}) ==
        "rms_norm: expected 2 inputs, got 3");

  CHECK(mustFail(K("swiglu"), {Tensor::f32({2, 5})}, {Tensor::f32({2, 2})}) ==
        "swiglu: gate_up has shape [2,5], expected an even number of columns "
        "[gate | up]");
  CHECK(mustFail(K("swiglu"), {Tensor::f32({2, 6})}, {Tensor::f32({2, 6})}) ==
        "swiglu: y has shape [2,6], expected [2,3]");
  mustFail(K("swiglu"), {Tensor::f32({12})}, {Tensor::f32({6})});
  mustFail(K("swiglu"), {Tensor::i32({1, 2}, {1, 2})}, {Tensor::f32({1, 1})});
  mustFail(K("swiglu_grad"), {Tensor::f32({2, 6}), Tensor::f32({2, 6})},
           {Tensor::f32({2, 6})});
  mustFail(K("swiglu_grad"), {Tensor::f32({2, 6}), Tensor::f32({2, 3})},
           {Tensor::f32({2, 3})});
  mustFail(K("swiglu_grad"), {Tensor::f32({2, 7}), Tensor::f32({2, 3})},
           {Tensor::f32({2, 7})});
}

TEST_CASE("split norm gradients reject bad operands", "[kernels][errors]") {
  Tensor x = Tensor::f32({2, 3}), gamma = Tensor::f32({3}),
         dy = Tensor::f32({2, 3}), h = Tensor::f32({3});
  for (const std::string norm : {"layer_norm", "rms_norm"}) {
    const std::string in = norm + "_grad_input", w = norm + "_grad_weight";
    const bool layer = norm == "layer_norm";
    // The input half takes the forward's x and gamma, and dy; returns dx.
    CHECK(mustFail(K(in), {x, gamma, dy}, {x, h}) ==
          in + ": expected 1 output, got 2");
    CHECK(mustFail(K(in), {x, dy}, {x}) == in + ": expected 3 inputs, got 2");
    CHECK(mustFail(K(in), {x, Tensor::f32({2}), dy}, {x}) ==
          in + ": gamma has shape [2], expected [3]");
    CHECK(mustFail(K(in), {x, gamma, Tensor::f32({3, 2})}, {x}) ==
          in + ": dy has shape [3,2], expected [2,3]");
    CHECK(mustFail(K(in), {x, gamma, dy}, {Tensor::f32({2, 4})}) ==
          in + ": dx has shape [2,4], expected [2,3]");
    CHECK(mustFail(
              K(in), {Tensor::f32({6}), Tensor::f32({6}), Tensor::f32({6})},
              {Tensor::f32({6})}) == in + ": x has shape [6], expected rank 2");
    CHECK(mustFail(K(in),
                   {Tensor::i32({1, 2}, {1, 2}), Tensor::f32({2}),
                    Tensor::f32({1, 2})},
                   {Tensor::f32({1, 2})}) == in + ": x must be f32, got i32");
    CHECK(mustFail(K(in).f("eps", -1.0), {x, gamma, dy}, {x}) ==
          in + ": attribute 'eps' must not be negative");
    mustFail(K(in).s("eps", "small"), {x, gamma, dy}, {x});

    // The weight half takes no gamma and returns the parameter gradients.
    std::vector<Tensor> wOuts =
        layer ? std::vector<Tensor>{h, h} : std::vector<Tensor>{h};
    const std::string outs = layer ? "2 outputs" : "1 output";
    CHECK(mustFail(K(w), {x, gamma, dy}, wOuts) ==
          w + ": expected 2 inputs, got 3");
    CHECK(mustFail(K(w), {x, dy}, {x, h, h}) ==
          w + ": expected " + outs + ", got 3");
    CHECK(mustFail(K(w), {x, Tensor::f32({3, 2})}, wOuts) ==
          w + ": dy has shape [3,2], expected [2,3]");
    CHECK(mustFail(K(w), {x, Tensor::i32({2, 3}, {0, 0, 0, 0, 0, 0})}, wOuts) ==
          w + ": dy must be f32, got i32");
    CHECK(mustFail(K(w), {Tensor::f32({6}), Tensor::f32({6})}, wOuts) ==
          w + ": x has shape [6], expected rank 2");
    std::vector<Tensor> badGamma = wOuts;
    badGamma[0] = Tensor::f32({2});
    CHECK(mustFail(K(w), {x, dy}, badGamma) ==
          w + ": dgamma has shape [2], expected [3]");
    if (layer)
      CHECK(mustFail(K(w), {x, dy}, {h, Tensor::f32({2, 3})}) ==
            w + ": dbeta has shape [2,3], expected [3]");
    CHECK(mustFail(K(w).f("eps", -1.0), {x, dy}, wOuts) ==
          w + ": attribute 'eps' must not be negative");
    mustFail(K(w).s("eps", "small"), {x, dy}, wOuts);
  }
}

TEST_CASE("attention rejects bad kv_heads, rope_theta and widths",
          "[kernels][errors]") {
  // heads 4, kv_heads 2, hd 2: qkv [N, 16], y [N, 8].
  Tensor qkv = Tensor::f32({4, 16});
  Tensor y = Tensor::f32({4, 8}), lse = Tensor::f32({4, 8});
  K good = K("attention").i("heads", 4).i("kv_heads", 2).i("seq", 2);
  {
    std::vector<Tensor> ins = {qkv}, outs = {y, lse};
    mustRun(good, ins, outs);
  }
  CHECK(mustFail(K("attention").i("heads", 4).i("kv_heads", 3).i("seq", 2),
                 {qkv}, {y, lse}) ==
        "attention: attribute 'heads' 4 is not a multiple of 'kv_heads' 3");
  mustFail(K("attention").i("heads", 2).i("kv_heads", 4).i("seq", 2),
           {Tensor::f32({4, 20})}, {Tensor::f32({4, 4}), Tensor::f32({4, 4})});
  CHECK(mustFail(K("attention").i("heads", 4).i("kv_heads", 0).i("seq", 2),
                 {qkv}, {y, lse}) ==
        "attention: attribute 'kv_heads' must be positive, got 0");
  mustFail(K("attention").i("heads", 4).f("kv_heads", 1.5).i("seq", 2), {qkv},
           {y, lse});
  // The multi-head width without kv_heads, and the GQA width with the wrong
  // kv_heads.
  CHECK(mustFail(K("attention").i("heads", 4).i("seq", 2), {qkv}, {y, lse}) ==
        "attention: qkv has 16 columns, expected (heads 4 + 2 * kv_heads 4) "
        "* head dim 2");
  mustFail(K("attention").i("heads", 4).i("kv_heads", 1).i("seq", 2), {qkv},
           {y, lse});
  CHECK(mustFail(good, {qkv}, {Tensor::f32({4, 6}), lse}) ==
        "attention: y has 6 columns, expected a positive multiple of heads 4");
  mustFail(good, {qkv}, {Tensor::f32({4, 0}), lse});
  CHECK(mustFail(good, {qkv}, {Tensor::f32({2, 8}), lse}) ==
        "attention: y has shape [2,8], expected [4,*]");
  mustFail(good, {qkv}, {Tensor::f32({32}), lse});

  CHECK(mustFail(K(good).f("rope_theta", -10000.0), {qkv}, {y, lse}) ==
        "attention: attribute 'rope_theta' must not be negative");
  mustFail(K(good).s("rope_theta", "10000"), {qkv}, {y, lse});
  mustFail(K(good).f("rope_theta", std::nan("")), {qkv}, {y, lse});
  // hd = 3 is fine without rotary embeddings, not with them.
  std::vector<Tensor> oddIns = {Tensor::f32({2, 9})};
  std::vector<Tensor> oddOuts = {Tensor::f32({2, 3}), Tensor::f32({2, 2})};
  mustRun(K("attention").i("heads", 1).i("seq", 2), oddIns, oddOuts);
  CHECK(mustFail(
            K("attention").i("heads", 1).i("seq", 2).f("rope_theta", 10000.0),
            oddIns, oddOuts) ==
        "attention: head dim 3 must be even for rotary embeddings");

  K goodGrad = K("attention_grad").i("heads", 4).i("kv_heads", 2).i("seq", 2);
  {
    std::vector<Tensor> ins = {qkv, y, lse, y}, outs = {qkv};
    mustRun(goodGrad, ins, outs);
  }
  CHECK(mustFail(goodGrad, {qkv, y, lse, y}, {Tensor::f32({4, 24})}) ==
        "attention_grad: dqkv has shape [4,24], expected [4,16]");
  mustFail(goodGrad, {qkv, y, lse, Tensor::f32({4, 12})}, {qkv});
  mustFail(K(goodGrad).i("kv_heads", 3), {qkv, y, lse, y}, {qkv});
  mustFail(K("attention_grad").i("heads", 1).i("seq", 2).f("rope_theta", 1e4),
           {Tensor::f32({2, 9}), Tensor::f32({2, 3}), Tensor::f32({2, 2}),
            Tensor::f32({2, 3})},
           {Tensor::f32({2, 9})});

  // Zero rows: nothing to compute, however long the sequence.
  std::vector<Tensor> emptyIns = {Tensor::f32({0, 16})};
  std::vector<Tensor> emptyOuts = {Tensor::f32({0, 8}), Tensor::f32({0, 8})};
  mustRun(K(good).i("seq", 1 << 30).f("rope_theta", 1e4), emptyIns, emptyOuts);
}

TEST_CASE("token ids out of range are rejected", "[kernels][errors]") {
  Tensor table = Tensor::f32({5, 2});
  CHECK(mustFail(K("embedding"), {Tensor::i32({1, 2}, {0, 5}), table},
                 {Tensor::f32({2, 2})}) ==
        "embedding: ids[1] = 5 is out of range [0, 5)");
  mustFail(K("embedding"), {Tensor::i32({1, 2}, {-1, 0}), table},
           {Tensor::f32({2, 2})});
  mustFail(K("embedding_grad").i("vocab", 5),
           {Tensor::i32({1, 2}, {0, 7}), Tensor::f32({2, 2})},
           {Tensor::f32({5, 2})});
  mustFail(K("cross_entropy"),
           {Tensor::f32({2, 3}), Tensor::i32({1, 2}, {0, 3})},
           {Tensor::f32({})});
  mustFail(K("cross_entropy_grad"),
           {Tensor::f32({2, 3}), Tensor::i32({1, 2}, {-2, 0})},
           {Tensor::f32({2, 3})});
}

TEST_CASE("bad attributes and context are rejected", "[kernels][errors]") {
  Tensor qkv = Tensor::f32({2, 6});
  CHECK(mustFail(K("attention").i("seq", 2), {qkv},
                 {Tensor::f32({2, 2}), Tensor::f32({2, 2})}) ==
        "attention: missing attribute 'heads'");
  mustFail(K("attention").i("heads", 0).i("seq", 2), {qkv},
           {Tensor::f32({2, 2}), Tensor::f32({2, 2})});
  mustFail(K("attention").s("heads", "one").i("seq", 2), {qkv},
           {Tensor::f32({2, 2}), Tensor::f32({2, 2})});
  mustFail(K("attention").f("heads", 1.5).i("seq", 2), {qkv},
           {Tensor::f32({2, 2}), Tensor::f32({2, 2})});
  mustFail(K("position_add"), {Tensor::f32({2, 2}), Tensor::f32({2, 2})},
           {Tensor::f32({2, 2})});
  mustFail(K("layer_norm").f("eps", -1.0),
           {Tensor::f32({1, 2}), Tensor::f32({2}), Tensor::f32({2})},
           {Tensor::f32({1, 2})});

  mustFail(K("loss_accumulate").f("scale", 1.0), {Tensor::f32({})}, {});
  mustFail(K("loss_accumulate"), {Tensor::f32({2})}, {});

  std::vector<Tensor> adamOuts = {Tensor::f32({2}), Tensor::f32({2}),
                                  Tensor::f32({2})};
  CHECK(mustFail(K("adamw"), {Tensor::f32({2})}, adamOuts) ==
        "adamw: missing attribute 'lr'");
  mustFail(K("adamw").f("lr", 0.1).f("beta2", 1.0), {Tensor::f32({2})},
           adamOuts);
  std::vector<Tensor> grad = {Tensor::f32({2})};
  KernelContext ctx;
  ctx.step = 0;
  Status s = run(K("adamw").f("lr", 0.1), grad, adamOuts, ctx);
  REQUIRE_FALSE(s.isOk());
  CHECK(s.message() == "adamw: step must be at least 1, got 0");
}

TEST_CASE("bad storage is rejected before any kernel runs",
          "[kernels][errors]") {
  KernelContext ctx;
  Tensor x = Tensor::f32({2, 2});
  TensorRef good = x.ref();
  TensorRef negative = good;
  negative.shape = {-2, -2};
  TensorRef missing = good;
  missing.data = nullptr;
  Status s = runKernel(K("gelu"), {negative}, {good}, ctx);
  REQUIRE_FALSE(s.isOk());
  CHECK(s.message().rfind("gelu: input 0 has negative dimension", 0) == 0);
  s = runKernel(K("gelu"), {good}, {missing}, ctx);
  REQUIRE_FALSE(s.isOk());
  CHECK(s.message() == "gelu: output 0 has no storage");
}

TEST_CASE("empty batches are handled without touching memory",
          "[kernels][errors]") {
  // Zero rows: linear and its gradients produce empty or zero results.
  std::vector<Tensor> ins = {Tensor::f32({0, 3}), Tensor::f32({3, 2})};
  std::vector<Tensor> outs = {Tensor::f32({0, 2})};
  mustRun(K("linear"), ins, outs);
  ins = {Tensor::f32({0, 3}), Tensor::f32({0, 2})};
  outs = {Tensor::f32({3, 2}, {1, 1, 1, 1, 1, 1})};
  mustRun(K("linear_grad_weight"), ins, outs);
  CHECK(outs[0].f == std::vector<float>(6, 0.0f));
  // The mean over zero rows is undefined.
  mustFail(K("cross_entropy"), {Tensor::f32({0, 3}), Tensor::i32({0, 1}, {})},
           {Tensor::f32({})});
}

// ---------------------------------------------------------------------------
// Mixture of experts: router, capacity slots, per-expert linear, aux loss.

namespace {

/// Softmax of one row, in double.
std::vector<double> refSoftmax(const float *row, int64_t n) {
  double rowMax = -1e300, sum = 0;
  for (int64_t e = 0; e < n; ++e)
    rowMax = std::max(rowMax, double(row[e]));
  std::vector<double> p(n);
  for (int64_t e = 0; e < n; ++e)
    sum += (p[e] = std::exp(double(row[e]) - rowMax));
  for (double &v : p)
    v /= sum;
  return p;
}

/// Top-k routing by sorting all experts on (p descending, index ascending).
void refRouter(const Tensor &logits, int64_t k, bool norm,
               std::vector<int32_t> &indices, std::vector<double> &weights) {
  const int64_t rows = logits.shape[0], experts = logits.shape[1];
  indices.clear();
  weights.clear();
  for (int64_t n = 0; n < rows; ++n) {
    std::vector<double> p = refSoftmax(logits.f.data() + n * experts, experts);
    std::vector<int32_t> order(experts);
    for (int32_t e = 0; e < experts; ++e)
      order[e] = e;
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return p[a] != p[b] ? p[a] > p[b] : a < b;
    });
    double sum = 0;
    for (int64_t j = 0; j < k; ++j)
      sum += p[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      indices.push_back(order[j]);
      weights.push_back(p[order[j]] / (norm ? sum : 1.0));
    }
  }
}

/// The capacity rule with a counter per expert: the buffer row of every
/// (n, j) in row-major order, or -1 when dropped.
std::vector<int64_t> refSlots(const std::vector<int32_t> &indices,
                              int64_t experts, int64_t capacity) {
  std::vector<int64_t> used(experts, 0), slots;
  for (int32_t e : indices)
    slots.push_back(used[e] < capacity ? e * capacity + used[e]++ : -1);
  return slots;
}

/// Logits whose rows are a permutation of 0, 0.3, 0.6, ... plus noise of at
/// most 0.05, so that a finite-difference step never changes the top-k.
Tensor separatedLogits(Rng &rng, int64_t rows, int64_t experts) {
  Tensor t = Tensor::f32({rows, experts});
  for (int64_t n = 0; n < rows; ++n) {
    std::vector<int64_t> rank(experts);
    for (int64_t e = 0; e < experts; ++e)
      rank[e] = e;
    for (int64_t e = experts - 1; e > 0; --e)
      std::swap(rank[e], rank[int64_t(rng.next() * (e + 1))]);
    for (int64_t e = 0; e < experts; ++e)
      t.f[n * experts + e] =
          float(0.3 * rank[e] - 1.0 + rng.uniform(-0.05, 0.05));
  }
  return t;
}

/// Random routing: k distinct experts per row.
Tensor randomIndices(Rng &rng, int64_t rows, int64_t k, int64_t experts) {
  std::vector<int32_t> ids;
  for (int64_t n = 0; n < rows; ++n) {
    std::vector<int32_t> all(experts);
    for (int32_t e = 0; e < experts; ++e)
      all[e] = e;
    for (int64_t j = 0; j < k; ++j) {
      std::swap(all[j], all[j + int64_t(rng.next() * (experts - j))]);
      ids.push_back(all[j]);
    }
  }
  return Tensor::i32({rows, k}, ids);
}

K routerKernel(const std::string &op, int64_t k, int64_t norm) {
  K kernel(op);
  kernel.i("top_k", k);
  if (norm >= 0) // -1: leave norm_topk at its default
    kernel.i("norm_topk", norm);
  return kernel;
}

K slotKernel(const std::string &op, int64_t experts, int64_t capacity) {
  return K(op).i("experts", experts).i("capacity", capacity);
}

} // namespace

TEST_CASE("moe_router picks the top_k probabilities, ties to the lower index",
          "[kernels][forward][moe]") {
  // Row 0: experts 1 and 3 tie for first. Row 1: p = [1, 0, 0] after
  // underflow, so experts 1 and 2 tie at 0 although their logits differ.
  std::vector<Tensor> ins = {
      Tensor::f32({2, 4}, {1, 3, 2, 3, 0, -2000, -1000, -3000})};
  std::vector<Tensor> outs = {Tensor::i32({2, 3}, {9, 9, 9, 9, 9, 9}),
                              Tensor::f32({2, 3}, {9, 9, 9, 9, 9, 9})};
  mustRun(routerKernel("moe_router", 3, -1), ins, outs);
  CHECK(outs[0].i == std::vector<int32_t>{1, 3, 2, 0, 1, 2});
  double z = std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0);
  double sel = 2 * std::exp(3.0) + std::exp(2.0);
  CHECK(outs[1].f[0] == Approx(std::exp(3.0) / sel));
  CHECK(outs[1].f[1] == Approx(std::exp(3.0) / sel));
  CHECK(outs[1].f[2] == Approx(std::exp(2.0) / sel));
  CHECK(outs[1].f[3] == 1.0f);
  CHECK(outs[1].f[4] == 0.0f);

  // norm_topk = 0 keeps the full-softmax probabilities.
  mustRun(routerKernel("moe_router", 3, 0), ins, outs);
  CHECK(outs[0].i == std::vector<int32_t>{1, 3, 2, 0, 1, 2});
  CHECK(outs[1].f[0] == Approx(std::exp(3.0) / z));
  CHECK(outs[1].f[2] == Approx(std::exp(2.0) / z));

  // top_1 with normalization: weight 1.
  std::vector<Tensor> one = {Tensor::i32({2, 1}, {9, 9}),
                             Tensor::f32({2, 1}, {9, 9})};
  mustRun(routerKernel("moe_router", 1, 1), ins, one);
  CHECK(one[0].i == std::vector<int32_t>{1, 0});
  CHECK(one[1].f == std::vector<float>{1, 1});
}

TEST_CASE("moe_router matches a sorting reference", "[kernels][forward][moe]") {
  const int64_t k = GENERATE(1, 2, 3, 6);
  const int64_t norm = GENERATE(0, 1);
  INFO("top_k=" << k << " norm_topk=" << norm);
  Rng rng(40 + k);
  const int64_t rows = 11, experts = 6;
  Tensor logits = randomF32(rng, {rows, experts}, -3.0, 3.0);
  for (int64_t i = 0; i < rows * experts; i += 3) // many exact ties
    logits.f[i] = std::round(logits.f[i]);
  for (int64_t i = 1; i < rows * experts; i += 3)
    logits.f[i] = std::round(logits.f[i]);
  std::vector<Tensor> ins = {logits};
  std::vector<Tensor> outs = {
      Tensor::i32({rows, k}, std::vector<int32_t>(rows * k)),
      Tensor::f32({rows, k})};
  mustRun(routerKernel("moe_router", k, norm), ins, outs);
  std::vector<int32_t> wantIdx;
  std::vector<double> wantW;
  refRouter(logits, k, norm == 1, wantIdx, wantW);
  CHECK(outs[0].i == wantIdx);
  for (int64_t i = 0; i < rows * k; ++i)
    CHECK(outs[1].f[i] == Approx(wantW[i]).margin(1e-6));
}

TEST_CASE("moe_dispatch fills slots in row-major order and drops overflow",
          "[kernels][forward][moe]") {
  // E = 3, C = 2. Row-major walk: (0,0)->e0 s0, (0,1)->e1 s0, (1,0)->e0 s1,
  // (1,1)->e2 s0, (2,0)->e0 dropped, (2,1)->e1 s1, (3,0)->e1 dropped,
  // (3,1)->e0 dropped. Slot 1 of expert 2 stays empty.
  Tensor x = Tensor::f32({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor indices = Tensor::i32({4, 2}, {0, 1, 0, 2, 0, 1, 1, 0});
  std::vector<Tensor> ins = {x, indices};
  std::vector<Tensor> outs = {Tensor::f32({6, 2})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f); // must be zeroed
  mustRun(slotKernel("moe_dispatch", 3, 2), ins, outs);
  CHECK(outs[0].f == std::vector<float>{1, 2, 3, 4,   // expert 0
                                        1, 2, 5, 6,   // expert 1
                                        3, 4, 0, 0}); // expert 2

  // combine: y[n] = sum of the weighted slots of n's kept assignments; the
  // dropped ones contribute nothing.
  Tensor ebuf = Tensor::f32({6, 2}, {1, 10, 2, 20, 3, 30, 4, 40, 5, 50, 6, 60});
  Tensor weights = Tensor::f32({4, 2}, {0.5, 0.25, 1, 2, 4, 8, 16, 32});
  std::vector<Tensor> cins = {ebuf, indices, weights};
  std::vector<Tensor> couts = {Tensor::f32({4, 2})};
  mustRun(slotKernel("moe_combine", 3, 2), cins, couts);
  CHECK(couts[0].f == std::vector<float>{0.5f * 1 + 0.25f * 3,
                                         0.5f * 10 + 0.25f * 30,         //
                                         1 * 2 + 2 * 5, 1 * 20 + 2 * 50, //
                                         8 * 4, 8 * 40,                  //
                                         0, 0});

  // With capacity N nothing is dropped.
  std::vector<Tensor> bigOuts = {Tensor::f32({12, 2})};
  mustRun(slotKernel("moe_dispatch", 3, 4), ins, bigOuts);
  CHECK(bigOuts[0].f == std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, //
                                           1, 2, 5, 6, 7, 8, 0, 0, //
                                           3, 4, 0, 0, 0, 0, 0, 0});
}

TEST_CASE("moe_dispatch, moe_combine and their gradients match a "
          "counter-per-expert reference",
          "[kernels][forward][moe]") {
  const int64_t capacity = GENERATE(1, 3, 5, 16);
  INFO("capacity=" << capacity);
  Rng rng(50 + capacity);
  const int64_t rows = 8, k = 2, experts = 4, hidden = 3;
  const int64_t slots = experts * capacity;
  Tensor x = randomF32(rng, {rows, hidden});
  Tensor indices = randomIndices(rng, rows, k, experts);
  Tensor weights = randomF32(rng, {rows, k}, 0.0, 1.0);
  Tensor ebuf = randomF32(rng, {slots, hidden});
  Tensor dy = randomF32(rng, {rows, hidden});
  std::vector<int64_t> slot = refSlots(indices.i, experts, capacity);

  std::vector<Tensor> ins = {x, indices};
  std::vector<Tensor> outs = {Tensor::f32({slots, hidden})};
  mustRun(slotKernel("moe_dispatch", experts, capacity), ins, outs);
  std::vector<float> wantBuf(slots * hidden, 0.0f);
  for (int64_t a = 0; a < rows * k; ++a)
    if (slot[a] >= 0)
      for (int64_t h = 0; h < hidden; ++h)
        wantBuf[slot[a] * hidden + h] = x.f[(a / k) * hidden + h];
  CHECK(outs[0].f == wantBuf);

  ins = {indices, ebuf};
  outs = {Tensor::f32({rows, hidden})};
  mustRun(slotKernel("moe_dispatch_grad", experts, capacity), ins, outs);
  std::vector<double> wantDx(rows * hidden, 0.0);
  for (int64_t a = 0; a < rows * k; ++a)
    if (slot[a] >= 0)
      for (int64_t h = 0; h < hidden; ++h)
        wantDx[(a / k) * hidden + h] += ebuf.f[slot[a] * hidden + h];
  for (int64_t i = 0; i < rows * hidden; ++i)
    CHECK(outs[0].f[i] == Approx(wantDx[i]).margin(1e-6));

  ins = {ebuf, indices, weights};
  outs = {Tensor::f32({rows, hidden})};
  mustRun(slotKernel("moe_combine", experts, capacity), ins, outs);
  std::vector<double> wantY(rows * hidden, 0.0);
  for (int64_t a = 0; a < rows * k; ++a)
    if (slot[a] >= 0)
      for (int64_t h = 0; h < hidden; ++h)
        wantY[(a / k) * hidden + h] +=
            double(weights.f[a]) * ebuf.f[slot[a] * hidden + h];
  for (int64_t i = 0; i < rows * hidden; ++i)
    CHECK(outs[0].f[i] == Approx(wantY[i]).margin(1e-6));

  ins = {ebuf, indices, weights, dy};
  outs = {Tensor::f32({slots, hidden}), Tensor::f32({rows, k})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f);
  std::fill(outs[1].f.begin(), outs[1].f.end(), 9.0f);
  mustRun(slotKernel("moe_combine_grad", experts, capacity), ins, outs);
  std::vector<double> wantDebuf(slots * hidden, 0.0), wantDw(rows * k, 0.0);
  for (int64_t a = 0; a < rows * k; ++a)
    if (slot[a] >= 0)
      for (int64_t h = 0; h < hidden; ++h) {
        wantDebuf[slot[a] * hidden + h] =
            double(weights.f[a]) * dy.f[(a / k) * hidden + h];
        wantDw[a] +=
            double(ebuf.f[slot[a] * hidden + h]) * dy.f[(a / k) * hidden + h];
      }
  for (int64_t i = 0; i < slots * hidden; ++i)
    CHECK(outs[0].f[i] == Approx(wantDebuf[i]).margin(1e-6));
  for (int64_t a = 0; a < rows * k; ++a) {
    CHECK(outs[1].f[a] == Approx(wantDw[a]).margin(1e-6));
    if (slot[a] < 0)
      CHECK(outs[1].f[a] == 0.0f);
  }
}

TEST_CASE("expert_linear multiplies each expert's slots by its weight",
          "[kernels][forward][moe]") {
  Rng rng(60);
  const int64_t experts = 3, capacity = 4, in = 5, out = 2;
  Tensor buf = randomF32(rng, {experts * capacity, in});
  Tensor w = randomF32(rng, {experts, in, out});
  std::vector<Tensor> ins = {buf, w};
  std::vector<Tensor> outs = {Tensor::f32({experts * capacity, out})};
  mustRun(K("expert_linear").i("experts", experts), ins, outs);
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t c = 0; c < capacity; ++c)
      for (int64_t m = 0; m < out; ++m) {
        double want = 0;
        for (int64_t j = 0; j < in; ++j)
          want += double(buf.f[(e * capacity + c) * in + j]) *
                  w.f[(e * in + j) * out + m];
        CHECK(outs[0].f[(e * capacity + c) * out + m] ==
              Approx(want).margin(1e-5));
      }
}

TEST_CASE("moe_aux_loss is E * sum_e f_e P_e", "[kernels][forward][moe]") {
  SECTION("perfectly uniform routing gives 1") {
    // Equal logits: P_e = 1/4. Each expert chosen twice out of N k = 8.
    std::vector<Tensor> ins = {Tensor::f32({4, 4}),
                               Tensor::i32({4, 2}, {0, 1, 2, 3, 3, 0, 1, 2})};
    std::fill(ins[0].f.begin(), ins[0].f.end(), 0.7f);
    std::vector<Tensor> outs = {Tensor::f32({})};
    mustRun(K("moe_aux_loss").i("experts", 4).i("top_k", 2), ins, outs);
    CHECK(outs[0].f[0] == Approx(1.0));
  }
  SECTION("collapsed routing approaches E") {
    std::vector<Tensor> ins = {Tensor::f32({2, 4}, {50, 0, 0, 0, 60, 1, 2, 3}),
                               Tensor::i32({2, 1}, {0, 0})};
    std::vector<Tensor> outs = {Tensor::f32({1})};
    mustRun(K("moe_aux_loss").i("experts", 4).i("top_k", 1), ins, outs);
    CHECK(outs[0].f[0] == Approx(4.0).epsilon(1e-6));
  }
  SECTION("random routing matches a direct evaluation") {
    Rng rng(61);
    const int64_t rows = 7, experts = 5, k = 2;
    Tensor logits = randomF32(rng, {rows, experts}, -2.0, 2.0);
    Tensor indices = randomIndices(rng, rows, k, experts);
    std::vector<Tensor> ins = {logits, indices};
    std::vector<Tensor> outs = {Tensor::f32({})};
    mustRun(K("moe_aux_loss").i("experts", experts).i("top_k", k), ins, outs);
    std::vector<double> f(experts, 0.0), P(experts, 0.0);
    for (int32_t e : indices.i)
      f[e] += 1.0 / (rows * k);
    for (int64_t n = 0; n < rows; ++n) {
      std::vector<double> p =
          refSoftmax(logits.f.data() + n * experts, experts);
      for (int64_t e = 0; e < experts; ++e)
        P[e] += p[e] / rows;
    }
    double want = 0;
    for (int64_t e = 0; e < experts; ++e)
      want += experts * f[e] * P[e];
    CHECK(outs[0].f[0] == Approx(want).epsilon(1e-6));
  }
}

TEST_CASE("router, dispatch, expert_linear and combine compose into a MoE "
          "layer",
          "[kernels][forward][moe]") {
  const int64_t capacity = GENERATE(2, 6);
  INFO("capacity=" << capacity);
  Rng rng(62);
  const int64_t rows = 6, experts = 4, k = 2, hidden = 3, out = 2;
  const int64_t slots = experts * capacity;
  Tensor x = randomF32(rng, {rows, hidden});
  Tensor logits = randomF32(rng, {rows, experts}, -2.0, 2.0);
  Tensor w = randomF32(rng, {experts, hidden, out});

  std::vector<Tensor> ins = {logits};
  std::vector<Tensor> route = {
      Tensor::i32({rows, k}, std::vector<int32_t>(rows * k)),
      Tensor::f32({rows, k})};
  mustRun(routerKernel("moe_router", k, 1), ins, route);
  ins = {x, route[0]};
  std::vector<Tensor> buf = {Tensor::f32({slots, hidden})};
  mustRun(slotKernel("moe_dispatch", experts, capacity), ins, buf);
  ins = {buf[0], w};
  std::vector<Tensor> ebuf = {Tensor::f32({slots, out})};
  mustRun(K("expert_linear").i("experts", experts), ins, ebuf);
  ins = {ebuf[0], route[0], route[1]};
  std::vector<Tensor> y = {Tensor::f32({rows, out})};
  mustRun(slotKernel("moe_combine", experts, capacity), ins, y);

  // Per token: the weighted outputs of its kept experts, directly.
  std::vector<int64_t> slot = refSlots(route[0].i, experts, capacity);
  int64_t dropped = 0;
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t m = 0; m < out; ++m) {
      double want = 0;
      for (int64_t j = 0; j < k; ++j) {
        if (slot[n * k + j] < 0) {
          dropped += m == 0;
          continue;
        }
        int32_t e = route[0].i[n * k + j];
        double dot = 0;
        for (int64_t h = 0; h < hidden; ++h)
          dot += double(x.f[n * hidden + h]) * w.f[(e * hidden + h) * out + m];
        want += route[1].f[n * k + j] * dot;
      }
      CHECK(y[0].f[n * out + m] == Approx(want).margin(1e-5));
    }
  CHECK((dropped > 0) == (capacity < rows));
}

TEST_CASE("moe_router_grad is the gradient of the router weights",
          "[kernels][grad][moe]") {
  const int64_t k = GENERATE(1, 2, 3);
  const int64_t norm = GENERATE(0, 1);
  INFO("top_k=" << k << " norm_topk=" << norm);
  Rng rng(70 + k);
  const int64_t rows = 4, experts = 5;
  Tensor logits = separatedLogits(rng, rows, experts);
  std::vector<float> r = rng.vec(rows * k);
  K forward = routerKernel("moe_router", k, norm);

  std::vector<Tensor> ins = {logits};
  std::vector<Tensor> fwdOuts = {
      Tensor::i32({rows, k}, std::vector<int32_t>(rows * k)),
      Tensor::f32({rows, k})};
  mustRun(forward, ins, fwdOuts);

  ins = {logits, fwdOuts[0], Tensor::f32({rows, k}, r)};
  std::vector<Tensor> outs = {Tensor::f32({rows, experts})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f); // must be overwritten
  mustRun(routerKernel("moe_router_grad", k, norm), ins, outs);
  if (k == 1 && norm == 1) // the weight is the constant 1
    CHECK(outs[0].f == std::vector<float>(rows * experts, 0.0f));
  else
    requireNonZero(outs[0].f);
  for (int64_t n = 0; n < rows; ++n) {
    double rowSum = 0; // softmax gradients sum to 0 over a row
    for (int64_t e = 0; e < experts; ++e)
      rowSum += outs[0].f[n * experts + e];
    CHECK(rowSum == Approx(0.0).margin(1e-6));
  }
  checkGradientOf(forward, {logits}, 0, fwdOuts, 1, r, outs[0].f);
}

TEST_CASE("moe_router_grad defaults to norm_topk = 1", "[kernels][grad][moe]") {
  Rng rng(75);
  Tensor logits = separatedLogits(rng, 3, 4);
  Tensor indices = randomIndices(rng, 3, 2, 4);
  Tensor dw = randomF32(rng, {3, 2});
  std::vector<Tensor> ins = {logits, indices, dw};
  std::vector<Tensor> plain = {Tensor::f32({3, 4})};
  std::vector<Tensor> explicitOut = {Tensor::f32({3, 4})};
  mustRun(routerKernel("moe_router_grad", 2, -1), ins, plain);
  mustRun(routerKernel("moe_router_grad", 2, 1), ins, explicitOut);
  CHECK(plain[0].f == explicitOut[0].f);
}

TEST_CASE("moe_dispatch_grad is the gradient of moe_dispatch",
          "[kernels][grad][moe]") {
  Rng rng(76);
  const int64_t rows = 6, k = 2, experts = 3, capacity = 3, hidden = 4;
  const int64_t slots = experts * capacity; // 9 slots for 12 assignments
  Tensor x = randomF32(rng, {rows, hidden});
  Tensor indices = randomIndices(rng, rows, k, experts);
  std::vector<float> r = rng.vec(slots * hidden);
  K forward = slotKernel("moe_dispatch", experts, capacity);

  std::vector<Tensor> ins = {indices, Tensor::f32({slots, hidden}, r)};
  std::vector<Tensor> outs = {Tensor::f32({rows, hidden})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f);
  mustRun(slotKernel("moe_dispatch_grad", experts, capacity), ins, outs);
  requireNonZero(outs[0].f);
  checkGradient(forward, {x, indices}, 0, {slots, hidden}, r, outs[0].f);
}

TEST_CASE("moe_combine_grad is the gradient of moe_combine",
          "[kernels][grad][moe]") {
  Rng rng(77);
  const int64_t rows = 6, k = 2, experts = 4, capacity = 2, hidden = 3;
  const int64_t slots = experts * capacity; // 8 slots for 12 assignments
  Tensor indices = randomIndices(rng, rows, k, experts);
  std::vector<int64_t> slot = refSlots(indices.i, experts, capacity);
  REQUIRE(std::count(slot.begin(), slot.end(), -1) >= 4);
  Tensor ebuf = randomF32(rng, {slots, hidden});
  Tensor weights = randomF32(rng, {rows, k}, 0.0, 1.0);
  std::vector<float> r = rng.vec(rows * hidden);
  K forward = slotKernel("moe_combine", experts, capacity);

  std::vector<Tensor> ins = {ebuf, indices, weights,
                             Tensor::f32({rows, hidden}, r)};
  std::vector<Tensor> outs = {Tensor::f32({slots, hidden}),
                              Tensor::f32({rows, k})};
  std::fill(outs[0].f.begin(), outs[0].f.end(), 9.0f);
  std::fill(outs[1].f.begin(), outs[1].f.end(), 9.0f);
  mustRun(slotKernel("moe_combine_grad", experts, capacity), ins, outs);
  for (const Tensor &g : outs)
    requireNonZero(g.f);
  for (int64_t a = 0; a < rows * k; ++a)
    if (slot[a] < 0)
      CHECK(outs[1].f[a] == 0.0f);
  checkGradient(forward, {ebuf, indices, weights}, 0, {rows, hidden}, r,
                outs[0].f);
  checkGradient(forward, {ebuf, indices, weights}, 2, {rows, hidden}, r,
                outs[1].f);
}

TEST_CASE("expert_linear gradients", "[kernels][grad][moe]") {
  Rng rng(78);
  const int64_t experts = 3, capacity = 2, in = 4, out = 3;
  const int64_t rows = experts * capacity;
  Tensor buf = randomF32(rng, {rows, in});
  Tensor w = randomF32(rng, {experts, in, out});
  std::vector<float> r = rng.vec(rows * out);
  Tensor dy = Tensor::f32({rows, out}, r);
  K forward = K("expert_linear").i("experts", experts);

  std::vector<Tensor> ins = {dy, w};
  std::vector<Tensor> outs = {Tensor::f32({rows, in})};
  mustRun(K("expert_linear_grad_input").i("experts", experts), ins, outs);
  requireNonZero(outs[0].f);
  checkGradient(forward, {buf, w}, 0, {rows, out}, r, outs[0].f);
  // `experts` is optional in the gradients: w's first dimension.
  std::vector<Tensor> noAttr = {Tensor::f32({rows, in})};
  mustRun(K("expert_linear_grad_input"), ins, noAttr);
  CHECK(noAttr[0].f == outs[0].f);

  ins = {buf, dy};
  outs = {Tensor::f32({experts, in, out})};
  mustRun(K("expert_linear_grad_weight").i("experts", experts), ins, outs);
  requireNonZero(outs[0].f);
  checkGradient(forward, {buf, w}, 1, {rows, out}, r, outs[0].f);
  noAttr = {Tensor::f32({experts, in, out})};
  mustRun(K("expert_linear_grad_weight"), ins, noAttr);
  CHECK(noAttr[0].f == outs[0].f);
}

TEST_CASE("moe_aux_loss_grad is the gradient of scale * moe_aux_loss",
          "[kernels][grad][moe]") {
  Rng rng(79);
  const int64_t rows = 5, experts = 4, k = 2;
  Tensor logits = randomF32(rng, {rows, experts}, -2.0, 2.0);
  Tensor indices = randomIndices(rng, rows, k, experts);
  const double scale = 2.5;
  K forward = K("moe_aux_loss").i("experts", experts).i("top_k", k);

  std::vector<Tensor> ins = {logits, indices};
  std::vector<Tensor> outs = {Tensor::f32({rows, experts})};
  mustRun(K("moe_aux_loss_grad")
              .i("experts", experts)
              .i("top_k", k)
              .f("scale", scale),
          ins, outs);
  requireNonZero(outs[0].f);
  for (int64_t n = 0; n < rows; ++n) {
    double rowSum = 0;
    for (int64_t e = 0; e < experts; ++e)
      rowSum += outs[0].f[n * experts + e];
    CHECK(rowSum == Approx(0.0).margin(1e-6));
  }
  checkGradient(forward, {logits, indices}, 0, {}, {float(scale)}, outs[0].f);

  // The default scale is 1.
  std::vector<Tensor> unit = {Tensor::f32({rows, experts})};
  mustRun(K("moe_aux_loss_grad").i("experts", experts).i("top_k", k), ins,
          unit);
  for (int64_t i = 0; i < rows * experts; ++i)
    CHECK(unit[0].f[i] * scale == Approx(outs[0].f[i]).margin(1e-7));
}

TEST_CASE("MoE kernels reject bad operands and attributes",
          "[kernels][errors][moe]") {
  Tensor logits = Tensor::f32({2, 4});
  auto routerOuts = [](int64_t rows, int64_t k) {
    return std::vector<Tensor>{
        Tensor::i32({rows, k}, std::vector<int32_t>(rows * k)),
        Tensor::f32({rows, k})};
  };
  CHECK(mustFail(K("moe_router"), {logits}, routerOuts(2, 2)) ==
        "moe_router: missing attribute 'top_k'");
  CHECK(
      mustFail(routerKernel("moe_router", 0, 1), {logits}, routerOuts(2, 0)) ==
      "moe_router: attribute 'top_k' must be positive, got 0");
  CHECK(
      mustFail(routerKernel("moe_router", 5, 1), {logits}, routerOuts(2, 5)) ==
      "moe_router: attribute 'top_k' 5 exceeds the number of experts 4");
  CHECK(
      mustFail(routerKernel("moe_router", 2, 2), {logits}, routerOuts(2, 2)) ==
      "moe_router: attribute 'norm_topk' must be 0 or 1, got 2");
  CHECK(
      mustFail(routerKernel("moe_router", 2, 1), {logits}, routerOuts(2, 3)) ==
      "moe_router: indices has shape [2,3], expected [2,2]");
  CHECK(mustFail(routerKernel("moe_router", 2, 1), {logits},
                 {Tensor::f32({2, 2}), Tensor::f32({2, 2})}) ==
        "moe_router: indices must be i32, got f32");
  mustFail(routerKernel("moe_router", 2, 1), {logits},
           {routerOuts(2, 2)[0], Tensor::f32({2, 3})});
  mustFail(routerKernel("moe_router", 2, 1), {Tensor::f32({8})},
           routerOuts(2, 2));
  mustFail(routerKernel("moe_router", 1, 1), {Tensor::f32({2, 0})},
           routerOuts(2, 1));

  Tensor idx = Tensor::i32({2, 2}, {0, 3, 1, 4});
  CHECK(mustFail(routerKernel("moe_router_grad", 2, 1),
                 {logits, idx, Tensor::f32({2, 2})}, {Tensor::f32({2, 4})}) ==
        "moe_router_grad: indices[3] = 4 is out of range [0, 4)");
  Tensor okIdx = Tensor::i32({2, 2}, {0, 3, 1, 2});
  mustFail(routerKernel("moe_router_grad", 2, 1),
           {logits, okIdx, Tensor::f32({2, 3})}, {Tensor::f32({2, 4})});
  mustFail(routerKernel("moe_router_grad", 2, 1),
           {logits, okIdx, Tensor::f32({2, 2})}, {Tensor::f32({2, 3})});
  mustFail(routerKernel("moe_router_grad", 3, 1),
           {logits, okIdx, Tensor::f32({2, 2})}, {Tensor::f32({2, 4})});

  // Dispatch family: E = 3, C = 2, so slot buffers have 6 rows.
  Tensor x = Tensor::f32({2, 2});
  CHECK(mustFail(K("moe_dispatch").i("experts", 3), {x, okIdx},
                 {Tensor::f32({6, 2})}) ==
        "moe_dispatch: missing attribute 'capacity'");
  CHECK(mustFail(slotKernel("moe_dispatch", 3, 0), {x, okIdx},
                 {Tensor::f32({0, 2})}) ==
        "moe_dispatch: attribute 'capacity' must be positive, got 0");
  CHECK(mustFail(slotKernel("moe_dispatch", 3, 2), {x, okIdx},
                 {Tensor::f32({5, 2})}) ==
        "moe_dispatch: buf has shape [5,2], expected [6,*] (experts 3 * "
        "capacity 2)");
  CHECK(mustFail(slotKernel("moe_dispatch", 3, 2), {x, okIdx},
                 {Tensor::f32({6, 2})}) ==
        "moe_dispatch: indices[1] = 3 is out of range [0, 3)");
  mustFail(slotKernel("moe_dispatch", 3, 2),
           {x, Tensor::i32({2, 2}, {0, -1, 1, 2})}, {Tensor::f32({6, 2})});
  mustFail(slotKernel("moe_dispatch", 4, 2), {Tensor::f32({3, 2}), okIdx},
           {Tensor::f32({8, 2})});
  mustFail(slotKernel("moe_dispatch", 4, 2), {x, Tensor::f32({2, 2})},
           {Tensor::f32({8, 2})});
  mustFail(slotKernel("moe_dispatch", 4, 2),
           {x, Tensor::i32({4}, {0, 1, 2, 3})}, {Tensor::f32({8, 2})});
  CHECK(mustFail(slotKernel("moe_dispatch", int64_t(1) << 40, int64_t(1) << 40),
                 {x, okIdx}, {Tensor::f32({6, 2})}) ==
        "moe_dispatch: attributes 'experts' * 'capacity' overflow");
  mustFail(slotKernel("moe_dispatch_grad", 4, 2), {okIdx, Tensor::f32({8, 2})},
           {Tensor::f32({2, 3})});
  mustFail(slotKernel("moe_dispatch_grad", 4, 2), {okIdx, Tensor::f32({6, 2})},
           {Tensor::f32({2, 2})});

  Tensor ebuf = Tensor::f32({8, 2}), w = Tensor::f32({2, 2});
  CHECK(mustFail(slotKernel("moe_combine", 4, 2),
                 {ebuf, okIdx, Tensor::f32({2, 1})}, {Tensor::f32({2, 2})}) ==
        "moe_combine: weights has shape [2,1], expected [2,2]");
  mustFail(slotKernel("moe_combine", 4, 2), {Tensor::f32({6, 2}), okIdx, w},
           {Tensor::f32({2, 2})});
  mustFail(slotKernel("moe_combine", 4, 2), {ebuf, okIdx, w},
           {Tensor::f32({2, 3})});
  mustFail(slotKernel("moe_combine", 3, 2), {Tensor::f32({6, 2}), okIdx, w},
           {Tensor::f32({2, 2})});
  mustFail(slotKernel("moe_combine_grad", 4, 2),
           {ebuf, okIdx, w, Tensor::f32({2, 2})},
           {Tensor::f32({8, 3}), Tensor::f32({2, 2})});
  mustFail(slotKernel("moe_combine_grad", 4, 2),
           {ebuf, okIdx, w, Tensor::f32({2, 2})},
           {Tensor::f32({8, 2}), Tensor::f32({2, 1})});
  mustFail(slotKernel("moe_combine_grad", 4, 2),
           {ebuf, okIdx, w, Tensor::f32({3, 2})},
           {Tensor::f32({8, 2}), Tensor::f32({2, 2})});

  // expert_linear: buf [E*C,K], w [E,K,M].
  Tensor buf = Tensor::f32({6, 3}), ew = Tensor::f32({2, 3, 4});
  CHECK(mustFail(K("expert_linear"), {buf, ew}, {Tensor::f32({6, 4})}) ==
        "expert_linear: missing attribute 'experts'");
  CHECK(mustFail(K("expert_linear").i("experts", 3), {buf, ew},
                 {Tensor::f32({6, 4})}) ==
        "expert_linear: attribute 'experts' is 3 but w has 2 experts");
  CHECK(mustFail(K("expert_linear").i("experts", 2), {Tensor::f32({5, 3}), ew},
                 {Tensor::f32({5, 4})}) ==
        "expert_linear: buf has shape [5,3], rows not a multiple of experts 2");
  CHECK(mustFail(K("expert_linear").i("experts", 2), {Tensor::f32({6, 2}), ew},
                 {Tensor::f32({6, 4})}) ==
        "expert_linear: w has shape [2,3,4], expected [2,2,*]");
  mustFail(K("expert_linear").i("experts", 2), {buf, Tensor::f32({6, 4})},
           {Tensor::f32({6, 4})});
  mustFail(K("expert_linear").i("experts", 2), {buf, ew},
           {Tensor::f32({6, 3})});
  mustFail(K("expert_linear_grad_input"), {Tensor::f32({6, 3}), ew},
           {Tensor::f32({6, 3})});
  mustFail(K("expert_linear_grad_input").i("experts", 3),
           {Tensor::f32({6, 4}), ew}, {Tensor::f32({6, 3})});
  mustFail(K("expert_linear_grad_input"), {Tensor::f32({6, 4}), ew},
           {Tensor::f32({6, 4})});
  mustFail(K("expert_linear_grad_weight"), {buf, Tensor::f32({5, 4})},
           {Tensor::f32({2, 3, 4})});
  mustFail(K("expert_linear_grad_weight"), {buf, Tensor::f32({6, 4})},
           {Tensor::f32({2, 4, 4})});
  mustFail(K("expert_linear_grad_weight").i("experts", 3),
           {buf, Tensor::f32({6, 4})}, {Tensor::f32({2, 3, 4})});
  mustFail(K("expert_linear_grad_weight"), {buf, Tensor::f32({6, 4})},
           {Tensor::f32({12, 4})});

  // moe_aux_loss: logits [N,E], indices [N,k].
  K aux = K("moe_aux_loss").i("experts", 4).i("top_k", 2);
  CHECK(mustFail(K("moe_aux_loss").i("experts", 5).i("top_k", 2),
                 {logits, okIdx}, {Tensor::f32({})}) ==
        "moe_aux_loss: attribute 'experts' is 5 but logits has 4 columns");
  CHECK(mustFail(K("moe_aux_loss").i("experts", 4).i("top_k", 1),
                 {logits, okIdx}, {Tensor::f32({})}) ==
        "moe_aux_loss: indices has shape [2,2], expected [2,1]");
  mustFail(K("moe_aux_loss").i("experts", 4), {logits, okIdx},
           {Tensor::f32({})});
  mustFail(K("moe_aux_loss").i("experts", 4).i("top_k", 5),
           {logits, Tensor::i32({2, 5}, std::vector<int32_t>(10))},
           {Tensor::f32({})});
  CHECK(mustFail(aux, {Tensor::f32({0, 4}), Tensor::i32({0, 2}, {})},
                 {Tensor::f32({})}) ==
        "moe_aux_loss: logits has shape [0,4], expected at least one row");
  mustFail(aux, {logits, idx}, {Tensor::f32({})});
  mustFail(aux, {logits, okIdx}, {Tensor::f32({2})});
  mustFail(K("moe_aux_loss_grad").i("experts", 4).i("top_k", 2),
           {logits, okIdx}, {Tensor::f32({2, 3})});
  mustFail(K("moe_aux_loss_grad")
               .i("experts", 4)
               .i("top_k", 2)
               .f("scale", std::nan("")),
           {logits, okIdx}, {Tensor::f32({2, 4})});
}

TEST_CASE("MoE kernels handle empty batches and huge expert counts cheaply",
          "[kernels][errors][moe]") {
  // No tokens: every slot is unused.
  std::vector<Tensor> ins = {Tensor::f32({0, 2}), Tensor::i32({0, 2}, {})};
  std::vector<Tensor> outs = {Tensor::f32({4, 2}, {1, 1, 1, 1, 1, 1, 1, 1})};
  mustRun(slotKernel("moe_dispatch", 2, 2), ins, outs);
  CHECK(outs[0].f == std::vector<float>(8, 0.0f));
  ins = {Tensor::f32({0, 3})};
  std::vector<Tensor> route = {Tensor::i32({0, 2}, {}), Tensor::f32({0, 2})};
  mustRun(routerKernel("moe_router", 2, 1), ins, route);

  // Zero slots per expert: the weight gradient is zero.
  ins = {Tensor::f32({0, 3}), Tensor::f32({0, 2})};
  outs = {Tensor::f32({2, 3, 2}, std::vector<float>(12, 5.0f))};
  mustRun(K("expert_linear_grad_weight").i("experts", 2), ins, outs);
  CHECK(outs[0].f == std::vector<float>(12, 0.0f));

  // 2^40 experts with zero-width buffers: no per-expert table or loop.
  const int64_t huge = int64_t(1) << 40;
  ins = {Tensor::f32({2, 0}), Tensor::i32({2, 1}, {7, 7})};
  outs = {Tensor::f32({huge, 0})};
  mustRun(slotKernel("moe_dispatch", huge, 1), ins, outs);
  outs = {Tensor::f32({huge, 0})};
  ins = {Tensor::f32({huge, 0}), Tensor::f32({huge, 0, 0})};
  mustRun(K("expert_linear").i("experts", huge), ins, outs);
}

TEST_CASE("expert parallelism: counts, pack, gather and their inverses move "
          "every member's slots to the member owning the expert",
          "[kernels][moe][ep]") {
  const int64_t members = GENERATE(1, 2, 4);
  const int64_t capacity = GENERATE(1, 3, 8);
  INFO("members=" << members << " capacity=" << capacity);
  const int64_t experts = 4, local = experts / members, rows = 6, k = 2,
                hidden = 3, slots = experts * capacity;
  Rng rng(90 + members * 10 + capacity);
  auto ep = [&](const std::string &op) {
    return slotKernel(op, experts, capacity).i("members", members);
  };
  // Each member dispatches its own tokens, counts and packs them.
  std::vector<Tensor> buf, packed, counts, sends;
  for (int64_t m = 0; m < members; ++m) {
    std::vector<Tensor> in = {randomF32(rng, {rows, hidden}),
                              randomIndices(rng, rows, k, experts)};
    std::vector<Tensor> b = {Tensor::f32({slots, hidden})};
    mustRun(slotKernel("moe_dispatch", experts, capacity), in, b);
    std::vector<Tensor> cin = {in[1]};
    std::vector<Tensor> c = {
        Tensor::i32({members}, std::vector<int32_t>(members)),
        Tensor::i32({experts, 1}, std::vector<int32_t>(experts)),
        Tensor::i32({members}, std::vector<int32_t>(members))};
    mustRun(ep("moe_ep_counts"), cin, c);
    // The counts are the rows dispatch filled: expert e's used slots.
    for (int64_t e = 0; e < experts; ++e) {
      int64_t used = 0;
      for (int64_t s = 0; s < capacity; ++s)
        for (int64_t h = 0; h < hidden; ++h)
          used = b[0].f[(e * capacity + s) * hidden + h] != 0 ? s + 1 : used;
      CHECK(c[1].i[e] == used);
    }
    for (int64_t j = 0; j < members; ++j) {
      int64_t sum = 0;
      for (int64_t e = j * local; e < (j + 1) * local; ++e)
        sum += c[1].i[e];
      CHECK(c[0].i[j] == sum);
      CHECK(c[2].i[j] == local);
    }
    std::vector<Tensor> pin = {b[0], c[1]};
    std::vector<Tensor> p = {Tensor::f32({slots, hidden})};
    mustRun(slotKernel("moe_ep_pack", experts, capacity), pin, p);
    // unpack(pack(x)) restores the dispatch buffer exactly.
    std::vector<Tensor> uin = {p[0], c[1]};
    std::vector<Tensor> u = {Tensor::f32({slots, hidden})};
    mustRun(slotKernel("moe_ep_unpack", experts, capacity), uin, u);
    CHECK(u[0].f == b[0].f);
    buf.push_back(b[0]);
    packed.push_back(p[0]);
    counts.push_back(c[1]);
    sends.push_back(c[0]);
  }
  // The all-to-alls, by hand: member j receives, from each source in order,
  // that source's rows for j's experts and their L counts.
  for (int64_t j = 0; j < members; ++j) {
    Tensor recv = Tensor::f32({slots, hidden});
    std::vector<int32_t> recvCounts;
    int64_t at = 0;
    for (int64_t src = 0; src < members; ++src) {
      int64_t offset = 0;
      for (int64_t d = 0; d < j; ++d)
        offset += sends[src].i[d];
      std::copy_n(packed[src].f.begin() + offset * hidden,
                  sends[src].i[j] * hidden, recv.f.begin() + at * hidden);
      at += sends[src].i[j];
      for (int64_t l = 0; l < local; ++l)
        recvCounts.push_back(counts[src].i[j * local + l]);
    }
    Tensor rc = Tensor::i32({experts, 1}, recvCounts);
    std::vector<Tensor> gin = {recv, rc};
    std::vector<Tensor> g = {Tensor::f32({slots, hidden})};
    mustRun(ep("moe_ep_gather"), gin, g);
    // Local expert l's slots: every source's used rows of expert j*L+l, in
    // source order, then zeros.
    for (int64_t l = 0; l < local; ++l) {
      std::vector<float> want;
      for (int64_t src = 0; src < members; ++src) {
        int64_t e = j * local + l;
        auto first = buf[src].f.begin() + e * capacity * hidden;
        want.insert(want.end(), first, first + counts[src].i[e] * hidden);
      }
      want.resize(members * capacity * hidden, 0.0f);
      auto first = g[0].f.begin() + l * members * capacity * hidden;
      CHECK(std::vector<float>(first, first + want.size()) == want);
    }
    // scatter(gather(recv)) == recv.
    std::vector<Tensor> sin = {g[0], rc};
    std::vector<Tensor> sc = {Tensor::f32({slots, hidden})};
    mustRun(ep("moe_ep_scatter"), sin, sc);
    CHECK(sc[0].f == recv.f);
  }
}

TEST_CASE("expert parallelism kernels reject bad counts and layouts",
          "[kernels][moe][ep]") {
  Tensor x = Tensor::f32({8, 2});
  Tensor over = Tensor::i32({4, 1}, {1, 3, 0, 0});
  CHECK(mustFail(slotKernel("moe_ep_pack", 4, 2), {x, over},
                 {Tensor::f32({8, 2})})
            .find("expert_counts[1] is 3, outside [0, capacity 2]") !=
        std::string::npos);
  Tensor ok = Tensor::i32({4, 1}, {1, 2, 0, 0});
  CHECK(mustFail(slotKernel("moe_ep_gather", 4, 2).i("members", 3), {x, ok},
                 {Tensor::f32({8, 2})})
            .find("'members' 3 does not divide 'experts' 4") !=
        std::string::npos);
  CHECK(mustFail(slotKernel("moe_ep_unpack", 4, 2), {Tensor::f32({6, 2}), ok},
                 {Tensor::f32({8, 2})})
            .find("expected [8,*]") != std::string::npos);
}

TEST_CASE("Llama 3.1's rotary frequencies in their three ranges",
          "[kernels][rope]") {
  // theta 10000, head dim 8: f_i = 10000^(-i/4) = 1, 0.1, 0.01, 0.001,
  // wavelengths 2 pi / f_i = 6.28, 62.8, 628, 6283. With an original
  // context of 1000, low 1 and high 4: w < 250 keeps f, w > 1000 divides
  // it by the factor 8, between interpolates with s = (1000 / w - 1) / 3.
  const RopeScaling s{8.0, 1.0, 4.0, 1000.0};
  const double pi = 3.14159265358979323846;
  CHECK(ropeFrequency(10000.0, 8, 0, s) == 1.0);
  CHECK(ropeFrequency(10000.0, 8, 1, s) == Approx(0.1).epsilon(1e-15));
  const double f2 = std::pow(10000.0, -0.5),
               t = (1000.0 * f2 / (2 * pi) - 1) / 3;
  CHECK(ropeFrequency(10000.0, 8, 2, s) ==
        Approx((1 - t) * f2 / 8 + t * f2).epsilon(1e-15));
  CHECK(ropeFrequency(10000.0, 8, 3, s) ==
        Approx(std::pow(10000.0, -0.75) / 8).epsilon(1e-15));
  CHECK(ropeFrequency(10000.0, 8, 3, RopeScaling{}) ==
        std::pow(10000.0, -0.75));
}

TEST_CASE("attention rejects a bad Llama 3.1 rotary scaling",
          "[kernels][rope]") {
  std::vector<Tensor> ins = {Tensor::f32({2, 6}, std::vector<float>(12, 0.5f))};
  std::vector<Tensor> outs = {Tensor::f32({2, 2}), Tensor::f32({2, 2})};
  auto scaled = [](double theta, double factor, double low, double high,
                   int64_t original) {
    K k = K("attention").i("heads", 1).i("seq", 2);
    if (theta != 0)
      k.f("rope_theta", theta);
    k.f("rope_factor", factor)
        .f("rope_low_freq_factor", low)
        .f("rope_high_freq_factor", high);
    if (original != 0)
      k.i("rope_original_max_position", original);
    return k;
  };
  mustRun(scaled(500000.0, 8.0, 1.0, 4.0, 64), ins, outs);
  CHECK(mustFail(scaled(0, 8.0, 1.0, 4.0, 64), ins, outs) ==
        "attention: attribute 'rope_factor' needs 'rope_theta'");
  CHECK(mustFail(scaled(500000.0, 8.0, 4.0, 1.0, 64), ins, outs) ==
        "attention: attributes 'rope_factor', 'rope_low_freq_factor' and "
        "'rope_high_freq_factor' must satisfy factor > 0 and 0 < low < high");
  CHECK(mustFail(scaled(500000.0, 8.0, 1.0, 4.0, 0), ins, outs)
            .find("rope_original_max_position") != std::string::npos);
}
