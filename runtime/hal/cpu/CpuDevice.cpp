// The CPU backend of the HAL (see CpuDevice.h).
#include "runtime/hal/cpu/CpuDevice.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/hal/HostWorker.h"
#include "support/HostMemory.h"
#include "support/Precision.h"

namespace piper::runtime::hal {

namespace {

/// Host memory with accounting and reuse. Every step allocates the same
/// buffers in the same order, so freed blocks are kept by exact size and
/// handed out again: after the first step no large allocation goes back to
/// the kernel (page faults and zeroing of fresh pages, about 6% of a GPT-2
/// small step). liveBytes() and peakBytes() count the requested bytes of
/// allocations, not the kept blocks (the process RSS includes them).
class CpuAllocator final : public Allocator {
public:
  ~CpuAllocator() override {
    for (auto &[size, blocks] : kept)
      for (void *block : blocks)
        std::free(block);
  }

  Status allocate(size_t bytes, void *&ptr) override {
    size_t size = blockSize(bytes);
    void *block = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = kept.find(size);
      if (it != kept.end() && !it->second.empty()) {
        block = it->second.back();
        it->second.pop_back();
        keptBytes -= size;
      }
    }
    if (!block)
      block = std::aligned_alloc(64, size);
    ptr = block;
    if (!block)
      return Status::error("out of memory: cannot allocate " +
                           std::to_string(bytes) + " bytes");
    add(static_cast<int64_t>(bytes));
    return Status::ok();
  }

  void deallocate(void *ptr, size_t bytes) override {
    if (!ptr)
      return;
    live.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
    size_t size = blockSize(bytes);
    {
      // Kept unless the kept blocks would then outgrow the peak of live
      // tensors (a bound a repeating step never reaches).
      std::lock_guard<std::mutex> lock(mu);
      if (keptBytes + size <= static_cast<size_t>(peak.load())) {
        kept[size].push_back(ptr);
        keptBytes += size;
        return;
      }
    }
    std::free(ptr);
  }

  Status zero(void *ptr, size_t bytes) override {
    zeroBytes(ptr, static_cast<int64_t>(bytes));
    return Status::ok();
  }
  Status copy(void *dst, const void *src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  Status copyToHost(void *host, const void *src, size_t bytes) override {
    std::memcpy(host, src, bytes);
    return Status::ok();
  }
  Status copyFromHost(void *dst, const void *host, size_t bytes) override {
    std::memcpy(dst, host, bytes);
    return Status::ok();
  }
  int64_t liveBytes() const override { return live.load(); }
  int64_t peakBytes() const override { return peak.load(); }
  StatusOr<int64_t> availableBytes() const override {
    return hostAvailableBytes();
  }

private:
  static size_t blockSize(size_t bytes) {
    size_t size = (bytes + 63) / 64 * 64;
    return size == 0 ? 64 : size;
  }
  void add(int64_t bytes) {
    int64_t now = live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    int64_t seen = peak.load(std::memory_order_relaxed);
    while (now > seen &&
           !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }

  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak{0};
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void *>> kept; // by block size
  size_t keptBytes = 0;
};

/// An atomic value with its own condition variable; signal takes the lock
/// only when someone waits.
class CpuEvent final : public Event {
public:
  Status signal(uint64_t v) override {
    uint64_t seen = current.load();
    while (seen < v && !current.compare_exchange_weak(seen, v)) {
    }
    if (waiters.load() > 0) {
      { std::lock_guard<std::mutex> lock(mu); }
      cv.notify_all();
    }
    return Status::ok();
  }
  Status wait(uint64_t v, const std::atomic<bool> &abort) override {
    if (current.load() >= v)
      return Status::ok();
    waiters.fetch_add(1);
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return current.load() >= v || abort.load(); });
    }
    waiters.fetch_sub(1);
    if (current.load() >= v)
      return Status::ok();
    return abortedWait(v);
  }
  void wake() override {
    { std::lock_guard<std::mutex> lock(mu); }
    cv.notify_all();
  }
  uint64_t value() const override { return current.load(); }

private:
  std::atomic<uint64_t> current{0};
  std::atomic<int> waiters{0};
  std::mutex mu;
  std::condition_variable cv;
};

