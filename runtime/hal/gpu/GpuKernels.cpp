// The GPU kernel registry (GpuKernels.h).
#include "runtime/hal/gpu/GpuKernels.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

const std::vector<KernelEntry> &kernels() {
  static const auto *all = [] {
    auto *v = new std::vector<KernelEntry>();
    addElementwiseKernels(*v);
    addLayerKernels(*v);
    addLinearKernels(*v);
    addAttentionKernels(*v);
    addMoeKernels(*v);
    return v;
  }();
  return *all;
}

const std::vector<KernelInfo> &kernelInfos() {
  static const auto *infos = [] {
    auto *v = new std::vector<KernelInfo>();
    int index = 0;
    for (const KernelEntry &e : kernels())
      v->push_back(KernelInfo{e.name, nullptr, index++});
    return v;
  }();
  return *infos;
}

const KernelInfo *findKernelInfo(const std::string &name) {
  for (const KernelInfo &k : kernelInfos())
    if (name == k.name)
      return &k;
  return nullptr;
}

std::vector<std::string> kernelInfoNames() {
  std::vector<std::string> names;
  for (const KernelInfo &k : kernelInfos())
    names.push_back(k.name);
  return names;
}

bool kernelRoundsOutputs(const KernelInfo &info) {
  return kernels()[static_cast<size_t>(info.index)].roundsOutputs;
}

bool kernelWritesPackedOutput(const KernelInfo &info, int output) {
  return output >= 0 && output < 32 &&
         (kernels()[static_cast<size_t>(info.index)].packedOutputs >> output &
          1);
}

bool kernelReadsPackedInput(const KernelInfo &info, int input) {
  return input >= 0 && input < 32 &&
         (kernels()[static_cast<size_t>(info.index)].packedInputs >> input & 1);
}

Status runKernel(const KernelInfo &info, const plan::Kernel &kernel,
                 const KernelAttrs &attrs, const std::vector<TensorRef> &inputs,
                 const std::vector<TensorRef> &outputs, KernelContext &kctx,
                 const Context &ctx) {
  detail::KernelArgs args{kernel, attrs, inputs, outputs, kctx};
  PIPER_RETURN_IF_ERROR(detail::checkOperandStorage(args));
  return kernels()[static_cast<size_t>(info.index)].fn(args, ctx);
}

Status prepareKernel(const KernelInfo &info, const plan::Kernel &kernel,
                     const KernelAttrs &attrs,
                     const std::vector<TensorRef> &inputs,
                     const std::vector<TensorRef> &outputs, KernelContext &kctx,
                     const Context &ctx) {
  KernelFn prepare = kernels()[static_cast<size_t>(info.index)].prepare;
  if (!prepare)
    return Status::ok();
  detail::KernelArgs args{kernel, attrs, inputs, outputs, kctx};
  return prepare(args, ctx);
}

} // namespace piper::runtime::hal::PIPER_GPU_NS
