// Fused causal grouped-query attention through cuDNN's backend API: the
// forward and backward "flash attention" operation graphs, written as
// cudnn-frontend's composite SDPA lowers them for cuDNN 9 (matmul, pointwise
// and reduction operations; the causal mask as GEN_INDEX row/col, CMP_GE and
// BINARY_SELECT), so that cuDNN's fused flash engines recognize them. bf16
// inputs and outputs, fp32 compute and statistics.
//
// Layout (Piper's packed one). Q, K and V live in one bf16 buffer `qkv` of
// rows r = b * seq + t, each row (heads + 2 * kvHeads) * headDim elements:
// query head h at column h * headDim, key head g at (heads + g) * headDim,
// value head g at (heads + kvHeads + g) * headDim. O and dO are bf16
// [batch * seq, heads * headDim]. Stats is fp32 [batch, heads, seq]: per
// query row, max + log(sum exp) of the scaled, masked scores (logsumexp).
// Backward writes dQ, dK, dV into one bf16 buffer `dqkv` of qkv's layout,
// dK and dV summed over each key-value head's group of query heads. Causal:
// key j is visible to query i iff j <= i.
#ifndef PIPER_RUNTIME_HAL_CUDA_CUDNNSDPA_H
#define PIPER_RUNTIME_HAL_CUDA_CUDNNSDPA_H

#include <cudnn_graph.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/hal/cuda/CudnnLibrary.h"
#include "support/Status.h"

namespace piper::runtime::hal {

/// One attention call's sizes; `scale` multiplies the scores (1/sqrt(d)).
struct SdpaShape {
  int64_t batch = 0, heads = 0, kvHeads = 0, seq = 0, headDim = 0;
  float scale = 0;
};

/// "batch 8, seq 1024, 12 query / 12 key-value heads of 64".
std::string describeSdpaShape(const SdpaShape &shape);

/// Checks what the graphs and cuDNN's flash engines need before any cuDNN
/// call: positive sizes, a finite positive scale, heads a multiple of
/// kvHeads, headDim a multiple of 8 and at most 256 (Hopper's bf16 flash
/// limit; other GPUs stop at 128 and then have no engine), seq >= 2 for the
/// backward pass (cuDNN refuses s_q = s_kv = 1), and every element count and
/// stride within int64.
Status validateSdpaShape(const SdpaShape &shape, bool backward);
/// Refuses what cuDNN `version` (cudnnGetVersion's code, e.g. 91900) is
/// known to compute wrongly, as cudnn-frontend does: the backward of
/// 9.10.0 and 9.10.1, and before 9.15.1 sequences that are not a multiple
/// of 128 (both passes: they run on the same kernels).
Status checkSdpaVersion(size_t version, const SdpaShape &shape, bool backward);
/// The value the causal mask writes: -inf, or before cuDNN 9.10 the lowest
/// float (as cudnn-frontend binds it).
float sdpaMaskValue(size_t version);

/// One cuDNN backend descriptor, destroyed through the library that made it.
class CudnnDescriptor {
public:
  CudnnDescriptor() = default;
  CudnnDescriptor(const CudnnLibrary *lib, cudnnBackendDescriptor_t desc)
      : lib(lib), desc(desc) {}
  CudnnDescriptor(CudnnDescriptor &&other) noexcept {
    *this = std::move(other);
  }
  CudnnDescriptor &operator=(CudnnDescriptor &&other) noexcept;
  CudnnDescriptor(const CudnnDescriptor &) = delete;
  CudnnDescriptor &operator=(const CudnnDescriptor &) = delete;
  ~CudnnDescriptor() { reset(); }
  void reset();
  cudnnBackendDescriptor_t get() const { return desc; }
  /// Address of the raw descriptor, as cudnnBackendSetAttribute wants it.
  const cudnnBackendDescriptor_t *address() const { return &desc; }

private:
  const CudnnLibrary *lib = nullptr;
  cudnnBackendDescriptor_t desc = nullptr;
};

/// The fixed unique ids of the tensors a variant pack binds (virtual
/// tensors are numbered from FirstVirtual on).
struct SdpaUid {
  static constexpr int64_t Q = 1, K = 2, V = 3, O = 4, Stats = 5;
  static constexpr int64_t Scale = 6;  // by value: the score scale
  static constexpr int64_t NegInf = 7; // by value: what the mask writes
  static constexpr int64_t One = 8;    // by value: the softmax-sum scale
  static constexpr int64_t DO = 9, DQ = 10, DK = 11, DV = 12;
  /// Backward scratch in the workspace: rowsum(dO * O), fp32 [B, H, T, 1],
  /// and the fp32 dQ accumulator [B, H, T, D].
  static constexpr int64_t SoftmaxSum = 13, DqAccum = 14;
  static constexpr int64_t FirstVirtual = 100;
};

/// A finalized forward or backward operation graph and what executing it
/// needs besides the caller's buffers. Building it needs no GPU and no handle.
struct SdpaGraph {
  SdpaShape shape;
  bool backward = false;
  /// Backward only: dQ accumulates in fp32 scratch (cuDNN's atomic-add
  /// kernels, nondeterministic) instead of being written directly.
  bool accumulateDq = false;
  /// Every descriptor the graph references (tensors, operations), kept
  /// alive with it.
  std::vector<CudnnDescriptor> parts;
  CudnnDescriptor graph; // CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR
  /// By-value scalars: the variant pack binds their host addresses.
  struct Scalar {
    int64_t uid;
    float value;
  };
  std::vector<Scalar> scalars;
  /// Non-virtual intermediates that live in the front of the workspace.
  struct Scratch {
    int64_t uid;
    size_t offset, bytes;
  };
  std::vector<Scratch> scratch;
  size_t scratchBytes = 0; // the engine's workspace starts here (aligned)
  int64_t engineCount = 0; // CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT
};

/// Builds and finalizes the forward (Q, K, V -> O, Stats) or backward (Q,
/// K, V, O, dO, Stats -> dQ, dK, dV) graph of `shape`. `accumulateDq` picks
/// the backward variant with an fp32 dQ accumulator (faster, atomics);
/// without it cuDNN writes dQ directly, the variant its deterministic
/// Hopper engines implement.
Status buildSdpaGraph(const CudnnLibrary &lib, const SdpaShape &shape,
                      bool backward, SdpaGraph &out, bool accumulateDq = false);

/// The serialized CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR of GPU
/// `deviceOrdinal` (cuDNN >= 9.8; needs that GPU), which createDeviceless
/// plans for on a machine without it.
Status cudnnDevicePropJson(const CudnnLibrary &lib, int deviceOrdinal,
                           std::string &json);

/// A forward or backward graph with the engine chosen for it.
class SdpaPlan {
public:
  /// Plans `shape` for the GPU of `handle` (the calling thread's current
  /// device: cuDNN 9 plans bind no handle): the graph, cuDNN's heuristics
  /// (mode A, then FALLBACK), and the first engine configuration that
  /// finalizes into an execution plan and, unless `allowNondeterministic`,
  /// carries no CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC. Backward without
  /// `allowNondeterministic` plans the direct-dQ graph only. An error names
  /// the shape and why each candidate was refused.
  static Status create(const CudnnLibrary &lib, cudnnHandle_t handle,
                       const SdpaShape &shape, bool backward,
                       bool allowNondeterministic,
                       std::unique_ptr<SdpaPlan> &out);
  /// The same choice made ahead of time for the device `devicePropJson`
  /// describes (cudnnDevicePropJson, cuDNN >= 9.8), needing no GPU but the
  /// CUDA driver library (libcuda.so.1; the toolkit's stub will do): cuDNN's
  /// flash engines compile at run time. Where the driver cannot load the
  /// compiled kernel (no GPU) the execution plan stays unfinalized and the
  /// workspace is the engine configuration's; the plan never executes.
  static Status createDeviceless(const CudnnLibrary &lib,
                                 const std::string &devicePropJson,
                                 const SdpaShape &shape, bool backward,
                                 bool allowNondeterministic,
                                 std::unique_ptr<SdpaPlan> &out);