/// Slots in host memory, measured at once in the CPU kernels' order
/// (runtime::sumOfSquares: per-chunk partials added in chunk order).
class CpuSquareSums final : public SquareSums {
public:
  explicit CpuSquareSums(int slots) : slots(static_cast<size_t>(slots), 0.0) {}
  Status measure(const std::vector<SquaresSpan> &spans) override {
    PIPER_RETURN_IF_ERROR(checkSquaresSlots(spans, 0, size()));
    for (const SquaresSpan &span : spans)
      slots[static_cast<size_t>(span.slot)] =
          runtime::sumOfSquares(span.data, span.n);
    return Status::ok();
  }
  Status read(double *out, int count) override {
    PIPER_RETURN_IF_ERROR(checkSquaresSlots({}, count, size()));
    std::copy(slots.begin(), slots.begin() + count, out);
    return Status::ok();
  }
  Status setWeights(const std::vector<double> &w) override {
    PIPER_RETURN_IF_ERROR(checkSquaresWeights(w.size(), size()));
    weights = w;
    return Status::ok();
  }
  Status weigh() override {
    if (weights.size() != slots.size())
      return checkSquaresWeights(weights.size(), size());
    double t = 0;
    for (size_t i = 0; i < slots.size(); ++i)
      t += slots[i] * weights[i];
    sum = t;
    return Status::ok();
  }
  double *total() override { return &sum; }
  Status clip(double replicas, double maxNorm) override {
    norm = std::sqrt(sum / replicas);
    clipFactor = clipFactorOf(norm, maxNorm);
    return Status::ok();
  }
  const float *factor() const override { return &clipFactor; }
  Status readNorm(double &out) override {
    out = norm;
    return Status::ok();
  }

private:
  int size() const { return static_cast<int>(slots.size()); }
  std::vector<double> slots, weights;
  double sum = 0, norm = 0;
  float clipFactor = 1;
};

/// Loss accumulators in host memory (the CPU's device memory).
class CpuLossSums final : public LossSums {
public:
  explicit CpuLossSums(int slots) : slots(static_cast<size_t>(slots), 0.0) {}
  double *slot(int i) override { return &slots[static_cast<size_t>(i)]; }
  Status reset() override {
    std::fill(slots.begin(), slots.end(), 0.0);
    return Status::ok();
  }
  Status read(double *out) override {
    std::copy(slots.begin(), slots.end(), out);
    return Status::ok();
  }

private:
  std::vector<double> slots;
};

/// One persistent worker thread running its queue in order.
class CpuStream final : public Stream {
public:
  explicit CpuStream(std::string name) : streamName(std::move(name)) {}

  const std::string &name() const override { return streamName; }
  void enqueue(std::function<void()> work) override {
    worker.enqueue(std::move(work));
  }
  Status synchronize() override {
    worker.synchronize();
    return Status::ok();
  }

private:
  std::string streamName;
  HostWorker worker; // last: starts once the rest is constructed
};

class CpuDevice final : public Device {
public:
  explicit CpuDevice(Communicator *comm) : comm(comm) {}
  std::string name() const override { return "cpu"; }
  Allocator &allocator() override { return memory; }
  Status createStream(const std::string &name,
                      std::unique_ptr<Stream> &stream) override {
    stream = std::make_unique<CpuStream>(name);
    return Status::ok();
  }
  Status createEvent(std::unique_ptr<Event> &event) override {
    event = std::make_unique<CpuEvent>();
    return Status::ok();
  }
  const KernelInfo *findKernel(const std::string &name) const override {
    return runtime::findKernel(name);
  }
  std::vector<std::string> kernelNames() const override {
    return runtime::kernelNames();
  }
  Status runKernel(const KernelInfo &info, const plan::Kernel &kernel,
                   const KernelAttrs &attrs,
                   const std::vector<TensorRef> &inputs,
                   const std::vector<TensorRef> &outputs,
                   KernelContext &ctx) override {
    return runtime::runKernel(info, kernel, attrs, inputs, outputs, ctx);
  }
  // Host memory: nothing here can fail.
  Status createSquareSums(int slots,
                          std::unique_ptr<SquareSums> &sums) override {
    sums = std::make_unique<CpuSquareSums>(slots);
    return Status::ok();
  }
  Status createLossSums(int slots, std::unique_ptr<LossSums> &sums) override {
    PIPER_RETURN_IF_ERROR(checkLossSlots(slots));
    sums = std::make_unique<CpuLossSums>(slots);
    return Status::ok();
  }
  Status add(float *dst, const float *src, int64_t n) override {
    for (int64_t i = 0; i < n; ++i)
      dst[i] += src[i];
    return Status::ok();
  }
  Status packBf16(uint16_t *dst, const float *src, int64_t n) override {
    piper::packBf16(dst, src, n);
    return Status::ok();
  }
  Status unpackBf16(float *dst, const uint16_t *src, int64_t n) override {
    piper::unpackBf16(dst, src, n);
    return Status::ok();
  }
  Status roundBf16(float *x, int64_t n) override {
    roundToBf16(x, n);
    return Status::ok();
  }
  Communicator *communicator() override { return comm; }

private:
  CpuAllocator memory;
  Communicator *comm;
};

} // namespace

std::unique_ptr<Device> createCpuDevice(Communicator *comm) {
  return std::make_unique<CpuDevice>(comm);
}

} // namespace piper::runtime::hal
