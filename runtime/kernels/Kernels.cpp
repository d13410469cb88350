// Kernel dispatch by op name, the checks common to every operand, and the
// public attribute readers.
#include "runtime/kernels/Kernels.h"

#include <cblas.h>

#include <cmath>
#include <cstdint>

#include "runtime/kernels/KernelUtil.h"
#include "runtime/kernels/Parallel.h"
#include "runtime/kernels/VecMath.h"

#include <cstring>

namespace piper::runtime {

namespace {

using detail::KernelFn;

struct KernelEntry {
  const char *name;
  KernelFn fn;
};

// Order is the order kernelNames() reports: forward, backward, then state.
const KernelEntry kernelTable[] = {
    {"embedding", detail::embeddingKernel},
    {"position_add", detail::positionAddKernel},
    {"layer_norm", detail::layerNormKernel},
    {"rms_norm", detail::rmsNormKernel},
    {"linear", detail::linearKernel},
    {"gelu", detail::geluKernel},
    {"swiglu", detail::swigluKernel},
    {"add", detail::addKernel},
    {"attention", detail::attentionKernel},
    {"moe_router", detail::moeRouterKernel},
    {"moe_dispatch", detail::moeDispatchKernel},
    {"expert_linear", detail::expertLinearKernel},
    {"moe_combine", detail::moeCombineKernel},
    {"moe_aux_loss", detail::moeAuxLossKernel},
    {"cross_entropy", detail::crossEntropyKernel},
    {"loss_accumulate", detail::lossAccumulateKernel},
    {"embedding_grad", detail::embeddingGradKernel},
    {"position_add_grad", detail::positionAddGradKernel},
    {"layer_norm_grad", detail::layerNormGradKernel},
    {"layer_norm_grad_input", detail::layerNormGradInputKernel},
    {"layer_norm_grad_weight", detail::layerNormGradWeightKernel},
    {"rms_norm_grad", detail::rmsNormGradKernel},
    {"rms_norm_grad_input", detail::rmsNormGradInputKernel},
    {"rms_norm_grad_weight", detail::rmsNormGradWeightKernel},
    {"linear_grad_input", detail::linearGradInputKernel},
    {"linear_grad_weight", detail::linearGradWeightKernel},
    {"bias_grad", detail::biasGradKernel},
    {"gelu_grad", detail::geluGradKernel},
    {"swiglu_grad", detail::swigluGradKernel},
    {"attention_grad", detail::attentionGradKernel},
    {"moe_router_grad", detail::moeRouterGradKernel},
    {"moe_dispatch_grad", detail::moeDispatchGradKernel},
    {"expert_linear_grad_input", detail::expertLinearGradInputKernel},
    {"expert_linear_grad_weight", detail::expertLinearGradWeightKernel},
    {"moe_combine_grad", detail::moeCombineGradKernel},
    {"moe_aux_loss_grad", detail::moeAuxLossGradKernel},
    {"cross_entropy_grad", detail::crossEntropyGradKernel},
    {"accumulate", detail::accumulateKernel},
    {"zero", detail::zeroKernel},
    {"adamw", detail::adamwKernel},
};

// Kernels index raw memory with numel(); a bogus shape or a missing buffer
// must be an error before any of them runs.
Status checkStorage(const detail::KernelArgs &a, const TensorRef &t,
                    const std::string &what) {
  int64_t numel = 1;
  for (int64_t d : t.shape) {
    if (d < 0)
      return a.error(what + " has negative dimension in shape " +
                     detail::shapeString(t.shape));
    if (__builtin_mul_overflow(numel, d, &numel) || numel > (INT64_MAX >> 3))
      return a.error(what + " has too many elements, shape " +
                     detail::shapeString(t.shape));
  }
  if (numel > 0 && !t.data)
    return a.error(what + " has no storage");
  return Status::ok();
}

} // namespace

Status runKernel(const plan::Kernel &kernel,
                 const std::vector<TensorRef> &inputs,
                 const std::vector<TensorRef> &outputs, KernelContext &ctx) {
  KernelFn fn = nullptr;
  for (const KernelEntry &entry : kernelTable)
    if (kernel.op() == entry.name)
      fn = entry.fn;
  if (!fn)
    return Status::error("unknown kernel '" + kernel.op() + "'");

  detail::KernelArgs args{kernel, inputs, outputs, ctx};
  for (size_t i = 0; i < inputs.size(); ++i)
    PIPER_RETURN_IF_ERROR(
        checkStorage(args, inputs[i], "input " + std::to_string(i)));
  for (size_t i = 0; i < outputs.size(); ++i)
    PIPER_RETURN_IF_ERROR(
        checkStorage(args, outputs[i], "output " + std::to_string(i)));
  return fn(args);
}

std::vector<std::string> kernelNames() {
  std::vector<std::string> names;
  for (const KernelEntry &entry : kernelTable)
    names.push_back(entry.name);
  return names;
}

double sumOfSquares(const float *x, int64_t n) {
  // Per-chunk partial sums, added in chunk order: the same on any number of
  // threads.
  const int64_t grain = detail::kElementGrain;
  std::vector<double> partial(n > 0 ? (n + grain - 1) / grain : 0);
  detail::parallelFor(n, grain, [&](int64_t begin, int64_t end) {
    partial[begin / grain] = detail::dotDouble(x + begin, x + begin,
                                               end - begin);
  });
  double sum = 0;
  for (double p : partial)
    sum += p;
  return sum;
}

void scaleFloats(float *x, float scale, int64_t n) {
  detail::parallelFor(n, detail::kElementGrain, [&](int64_t begin, int64_t end) {
    detail::scaleInPlace(x + begin, scale, end - begin);
  });
}

void zeroBytes(void *data, int64_t bytes) {
  char *p = static_cast<char *>(data);
  detail::parallelFor(bytes, detail::kElementGrain * 4,
                      [&](int64_t begin, int64_t end) {
                        std::memset(p + begin, 0,
                                    static_cast<size_t>(end - begin));
                      });
}

std::string blasDescription() {
  const char *core = openblas_get_corename();
  return std::string("OpenBLAS ") + (core ? core : "?") + " core, " +
         std::to_string(openblas_get_num_threads()) + " thread(s)";
}

int64_t attrInt(const plan::Kernel &kernel, const std::string &name,
                int64_t dflt) {
  auto it = kernel.attrs().find(name);
  if (it == kernel.attrs().end())
    return dflt;
  const plan::AttrValue &v = it->second;
  if (v.value_case() == plan::AttrValue::kI)
    return v.i();
  if (v.value_case() == plan::AttrValue::kF && std::isfinite(v.f()) &&
      std::fabs(v.f()) < 0x1p62)
    return static_cast<int64_t>(v.f());
  return dflt;
}

double attrFloat(const plan::Kernel &kernel, const std::string &name,
                 double dflt) {
  auto it = kernel.attrs().find(name);
  if (it == kernel.attrs().end())
    return dflt;
  const plan::AttrValue &v = it->second;
  if (v.value_case() == plan::AttrValue::kF)
    return v.f();
  if (v.value_case() == plan::AttrValue::kI)
    return static_cast<double>(v.i());
  return dflt;
}

} // namespace piper::runtime
