// cuDNN's fused causal attention on a GPU (tag gpu): forward and backward on
// random bf16 data against a double-precision reference, bitwise
// determinism, deviceless planning from the GPU's own description, and the
// engines and workspaces chosen at the shapes Piper trains. Writes the
// device description to $PIPER_CUDNN_DEVICEPROP_OUT when set (for deviceless
// tests on machines without this GPU).
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "runtime/hal/cuda/CudnnLibrary.h"
#include "runtime/hal/cuda/CudnnSdpa.h"
#include "support/Precision.h"

using namespace piper;

using namespace piper::runtime;
using namespace piper::runtime::hal;

namespace {

#define CUDA_REQUIRE(expr)                                                     \
  do {                                                                         \
    cudaError_t err_ = (expr);                                                 \
    INFO(#expr << ": " << cudaGetErrorString(err_));                           \
    REQUIRE(err_ == cudaSuccess);                                              \
  } while (0)

/// cudaMalloc'ed bytes, freed at scope end.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) : bytes(bytes) {
    if (bytes)
      CUDA_REQUIRE(cudaMalloc(&ptr, bytes));
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  template <typename T> void upload(const std::vector<T> &host) {
    REQUIRE(host.size() * sizeof(T) == bytes);
    CUDA_REQUIRE(cudaMemcpy(ptr, host.data(), bytes, cudaMemcpyHostToDevice));
  }
  template <typename T> std::vector<T> download() const {
    std::vector<T> host(bytes / sizeof(T));
    CUDA_REQUIRE(cudaMemcpy(host.data(), ptr, bytes, cudaMemcpyDeviceToHost));
    return host;
  }
  void *ptr = nullptr;
  size_t bytes;
};

/// The library and a handle on GPU 0, once per process.
struct Cudnn {
  const CudnnLibrary *lib = nullptr;
  cudnnHandle_t handle = nullptr;
  Cudnn() {
    CUDA_REQUIRE(cudaSetDevice(0));
    Status st = cudnnLibrary(lib);
    INFO(st.message());
    REQUIRE(st);
    cudnnStatus_t cs = lib->cudnnCreate(&handle);
    INFO(lib->errorText("cudnnCreate", cs));
    REQUIRE(cs == CUDNN_STATUS_SUCCESS);
  }
};
Cudnn &cudnn() {
  static Cudnn instance;
  return instance;
}

std::vector<uint16_t> randomBf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> out(n);
  for (uint16_t &x : out)
    x = floatToBf16(dist(rng));
  return out;
}

// Error bounds. bf16 keeps 8 significant bits: rounding to it changes a
// value by at most u = 2^-8 of its magnitude. Every output cuDNN produces
// here is a sum over keys (or queries) of a product a * b where one factor
// is an exact bf16 input (V, dO, K or Q) and the other is computed in fp32
// and rounded to bf16 before the tensor-core matmul: P before P @ V and
// P^T @ dO, dS before dS @ K and dS^T @ Q. The matmul accumulates in fp32
// (error <= n * 2^-24 * sum|a b| <= 2^-11 * sum|a b| for n <= 8192) and the
// result is rounded to bf16 once more. So with M = sum |a| |b| (computed by
// the reference alongside each output):
//   |out - ref| <= u * M + 2^-11 * M + u * |ref|.
// dS = P * (dP - D) is computed in fp32 from dP = dO . V and D = rowsum(dO *
// O); its fp32 error is bounded by 2^-11 of P * (|dP| + |D|), so for dQ and
// dK the reference uses |dS| <= P * (|dP| + |D|) in M. We allow twice u * M
// (the recomputed P and the stats differ from the reference's at fp32
// level, and fp32 exp/log add relative errors far below 2^-11). Stats
// (logsumexp, fp32 throughout) are off by at most the fp32 error of the
// scores (D * 2^-24 * scale * sum|q k|) plus that of the sum of T
// exponentials (T * 2^-24, relative): (T + 8 * D) * 2^-22 absolute covers
// both for |q|, |k| <= 1.
const double kU = 1.0 / 256;

