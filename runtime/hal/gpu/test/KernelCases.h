// Test cases of the GPU kernels: each runs one op on the CPU device and on a
// GPU device (the host emulation everywhere, CUDA on a GPU) with the same
// random operands, and compares every output. Groups register their cases
// from test/<Group>Cases.cpp (RegisterCases); gpu_kernels_test also checks
// that every GPU kernel has at least one case.
#ifndef PIPER_RUNTIME_HAL_GPU_TEST_KERNELCASES_H
#define PIPER_RUNTIME_HAL_GPU_TEST_KERNELCASES_H

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/hal/Hal.h"

namespace piper::runtime::hal::testing {

/// How an operand is filled.
enum class Fill {
  Normal,   ///< N(0, scale^2)
  Positive, ///< uniform in [0.1, 1.1) * scale (variances, ...)
  Tokens,   ///< i32 uniform in [0, limit)
  Zero,
  Given, ///< `values` (f32 or i32), repeated to fill
};

struct Operand {
  plan::DType dtype = plan::F32;
  std::vector<int64_t> shape;
  Fill fill = Fill::Normal;
  double scale = 1.0;
  int64_t limit = 0;
  std::vector<double> values;
  /// An output of log-sum-exp pairs ([rows, 2 heads], storeRingLse's bf16
  /// value and rest per head): compared as values, hi + lo, since two
  /// backends whose lse differ by a rounding may split it differently.
  bool lsePairs = false;
};

/// f32 operand of `shape`, N(0, scale^2).
Operand f32(std::vector<int64_t> shape, double scale = 1.0);
/// f32 operand of `shape`, uniform in [0.1, 1.1) * scale.
Operand positive(std::vector<int64_t> shape, double scale = 1.0);
/// i32 operand of `shape`, uniform in [0, limit).
Operand tokens(std::vector<int64_t> shape, int64_t limit);
/// Operand of `shape` filled with `values`, repeated.
Operand given(plan::DType dtype, std::vector<int64_t> shape,
              std::vector<double> values);
/// f32 or i32 zeros.
Operand zeros(std::vector<int64_t> shape, plan::DType dtype = plan::F32);
/// f32 zeros for an output of log-sum-exp pairs over `heads` (lsePairs).
Operand lsePairs(int64_t rows, int64_t heads);

struct KernelCase {
  std::string name;
  std::string op;
  std::vector<std::pair<std::string, plan::AttrValue>> attrs;
  std::vector<Operand> inputs;
  /// Outputs, with their initial contents (in-place kernels read them).
  std::vector<Operand> outputs;
  /// Per element: |gpu - cpu| <= atol + rtol |cpu|.
  double rtol = 1e-5, atol = 1e-6;
  int64_t step = 1;
  double lrScale = 1.0;
  bool lowPrecision = false;
  /// The rank's tensor-parallel member (sp_split).
  int64_t tensorMember = 0;
  /// The rank's context-parallel member (ring attention).
  int64_t contextMember = 0;
  /// Also compares the loss accumulator (loss_accumulate).
  bool checksLoss = false;
  /// adamw: also passes a bf16 copy of output 0 (KernelContext::bf16Copy),
  /// which must hold exactly output 0 rounded to bf16 on each device.
  bool bf16Copy = false;
  /// adamw: the same copy packed (KernelContext::bf16PackedCopy), which
  /// must hold exactly output 0 packed to bf16 on each device.
  bool packedCopy = false;
  /// Not empty: a malformed call. Both devices must reject it with the same
  /// message, containing this.
  std::string rejects;
};

plan::AttrValue intAttr(int64_t v);
plan::AttrValue floatAttr(double v);

/// The operands of one device: allocated, uploaded, downloaded. The first
/// device error is kept in `status` (the case fails with it).
struct DeviceRun {
  Device &device;
  std::vector<void *> buffers;
  std::vector<size_t> sizes;
  Status status;
  ~DeviceRun() {
    for (size_t i = 0; i < buffers.size(); ++i)
      device.allocator().deallocate(buffers[i], sizes[i]);
  }
  TensorRef upload(const Operand &o, const std::vector<uint32_t> &words) {
    size_t bytes = words.size() * 4;
    void *p = nullptr;
    keep(device.allocator().allocate(bytes == 0 ? 4 : bytes, p));
    if (p) {
      buffers.push_back(p);
      sizes.push_back(bytes == 0 ? 4 : bytes);
    }
    if (bytes && p)
      keep(device.allocator().copyFromHost(p, words.data(), bytes));
    return TensorRef{o.dtype, o.shape, p};
  }
  std::vector<uint32_t> download(const TensorRef &t) {
    // Packed bf16: two elements a word (the last word's upper half unused).
    const int64_t n = t.dtype == plan::BF16 ? (t.numel() + 1) / 2 : t.numel();
    std::vector<uint32_t> words(static_cast<size_t>(n));
    if (!words.empty())
      keep(device.allocator().copyToHost(words.data(), t.data,
                                         words.size() * 4));
    return words;
  }
  void keep(const Status &st) {
    if (status && !st)
      status = st;
  }
};

/// The plan kernel of a case: its op and attributes, no operands.
plan::Kernel kernelOf(const KernelCase &c);

/// All registered cases.
std::vector<KernelCase> &kernelCases();

/// Registers cases at static initialization (one per test/*Cases.cpp).
struct RegisterCases {
  explicit RegisterCases(std::vector<KernelCase> cases);
};

/// The result of running one case on both devices.
struct CaseResult {
  std::string error;        ///< empty when both ran and every output agrees
  double worstRelative = 0; ///< max |gpu - cpu| / (atol + rtol |cpu|)
};

/// Runs `c` on `cpu` and `gpu` with the same operands (seeded by the case
/// name) and compares. Device memory comes from each device's allocator;
/// kernels run outside streams (complete on return).
CaseResult runCase(const KernelCase &c, Device &cpu, Device &gpu);

/// Runs `c` on `device` with its inputs as runCase fills them and every
/// output word set to `outputWord` first; `outputs` gets the outputs' words.
/// "" or the error.
std::string runOutputsFrom(const KernelCase &c, Device &device,
                           uint32_t outputWord,
                           std::vector<std::vector<uint32_t>> &outputs);

/// The "op:input" and "op:out<o>" names of every operand that `declaring`
/// says a case's op takes or stores packed (an f32 operand of at least one
/// dimension): what comparePackedOperands checks when no case is skipped.
std::set<std::string> declaredPackedOperands(Device &declaring);
/// Packed bf16 operands (Device::readsPackedInput, writesPackedOutput):
/// for every case of an op that `declaring` says takes some input packed,
/// run on `device` in mixed precision with those inputs' values rounded to
/// bf16, once as fp32 and once packed (each such input alone, then all at
/// once), and compare the outputs word for word (the same values: the same
/// bits); for every output it says the op stores packed, the packed output
/// must be the fp32 run's output packed, and the other outputs the same.
/// Cases whose operands have more than `maxElements` elements are skipped.
/// `checked` gets "op:input" of every packed input run and "op:out<o>" of
/// every packed output. Also checks that a packed operand outside mixed
/// precision is refused. Returns "" or what differs.
std::string comparePackedOperands(Device &declaring, Device &device,
                                  int64_t maxElements,
                                  std::set<std::string> &checked);

/// The devices' SquareSums (the gradient norm) on the same spans (empty, one
/// element, several chunks) in their own memory, measured in two calls into
/// scattered slots and read back at once: "" when every GPU sum is within
/// `rtol` of the CPU's, else what differs (or fails). Also checks that a
/// slot out of range is an error on both.
std::string compareSquareSums(Device &cpu, Device &gpu, double rtol = 1e-12);

/// On `gpu`: many spans measured in one call (several launches' batches,
/// empty spans and spans of one and of several chunks among them) give
/// each slot the same bits as the span measured alone, and within `rtol`
/// of the host's double sum. Returns "" or what differs.
std::string compareSquaresBatching(Device &gpu, double rtol = 1e-12);

/// On `gpu`: a run of `adamw` calls given to Device::runAdamwCalls at once
/// (more than two launches' batches, six constant sets, empty and
/// multi-block parameters, some with bf16 copies) leaves every parameter,
/// moment and copy with the bits of each call run by itself (runKernel),
/// also when the clip factor skips the update; with a clip factor, every
/// call's bits are those of the update of its gradient scaled by it first
/// (on the host, a float product); a malformed call fails with runKernel's
/// message, naming its index. Returns "" or what differs.
std::string compareAdamwCalls(Device &gpu);

/// The clipped step's norm on each device (SquareSums::setWeights, weigh,
/// clip, factor, readNorm): spans weighed into a norm that clips, one that
/// does not, and one with a NaN. "" when, on each device, the norm is within
/// `rtol` of the host's double sum (and of the CPU's) and the factor is
/// clipFactorOf's of that device's norm exactly (NaN for the NaN); else
/// what differs. (The update applies the factor: compareAdamwCalls.)
std::string compareGradClip(Device &cpu, Device &gpu, double rtol = 1e-12);

} // namespace piper::runtime::hal::testing

#endif // PIPER_RUNTIME_HAL_GPU_TEST_KERNELCASES_H