  /// Bytes of device workspace forward/backward need (16-byte aligned
  /// pointer; our fp32 scratch first, then the engine's).
  size_t workspaceBytes() const { return graph.scratchBytes + engineBytes; }
  /// "engine 2 (knobs kernel_cfg=7), tensor core": the engine, its knob
  /// choices and numerical notes (and, deviceless, why the plan is not
  /// finalized).
  std::string description() const { return engineText; }
  /// The execution plan's JSON (CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION),
  /// or an error where there is no finalized plan or cuDNN cannot serialize
  /// it.
  Status planJson(std::string &json) const;
  bool executable() const { return canExecute; }
  const SdpaGraph &sdpaGraph() const { return graph; }

  /// Runs the forward graph on the handle's stream (cudnnSetStream).
  /// `qkv` bf16 (packed), `o` bf16 [B*T, H*D], `stats` fp32 [B, H, T];
  /// `workspace` workspaceBytes() of device memory, 16-byte aligned.
  Status forward(cudnnHandle_t handle, const void *qkv, void *o, float *stats,
                 void *workspace) const;
  /// Runs the backward graph: dQ, dK, dV into `dqkv` (qkv's layout; every
  /// element is written).
  Status backward(cudnnHandle_t handle, const void *qkv, const void *o,
                  const void *dO, const float *stats, void *dqkv,
                  void *workspace) const;

private:
  SdpaPlan() = default;
  static Status plan(const CudnnLibrary &lib, cudnnHandle_t handle,
                     const std::string *devicePropJson, const SdpaShape &shape,
                     bool backward, bool allowNondeterministic,
                     std::unique_ptr<SdpaPlan> &out);
  Status execute(cudnnHandle_t handle, std::vector<int64_t> uids,
                 std::vector<void *> pointers, void *workspace) const;

  const CudnnLibrary *lib = nullptr;
  SdpaGraph graph;
  CudnnDescriptor deviceProp; // deviceless plans only
  CudnnDescriptor engineConfig;
  CudnnDescriptor executionPlan;
  size_t engineBytes = 0;
  std::string engineText;
  bool canExecute = false;
};

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_CUDA_CUDNNSDPA_H