double outputBound(double magnitude, double ref) {
  return 2 * kU * magnitude + std::ldexp(magnitude, -11) + kU * std::fabs(ref);
}

/// Double-precision causal GQA attention on the packed layout, with the
/// magnitudes the error bounds need.
struct Reference {
  SdpaShape s;
  int64_t cols;
  std::vector<double> o, oMag, stats; // forward
  std::vector<double> dqkv, dqkvMag;  // backward, qkv's layout
  double at(const std::vector<uint16_t> &x, int64_t b, int64_t t,
            int64_t col) const {
    return bf16ToFloat(x[size_t((b * s.seq + t) * cols + col)]);
  }

  explicit Reference(const SdpaShape &shape)
      : s(shape), cols((shape.heads + 2 * shape.kvHeads) * shape.headDim) {}

  /// Row i of P for (b, h), p[j] for j <= i; returns the row's logsumexp.
  double row(const std::vector<uint16_t> &qkv, int64_t b, int64_t h, int64_t i,
             double *p) const {
    const int64_t D = s.headDim, g = h / (s.heads / s.kvHeads);
    double m = -INFINITY;
    for (int64_t j = 0; j <= i; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d)
        dot += at(qkv, b, i, h * D + d) * at(qkv, b, j, (s.heads + g) * D + d);
      p[j] = dot * s.scale;
      m = std::max(m, p[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j <= i; ++j)
      sum += std::exp(p[j] - m);
    for (int64_t j = 0; j <= i; ++j)
      p[j] = std::exp(p[j] - m) / sum;
    return m + std::log(sum);
  }

  /// P[i][j] for one (b, h), and each row's logsumexp into `lse`.
  void probabilities(const std::vector<uint16_t> &qkv, int64_t b, int64_t h,
                     std::vector<double> &p, std::vector<double> *lse) const {
    const int64_t T = s.seq;
    p.assign(size_t(T * T), 0.0);
    for (int64_t i = 0; i < T; ++i) {
      double l = row(qkv, b, h, i, &p[size_t(i * T)]);
      if (lse)
        (*lse)[size_t(i)] = l;
    }
  }

  void forward(const std::vector<uint16_t> &qkv) {
    const int64_t B = s.batch, H = s.heads, T = s.seq, D = s.headDim;
    const int64_t g0 = H / s.kvHeads;
    o.assign(size_t(B * T * H * D), 0.0);
    oMag = o;
    stats.assign(size_t(B * H * T), 0.0);
    std::vector<double> p, lse(static_cast<size_t>(T));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        probabilities(qkv, b, h, p, &lse);
        const int64_t vCol = (H + s.kvHeads + h / g0) * D;
        for (int64_t i = 0; i < T; ++i) {
          stats[size_t((b * H + h) * T + i)] = lse[size_t(i)];
          for (int64_t d = 0; d < D; ++d) {
            double acc = 0, mag = 0;
            for (int64_t j = 0; j <= i; ++j) {
              double v = at(qkv, b, j, vCol + d);
              acc += p[size_t(i * T + j)] * v;
              mag += p[size_t(i * T + j)] * std::fabs(v);
            }
            o[size_t((b * T + i) * H * D + h * D + d)] = acc;
            oMag[size_t((b * T + i) * H * D + h * D + d)] = mag;
          }
        }
      }
  }

