// The CUDA backend's sums in device memory (CudaSums.h).
#include "runtime/hal/cuda/CudaSums.h"

#include <cuda_runtime_api.h>

#include <utility>
#include <vector>

#include "runtime/hal/cuda/CudaCheck.h"
#include "runtime/hal/gpu/ElementwiseLaunch.h"
#include "runtime/hal/gpu/GpuKernels.h"

namespace piper::runtime::hal {

namespace {

/// The slots in device memory (one cudaMalloc outside the arena, like the
/// streams' scratch: the slots, their weights, the total and the norm as
/// doubles, then the clip factor); measuring queues the GPU kernel layer's
/// sums on the calling stream, reading is one device-to-host copy.
class CudaSquareSums final : public SquareSums {
public:
  CudaSquareSums(ContextOf context, Allocator &memory, double *slots, int count)
      : context(std::move(context)), memory(memory), slots(slots), count(count),
        weights(slots + count), sum(weights + count), norm(sum + 1),
        clipFactor(reinterpret_cast<float *>(norm + 1)) {}
  /// Doubles of the block for `count` slots (the factor takes the last).
  static size_t blockDoubles(int count) { return 2 * size_t(count) + 3; }
  ~CudaSquareSums() override { cudaFree(slots); }
  Status measure(const std::vector<SquaresSpan> &spans) override {
    PIPER_RETURN_IF_ERROR(checkSquaresSlots(spans, 0, count));
    std::vector<gpu::SquaresJob> jobs;
    for (const SquaresSpan &span : spans)
      jobs.push_back({span.data, span.n, slots + span.slot});
    return gpu::sumsOfSquares(context(), jobs);
  }
  Status read(double *out, int n) override {
    PIPER_RETURN_IF_ERROR(checkSquaresSlots({}, n, count));
    return gpu::copyToHostSync(context(), out, slots,
                               sizeof(double) * size_t(n));
  }
  Status setWeights(const std::vector<double> &w) override {
    PIPER_RETURN_IF_ERROR(checkSquaresWeights(w.size(), count));
    if (!w.empty())
      PIPER_RETURN_IF_ERROR(
          memory.copyFromHost(weights, w.data(), sizeof(double) * w.size()));
    weighted = true;
    return Status::ok();
  }
  Status weigh() override {
    if (!weighted)
      return Status::error("sum of squares: weigh() before setWeights()");
    return gpu::launchWeighSquares(context(), slots, weights, count, sum);
  }
  double *total() override { return sum; }
  Status clip(double replicas, double maxNorm) override {
    return gpu::launchClipFactor(context(), sum, replicas, maxNorm, norm,
                                 clipFactor);
  }
  const float *factor() const override { return clipFactor; }
  Status readNorm(double &out) override {
    return gpu::copyToHostSync(context(), &out, norm, sizeof(double));
  }

private:
  ContextOf context;
  Allocator &memory;
  double *slots;
  int count;
  double *weights, *sum, *norm;
  float *clipFactor;
  bool weighted = false;
};

/// Loss accumulators in device memory (outside the arena, as the sums of
/// squares): `loss_accumulate` adds to them on the streams; the executor
/// zeroes them before a step and reads them once after it.
class CudaLossSums final : public LossSums {
public:
  CudaLossSums(ContextOf context, Allocator &memory, double *slots, int count)
      : context(std::move(context)), memory(memory), slots(slots),
        count(count) {}
  ~CudaLossSums() override { cudaFree(slots); }
  double *slot(int i) override { return slots + i; }
  Status reset() override {
    return memory.zero(slots, sizeof(double) * size_t(count));
  }
  Status read(double *out) override {
    return gpu::copyToHostSync(context(), out, slots,
                               sizeof(double) * size_t(count));
  }

private:
  ContextOf context;
  Allocator &memory;
  double *slots;
  int count;
};

} // namespace

Status createCudaSquareSums(int ordinal, int slots, ContextOf context,
                            Allocator &memory,
                            std::unique_ptr<SquareSums> &sums) {
  PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  void *block = nullptr;
  PIPER_CUDA_RETURN_IF_ERROR(
      cudaMalloc(&block, sizeof(double) * CudaSquareSums::blockDoubles(slots)));
  sums = std::make_unique<CudaSquareSums>(std::move(context), memory,
                                          static_cast<double *>(block), slots);
  return Status::ok();
}

Status createCudaLossSums(int ordinal, int slots, ContextOf context,
                          Allocator &memory, std::unique_ptr<LossSums> &sums) {
  PIPER_RETURN_IF_ERROR(checkLossSlots(slots));
  PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  void *block = nullptr;
  PIPER_CUDA_RETURN_IF_ERROR(
      cudaMalloc(&block, sizeof(double) * size_t(slots)));
  sums = std::make_unique<CudaLossSums>(std::move(context), memory,
                                        static_cast<double *>(block), slots);
  return sums->reset();
}

} // namespace piper::runtime::hal