  /// Gradients for dO given cuDNN's own forward output `oDev` (D = rowsum(dO
  /// * O) uses the O the backward pass reads).
  void backward(const std::vector<uint16_t> &qkv,
                const std::vector<uint16_t> &oDev,
                const std::vector<uint16_t> &dO) {
    const int64_t B = s.batch, H = s.heads, T = s.seq, D = s.headDim;
    const int64_t g0 = H / s.kvHeads;
    dqkv.assign(size_t(B * T * cols), 0.0);
    dqkvMag = dqkv;
    std::vector<double> p, dS(size_t(T * T)), dSMag(size_t(T * T));
    auto out = [&](int64_t b, int64_t t, int64_t col) {
      return size_t((b * T + t) * cols + col);
    };
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        probabilities(qkv, b, h, p, nullptr);
        const int64_t g = h / g0, qCol = h * D, kCol = (H + g) * D,
                      vCol = (H + s.kvHeads + g) * D;
        for (int64_t i = 0; i < T; ++i) {
          double rowD = 0, rowDMag = 0;
          for (int64_t d = 0; d < D; ++d) {
            size_t k = size_t((b * T + i) * H * D + h * D + d);
            rowD += bf16ToFloat(dO[k]) * bf16ToFloat(oDev[k]);
            rowDMag += std::fabs(bf16ToFloat(dO[k]) * bf16ToFloat(oDev[k]));
          }
          for (int64_t j = 0; j <= i; ++j) {
            double dP = 0, dPMag = 0;
            for (int64_t d = 0; d < D; ++d) {
              double x =
                  bf16ToFloat(dO[size_t((b * T + i) * H * D + h * D + d)]) *
                  at(qkv, b, j, vCol + d);
              dP += x;
              dPMag += std::fabs(x);
            }
            double pij = p[size_t(i * T + j)];
            dS[size_t(i * T + j)] = pij * (dP - rowD);
            dSMag[size_t(i * T + j)] = pij * (dPMag + rowDMag);
          }
        }
        for (int64_t i = 0; i < T; ++i)
          for (int64_t j = 0; j <= i; ++j) {
            double ds = dS[size_t(i * T + j)] * s.scale;
            double dsMag = dSMag[size_t(i * T + j)] * s.scale;
            double pij = p[size_t(i * T + j)];
            for (int64_t d = 0; d < D; ++d) {
              double qi = at(qkv, b, i, qCol + d), kj = at(qkv, b, j, kCol + d);
              double doi =
                  bf16ToFloat(dO[size_t((b * T + i) * H * D + h * D + d)]);
              dqkv[out(b, i, qCol + d)] += ds * kj;
              dqkvMag[out(b, i, qCol + d)] += dsMag * std::fabs(kj);
              dqkv[out(b, j, kCol + d)] += ds * qi;
              dqkvMag[out(b, j, kCol + d)] += dsMag * std::fabs(qi);
              dqkv[out(b, j, vCol + d)] += pij * doi;
              dqkvMag[out(b, j, vCol + d)] += pij * std::fabs(doi);
            }
          }
      }
  }
};

/// How many of `got` (bf16) exceed their bound around `ref`; the worst
/// excess ratio in `worst`.
size_t countOutside(const std::vector<uint16_t> &got,
                    const std::vector<double> &ref,
                    const std::vector<double> &mag, double &worst,
                    size_t &firstBad) {
  size_t bad = 0;
  worst = 0;
  firstBad = got.size();
  for (size_t i = 0; i < got.size(); ++i) {
    double v = bf16ToFloat(got[i]);
    double err = std::fabs(v - ref[i]);
    double bound = outputBound(mag[i], ref[i]);
    worst = std::max(worst, bound > 0 ? err / bound : (err > 0 ? 1e9 : 0));
    if (!(err <= bound)) {
      if (!bad)
        firstBad = i;
      ++bad;
    }
  }
  return bad;
}

/// Runs forward and backward of `shape` and checks them against the
/// reference; with `allowNondeterministic` the fp32-accumulator backward.
void checkShape(const SdpaShape &shape, bool allowNondeterministic) {
  Cudnn &c = cudnn();
  INFO(describeSdpaShape(shape)
       << (allowNondeterministic ? ", nondeterminism allowed" : ""));
  std::unique_ptr<SdpaPlan> fwd, bwd;
  Status st = SdpaPlan::create(*c.lib, c.handle, shape, false,
                               allowNondeterministic, fwd);
  INFO(st.message());
  REQUIRE(st);
  st = SdpaPlan::create(*c.lib, c.handle, shape, true, allowNondeterministic,
                        bwd);
  INFO(st.message());
  REQUIRE(st);
  CHECK(fwd->executable());
  CHECK(bwd->executable());
  std::printf("cudnn sdpa %s%s:\n  forward %s, workspace %zu\n  backward %s, "
              "workspace %zu\n",
              describeSdpaShape(shape).c_str(),
              allowNondeterministic ? " (nondeterminism allowed)" : "",
              fwd->description().c_str(), fwd->workspaceBytes(),
              bwd->description().c_str(), bwd->workspaceBytes());

  const int64_t B = shape.batch, H = shape.heads, T = shape.seq,
                Dh = shape.headDim;
  const int64_t cols = (H + 2 * shape.kvHeads) * Dh;
  const size_t qkvN = size_t(B * T * cols), oN = size_t(B * T * H * Dh);
  std::vector<uint16_t> qkv = randomBf16(qkvN, 1234u + uint32_t(T));
  std::vector<uint16_t> dO = randomBf16(oN, 99u + uint32_t(H));

  DeviceBuffer dQkv(qkvN * 2), dOut(oN * 2), dStats(size_t(B * H * T) * 4),
      dDo(oN * 2), dDqkv(qkvN * 2),
      ws(std::max(fwd->workspaceBytes(), bwd->workspaceBytes()));
  dQkv.upload(qkv);
  dDo.upload(dO);
  CUDA_REQUIRE(cudaMemset(dOut.ptr, 0xFF, dOut.bytes)); // NaN until written
  CUDA_REQUIRE(cudaMemset(dStats.ptr, 0xFF, dStats.bytes));

  st = fwd->forward(c.handle, dQkv.ptr, dOut.ptr,
                    static_cast<float *>(dStats.ptr), ws.ptr);
  INFO(st.message());
  REQUIRE(st);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  std::vector<uint16_t> o = dOut.download<uint16_t>();
  std::vector<float> stats = dStats.download<float>();

  Reference ref(shape);
  ref.forward(qkv);
  double worst = 0;
  size_t first = 0;
  size_t bad = countOutside(o, ref.o, ref.oMag, worst, first);
  INFO("O: worst error / bound " << worst);
  INFO((bad ? "first O outside at " + std::to_string(first) + ": " +
                  std::to_string(bf16ToFloat(o[first])) + " vs " +
                  std::to_string(ref.o[first])
            : std::string("all O within bounds")));
  CHECK(bad == 0);
  const double statsBound = std::ldexp(double(T + 8 * Dh), -22);
  size_t statsBad = 0;
  for (size_t i = 0; i < stats.size(); ++i)
    statsBad += !(std::fabs(stats[i] - ref.stats[i]) <= statsBound);
  CHECK(statsBad == 0);

  // Backward from cuDNN's own O and Stats; dqkv starts as NaN so that an
  // element cuDNN does not write fails the comparison.
  CUDA_REQUIRE(cudaMemset(dDqkv.ptr, 0xFF, dDqkv.bytes));
  st = bwd->backward(c.handle, dQkv.ptr, dOut.ptr, dDo.ptr,
                     static_cast<const float *>(dStats.ptr), dDqkv.ptr, ws.ptr);
  INFO(st.message());
  REQUIRE(st);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  std::vector<uint16_t> grad = dDqkv.download<uint16_t>();
  ref.backward(qkv, o, dO);
  bad = countOutside(grad, ref.dqkv, ref.dqkvMag, worst, first);
  INFO("dQKV: worst error / bound " << worst);
  INFO((bad ? "first dQKV element outside at row " +
                  std::to_string(first / size_t(cols)) + " column " +
                  std::to_string(first % size_t(cols)) + ": " +
                  std::to_string(bf16ToFloat(grad[first])) + " vs " +
                  std::to_string(ref.dqkv[first])
            : std::string("all dQKV within bounds")));
  CHECK(bad == 0);

  // The same inputs again: the same bits (forward and backward).
  CUDA_REQUIRE(cudaMemset(dDqkv.ptr, 0, dDqkv.bytes));
  REQUIRE(fwd->forward(c.handle, dQkv.ptr, dOut.ptr,
                       static_cast<float *>(dStats.ptr), ws.ptr));
  REQUIRE(bwd->backward(c.handle, dQkv.ptr, dOut.ptr, dDo.ptr,
                        static_cast<const float *>(dStats.ptr), dDqkv.ptr,
                        ws.ptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(dOut.download<uint16_t>() == o);
  CHECK(dStats.download<float>() == stats);
  bool same = dDqkv.download<uint16_t>() == grad;
  if (allowNondeterministic) {
    // cuDNN does not flag its dQ-accumulator engine nondeterministic; say
    // what it did.
    std::printf("  backward twice with the dQ accumulator: %s\n",
                same ? "same bits" : "different bits");
  } else {
    CHECK(same);
  }
}

/// Forward and backward at a training shape: finite outputs, a few rows of
/// O against the reference, timings.
void runLarge(const SdpaShape &shape) {
  Cudnn &c = cudnn();
  INFO(describeSdpaShape(shape));
  std::unique_ptr<SdpaPlan> fwd, bwd;
  Status st = SdpaPlan::create(*c.lib, c.handle, shape, false, false, fwd);
  INFO(st.message());
  REQUIRE(st);
  st = SdpaPlan::create(*c.lib, c.handle, shape, true, false, bwd);
  INFO(st.message());
  REQUIRE(st);
  const int64_t B = shape.batch, H = shape.heads, T = shape.seq,
                Dh = shape.headDim;
  const size_t qkvN = size_t(B * T * (H + 2 * shape.kvHeads) * Dh),
               oN = size_t(B * T * H * Dh);
  DeviceBuffer dQkv(qkvN * 2), dOut(oN * 2), dStats(size_t(B * H * T) * 4),
      dDo(oN * 2), dDqkv(qkvN * 2),
      ws(std::max(fwd->workspaceBytes(), bwd->workspaceBytes()));
  std::vector<uint16_t> qkv = randomBf16(qkvN, 7);
  dQkv.upload(qkv);
  dDo.upload(randomBf16(oN, 8));
  auto timed = [&](auto &&fn) {
    REQUIRE(fn()); // warm-up (and the first launch's compilation)
    CUDA_REQUIRE(cudaDeviceSynchronize());
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 5; ++i)
      REQUIRE(fn());
    CUDA_REQUIRE(cudaDeviceSynchronize());
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now() - t0)
               .count() /
           5;
  };
  double fwdMs = timed([&] {
    return fwd->forward(c.handle, dQkv.ptr, dOut.ptr,
                        static_cast<float *>(dStats.ptr), ws.ptr);
  });
  double bwdMs = timed([&] {
    return bwd->backward(c.handle, dQkv.ptr, dOut.ptr, dDo.ptr,
                         static_cast<const float *>(dStats.ptr), dDqkv.ptr,
                         ws.ptr);
  });
  std::printf("cudnn sdpa %s: forward %.3f ms (%s, workspace %zu), backward "
              "%.3f ms (%s, workspace %zu)\n",
              describeSdpaShape(shape).c_str(), fwdMs,
              fwd->description().c_str(), fwd->workspaceBytes(), bwdMs,
              bwd->description().c_str(), bwd->workspaceBytes());
  std::vector<uint16_t> o = dOut.download<uint16_t>();
  std::vector<uint16_t> grad = dDqkv.download<uint16_t>();
  size_t nonFinite = 0;
  for (uint16_t x : o)
    nonFinite += !std::isfinite(bf16ToFloat(x));
  for (uint16_t x : grad)
    nonFinite += !std::isfinite(bf16ToFloat(x));
  CHECK(nonFinite == 0);

  // Rows 0, 1, T/2 and T-1 of batch 0, every head, against the reference.
  Reference ref(shape);
  std::vector<double> p(static_cast<size_t>(T));
  size_t bad = 0;
  for (int64_t h = 0; h < H; ++h) {
    const int64_t vCol = (H + shape.kvHeads + h / (H / shape.kvHeads)) * Dh;
    for (int64_t i : {int64_t(0), int64_t(1), T / 2, T - 1}) {
      ref.row(qkv, 0, h, i, p.data());
      for (int64_t d = 0; d < Dh; ++d) {
        double acc = 0, mag = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double v = ref.at(qkv, 0, j, vCol + d);
          acc += p[size_t(j)] * v;
          mag += p[size_t(j)] * std::fabs(v);
        }
        double got = bf16ToFloat(o[size_t(i * H * Dh + h * Dh + d)]);
        bad += !(std::fabs(got - acc) <= outputBound(mag, acc));
      }
    }
  }
  CHECK(bad == 0);
}

} // namespace

TEST_CASE("cuDNN causal attention matches the reference, deterministically",
          "[cudnn][gpu]") {
  checkShape({2, 4, 4, 128, 64, 0.125f}, false);      // MHA, a 64 multiple
  checkShape({2, 8, 2, 100, 64, 0.125f}, false);      // GQA, seq not 64k
  checkShape({1, 4, 1, 192, 128, 0.0883883f}, false); // MQA, head dim 128
  checkShape({2, 4, 2, 7, 16, 0.25f}, false);         // tiny and odd
}

TEST_CASE("cuDNN causal attention with the dQ accumulator matches the "
          "reference",
          "[cudnn][gpu]") {
  checkShape({2, 8, 2, 100, 64, 0.125f}, true);
  checkShape({2, 4, 4, 256, 64, 0.125f}, true);
}

TEST_CASE("cuDNN causal attention runs at GPT-2's and Llama-1B's shapes",
          "[cudnn][gpu]") {
  runLarge({8, 12, 12, 1024, 64, 0.125f});
  runLarge({4, 32, 8, 2048, 64, 0.125f});
}

TEST_CASE("this GPU's description plans the same engines without it",
          "[cudnn][gpu]") {
  Cudnn &c = cudnn();
  std::string json;
  Status st = cudnnDevicePropJson(*c.lib, 0, json);
  INFO(st.message());
  REQUIRE(st);
  std::printf("cudnn deviceprop JSON: %zu bytes\n", json.size());
  CHECK(json.find("multiProcessorCount") != std::string::npos);
  if (const char *out = std::getenv("PIPER_CUDNN_DEVICEPROP_OUT")) {
    std::ofstream(out) << json;
    std::printf("cudnn deviceprop JSON written to %s\n", out);
  }
  const SdpaShape shape{4, 32, 8, 2048, 64, 0.125f};
  for (bool backward : {false, true}) {
    std::unique_ptr<SdpaPlan> online, offline;
    st = SdpaPlan::create(*c.lib, c.handle, shape, backward, false, online);
    INFO(st.message());
    REQUIRE(st);
    st = SdpaPlan::createDeviceless(*c.lib, json, shape, backward, false,
                                    offline);
    INFO(st.message());
    REQUIRE(st);
    CHECK_FALSE(offline->executable());
    // "engine N (knobs ...)": the same engine and knobs either way.
    const std::string a = online->description(), b = offline->description();
    INFO(a << " / " << b);
    CHECK(a.substr(0, a.find(')')) == b.substr(0, b.find(')')));
    CHECK(offline->workspaceBytes() == online->workspaceBytes());
    std::string planJson;
    st = online->planJson(planJson);
    INFO(st.message());
    CHECK(st);
    CHECK(planJson.size() > 0);
  }
}
