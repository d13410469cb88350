// How cuDNN is found at run time and the errors when it is not; the fused
// attention graphs building and finalizing for the shapes Piper trains; shape
// validation; and deviceless planning for a Hopper GPU. Runs on any machine
// with the toolkit (no GPU, no driver needed).
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>

#include "runtime/hal/cuda/CudnnLibrary.h"
#include "runtime/hal/cuda/CudnnSdpa.h"

using namespace piper;

using namespace piper::runtime;
using namespace piper::runtime::hal;

namespace {

/// Whether an object whose name contains `needle` is loaded in the process.
bool loaded(const std::string &needle) {
  struct Search {
    std::string needle;
    bool found = false;
  } search{needle};
  dl_iterate_phdr(
      [](struct dl_phdr_info *info, size_t, void *data) {
        auto *s = static_cast<Search *>(data);
        if (info->dlpi_name &&
            std::string(info->dlpi_name).find(s->needle) != std::string::npos)
          s->found = true;
        return 0;
      },
      &search);
  return search.found;
}

/// Sets (or unsets, for nullptr) an environment variable for one scope.
struct EnvVar {
  EnvVar(const char *name, const char *value) : name(name) {
    if (const char *old = std::getenv(name))
      saved = old, hadValue = true;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~EnvVar() {
    if (hadValue)
      setenv(name, saved.c_str(), 1);
    else
      unsetenv(name);
  }
  const char *name;
  std::string saved;
  bool hadValue = false;
};

/// A fresh directory under the test's temporary directory.
std::string tempDir() {
  const char *base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/cudnn_XXXXXX";
  REQUIRE(mkdtemp(dir.data()));
  return dir;
}

/// Creates `path` (an empty file) and its folders.
void touch(const std::string &path) {
  for (size_t i = 1; i < path.size(); ++i)
    if (path[i] == '/')
      mkdir(path.substr(0, i).c_str(), 0755);
  std::ofstream(path).put('\n');
}

/// The process's cuDNN; a failure fails the test (the toolkit, and with it
/// cuDNN, is on every machine that builds the CUDA parts).
const CudnnLibrary &requireCudnn() {
  unsetenv("PIPER_CUDNN_LIBRARY");
  const CudnnLibrary *lib = nullptr;
  Status st = cudnnLibrary(lib);
  INFO(st.message());
  REQUIRE(st);
  return *lib;
}

const SdpaShape kGpt2{8, 12, 12, 1024, 64, 0.125f};
const SdpaShape kLlama1B{4, 32, 8, 2048, 64, 0.125f};
const SdpaShape kHead128{1, 16, 16, 8192, 128, 0.08838835f};
const SdpaShape kTinyOdd{2, 4, 2, 7, 16, 0.25f};

/// An H200 (sm_90, 132 SMs) as CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION
/// describes it: the keys cuDNN 9.19 requires, values from the device's
/// attributes. The GPU test writes a measured one
/// ($PIPER_CUDNN_DEVICEPROP_OUT).
const char *kH200Json =
    R"({"deviceName": "NVIDIA H200", "deviceVer": 900, "smVersion": 90,)"
    R"( "driverVer": 13000, "cudaDeviceId": 0, "totalGlobalMem": 150754820096,)"
    R"( "maxGridSize": [2147483647, 65535, 65535],)"
    R"( "maxBlockSize": [1024, 1024, 64], "regsPerBlock": 65536,)"
    R"( "multiProcessorCount": 132, "warpSize": 32,)"
    R"( "maxSharedMemoryPerBlock": 49152,)"
    R"( "maxSharedMemoryPerBlockOptin": 232448,)"
    R"( "reservedSharedMemoryPerBlock": 1024, "maxRegistersPerSM": 65536,)"
    R"( "maxCtasPerSM": 32, "maxThreadsPerBlock": 1024,)"
    R"( "maxThreadsPerSM": 2048, "pciDeviceId": 0, "isTccDriver": 0,)"
    R"( "supportCoopLaunch": 1, "smClockRateKHz": 1980000,)"
    R"( "memClockRateKHz": 3201000, "l2CacheSize": 52428800})";

} // namespace

// First, before anything dlopens cuDNN: linking the attention code does not
// load libcudnn (no DT_NEEDED), so CPU-only users never need it.
TEST_CASE("linking cuDNN attention does not load libcudnn", "[cudnn]") {
  CHECK_FALSE(loaded("libcudnn"));
}

TEST_CASE("the cuDNN loader looks at PIPER_CUDNN_LIBRARY alone when it is set",
          "[cudnn]") {
  EnvVar env("PIPER_CUDNN_LIBRARY", nullptr);
  std::vector<std::string> found = cudnnLibraryCandidates();
  REQUIRE(found.size() >= 2);
  CHECK(found[0] == "libcudnn.so.9");
  CHECK(found[1] == "/usr/local/cuda/lib64/libcudnn.so.9");
  // Anything further is an existing wheel library.
  const std::string wheel = "/nvidia/cudnn/lib/libcudnn.so.9";
  for (size_t i = 2; i < found.size(); ++i) {
    INFO(found[i]);
    CHECK(found[i].size() > wheel.size());
    CHECK(found[i].compare(found[i].size() - wheel.size(), wheel.size(),
                           wheel) == 0);
    CHECK(access(found[i].c_str(), F_OK) == 0);
  }

  EnvVar chosen("PIPER_CUDNN_LIBRARY", "/opt/cudnn/libcudnn.so.9");
  CHECK(cudnnLibraryCandidates() ==
        std::vector<std::string>{"/opt/cudnn/libcudnn.so.9"});
}

TEST_CASE("the cuDNN loader finds PyTorch's wheel in a virtualenv and in "
          "~/.local",
          "[cudnn]") {
  EnvVar env("PIPER_CUDNN_LIBRARY", nullptr);
  std::string venv = tempDir(), home = tempDir();
  std::string inVenv =
      venv + "/lib/python3.12/site-packages/nvidia/cudnn/lib/libcudnn.so.9";
  std::string inHome = home + "/.local/lib/python3.11/site-packages/nvidia/"
                              "cudnn/lib/libcudnn.so.9";
  touch(inVenv);
  touch(inHome);
  // A site-packages without the wheel adds nothing.
  mkdir((venv + "/lib/python3.9").c_str(), 0755);
  mkdir((venv + "/lib/python3.9/site-packages").c_str(), 0755);
  EnvVar v("VIRTUAL_ENV", venv.c_str());
  EnvVar h("HOME", home.c_str());
  std::vector<std::string> found = cudnnLibraryCandidates();
  REQUIRE(found.size() >= 4);
  // The default places come first; the virtualenv before ~/.local.
  CHECK(found[0] == "libcudnn.so.9");
  CHECK(found[found.size() - 2] == inVenv);
  CHECK(found.back() == inHome);
}

TEST_CASE("a missing cuDNN library is a clear error naming what was tried",
          "[cudnn]") {
  EnvVar env("PIPER_CUDNN_LIBRARY", "/nonexistent/libcudnn.so.9");
  CudnnLibrary lib;
  Status st = openCudnnLibrary(lib);
  REQUIRE_FALSE(st);
  INFO(st.message());
  CHECK(st.message().find("cannot load the cuDNN library (libcudnn.so.9): "
                          "tried '/nonexistent/libcudnn.so.9' "
                          "(PIPER_CUDNN_LIBRARY): ") == 0);
  CHECK(st.message().find("No such file or directory") != std::string::npos);
  CHECK(st.message().find("Point PIPER_CUDNN_LIBRARY at libcudnn.so.9") !=
        std::string::npos);
  CHECK(st.message().find("--attention simt") != std::string::npos);
  CHECK(lib.handle == nullptr);
  CHECK_FALSE(loaded("libcudnn"));

  // The process-wide loader reports the same, and caches no failure.
  const CudnnLibrary *cached = nullptr;
  Status again = cudnnLibrary(cached);
  CHECK(again.message() == st.message());
  CHECK(cached == nullptr);
}

TEST_CASE("a library that is not cuDNN is named with the missing function",
          "[cudnn]") {
  EnvVar env("PIPER_CUDNN_LIBRARY", "libm.so.6");
  CudnnLibrary lib;
  Status st = openCudnnLibrary(lib);
  REQUIRE_FALSE(st);
  INFO(st.message());
  CHECK(st.message().find("'libm.so.6' (PIPER_CUDNN_LIBRARY): loaded, but it "
                          "does not define cudnnGetVersion (not cuDNN, or a "
                          "cuDNN older than 9.0)") != std::string::npos);
}

TEST_CASE("the toolkit's cuDNN loads, and its errors carry cuDNN's reason",
          "[cudnn]") {
  const CudnnLibrary &lib = requireCudnn();
  CHECK(lib.handle != nullptr);
  CHECK(lib.version >= 90000);
  CHECK(lib.cudnnBackendExecute != nullptr);
  CHECK(loaded("libcudnn"));
  const CudnnLibrary *again = nullptr;
  REQUIRE(cudnnLibrary(again));
  CHECK(again == &lib);

  // A tensor descriptor finalized without its attributes: the text names
  // the call, the status and cuDNN's own explanation.
  cudnnBackendDescriptor_t desc = nullptr;
  REQUIRE(lib.cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR,
                                           &desc) == CUDNN_STATUS_SUCCESS);
  CudnnDescriptor owned(&lib, desc);
  cudnnStatus_t st = lib.cudnnBackendFinalize(desc);
  REQUIRE(st != CUDNN_STATUS_SUCCESS);
  std::string text = lib.errorText("cudnnBackendFinalize(tensor)", st);
  INFO(text);
  CHECK(text.find("cudnnBackendFinalize(tensor) failed: CUDNN_STATUS_") == 0);
  CHECK(text.find(" (") != std::string::npos);
  CHECK(text.back() == ')');
}

// cuDNN versions with known flash-attention bugs are refused for what they
// get wrong, as cudnn-frontend guards them, so that `--attention auto` runs
// those calls on the SIMT kernels (and `cudnn` says why).
TEST_CASE("cuDNN versions with known attention bugs are refused", "[cudnn]") {
  SdpaShape odd = kGpt2;
  odd.seq = 1000; // not a multiple of 128
  for (bool backward : {false, true}) {
    INFO((backward ? "backward" : "forward"));
    for (size_t version : {91501u, 91900u, 92000u}) {
      CHECK(checkSdpaVersion(version, kGpt2, backward));
      CHECK(checkSdpaVersion(version, odd, backward));
    }
    CHECK(checkSdpaVersion(91400, kGpt2, backward));
    CHECK(checkSdpaVersion(91400, odd, backward).message() ==
          "cuDNN 9.14.0's flash attention backward is wrong for sequences "
          "that are not a multiple of 128 (seq 1000; fixed in cuDNN 9.15.1): "
          "load a newer cuDNN ($PIPER_CUDNN_LIBRARY)");
    CHECK_FALSE(checkSdpaVersion(91500, kTinyOdd, backward));
  }
  for (size_t version : {91000u, 91001u}) {
    CHECK(checkSdpaVersion(version, kGpt2, false));
    CHECK_FALSE(checkSdpaVersion(version, kGpt2, true));
  }
  CHECK(checkSdpaVersion(91001, kGpt2, true).message() ==
        "cuDNN 9.10.1's flash attention backward has known bugs "
        "(cudnn-frontend refuses it); load another cuDNN "
        "($PIPER_CUDNN_LIBRARY)");
  CHECK(checkSdpaVersion(91002, kGpt2, true));
  CHECK(sdpaMaskValue(90900) == std::numeric_limits<float>::lowest());
  CHECK(sdpaMaskValue(91000) == -std::numeric_limits<float>::infinity());
  CHECK(sdpaMaskValue(91900) == -std::numeric_limits<float>::infinity());
}

TEST_CASE("attention shapes are checked before any cuDNN call", "[cudnn]") {
  auto message = [](SdpaShape s, bool backward) {
    return validateSdpaShape(s, backward).message();
  };
  const std::string gpt2 = "invalid attention shape (batch 8, seq 1024, 12 "
                           "query / 12 key-value heads of 64): ";
  CHECK(validateSdpaShape(kGpt2, true));
  CHECK(validateSdpaShape(kLlama1B, true));
  CHECK(validateSdpaShape(kHead128, true));
  CHECK(validateSdpaShape(kTinyOdd, true));

  SdpaShape s = kGpt2;
  s.batch = 0;
  CHECK(message(s, false) == "invalid attention shape (batch 0, seq 1024, 12 "
                             "query / 12 key-value heads of 64): every size "
                             "must be positive");
  s = kGpt2;
  s.kvHeads = -1;
  CHECK(message(s, false).find("every size must be positive") !=
        std::string::npos);
  s = kGpt2;
  s.scale = std::numeric_limits<float>::quiet_NaN();
  CHECK(message(s, false) ==
        gpt2 + "the scale must be finite and positive, not nan");
  s.scale = 0;
  CHECK(message(s, false).find("the scale must be finite and positive") !=
        std::string::npos);
  s = kGpt2;
  s.kvHeads = 5;
  CHECK(message(s, false) == "invalid attention shape (batch 8, seq 1024, 12 "
                             "query / 5 key-value heads of 64): the query "
                             "heads must be a multiple of the key-value heads");
  s = kGpt2;
  s.headDim = 60;
  CHECK(message(s, false).find("the head dimension must be a multiple of 8 "
                               "(16-byte rows)") != std::string::npos);
  s.headDim = 264;
  CHECK(message(s, false).find("cuDNN's flash attention takes head "
                               "dimensions up to 256") != std::string::npos);
  s.headDim = 256;
  CHECK(validateSdpaShape(s, true));
  s = kGpt2;
  s.seq = 1;
  CHECK(validateSdpaShape(s, false));
  CHECK(message(s, true).find("cuDNN's flash attention backward needs seq >= "
                              "2") != std::string::npos);
  s = kGpt2;
  s.batch = int64_t(1) << 32;
  s.seq = int64_t(1) << 20;
  CHECK(message(s, false).find("its element counts overflow int64") !=
        std::string::npos);

  // buildSdpaGraph refuses the same shapes with the same words.
  const CudnnLibrary &lib = requireCudnn();
  SdpaGraph g;
  s = kGpt2;
  s.headDim = 60;
  Status built = buildSdpaGraph(lib, s, false, g);
  CHECK(built.message() == validateSdpaShape(s, false).message());
  CHECK(g.graph.get() == nullptr);
}

TEST_CASE("the forward and backward attention graphs build and finalize "
          "without a GPU",
          "[cudnn]") {
  const CudnnLibrary &lib = requireCudnn();
  for (const SdpaShape &s : {kGpt2, kLlama1B, kHead128, kTinyOdd}) {
    for (int pass = 0; pass < 3; ++pass) {
      const bool backward = pass > 0, accumulateDq = pass == 2;
      INFO(describeSdpaShape(s) << (backward ? " backward" : " forward")
                                << (accumulateDq ? " (dQ accumulator)" : ""));
      SdpaGraph g;
      Status st = buildSdpaGraph(lib, s, backward, g, accumulateDq);
      INFO(st.message());
      REQUIRE(st);
      CHECK(g.graph.get() != nullptr);
      CHECK(g.engineCount > 0);
      CHECK(g.backward == backward);
      CHECK(g.accumulateDq == accumulateDq);
      CHECK(g.shape.seq == s.seq);

      // By-value scalars: the scale and the mask's -inf (and the backward's
      // softmax-sum factor 1).
      REQUIRE(g.scalars.size() == (backward ? 3u : 2u));
      CHECK(g.scalars[0].uid == SdpaUid::Scale);
      CHECK(g.scalars[0].value == s.scale);
      CHECK(g.scalars[1].uid == SdpaUid::NegInf);
      CHECK(std::isinf(g.scalars[1].value));
      CHECK(g.scalars[1].value < 0);
      if (backward) {
        CHECK(g.scalars[2].uid == SdpaUid::One);
        CHECK(g.scalars[2].value == 1.0f);
      }

      // Scratch: none forward; backward rowsum(dO * O) and, with the
      // accumulator, fp32 dQ, each 256-byte aligned.
      const size_t rows = size_t(s.batch * s.heads * s.seq);
      if (!backward) {
        CHECK(g.scratch.empty());
        CHECK(g.scratchBytes == 0);
        continue;
      }
      REQUIRE(g.scratch.size() == (accumulateDq ? 2u : 1u));
      CHECK(g.scratch[0].uid == SdpaUid::SoftmaxSum);
      CHECK(g.scratch[0].offset == 0);
      CHECK(g.scratch[0].bytes == rows * 4);
      size_t end = (rows * 4 + 255) / 256 * 256;
      if (accumulateDq) {
        CHECK(g.scratch[1].uid == SdpaUid::DqAccum);
        CHECK(g.scratch[1].offset == end);
        CHECK(g.scratch[1].bytes == rows * size_t(s.headDim) * 4);
        end += (rows * size_t(s.headDim) * 4 + 255) / 256 * 256;
      }
      CHECK(g.scratchBytes == end);
    }
  }
}

TEST_CASE("planning needs a handle, or a device description without one",
          "[cudnn]") {
  const CudnnLibrary &lib = requireCudnn();
  std::unique_ptr<SdpaPlan> plan;
  Status st = SdpaPlan::create(lib, nullptr, kGpt2, false, false, plan);
  CHECK(st.message() == "planning cuDNN attention needs a cuDNN handle "
                        "(cudnnCreate on the GPU it runs on)");
  CHECK(plan == nullptr);

  st = SdpaPlan::createDeviceless(lib, "not json", kGpt2, false, false, plan);
  INFO(st.message());
  CHECK(st.message().find("planning cuDNN's causal attention forward (batch "
                          "8, seq 1024, 12 query / 12 key-value heads of 64) "
                          "without a GPU: cudnnBackendFinalize(device "
                          "properties) failed: CUDNN_STATUS_BAD_PARAM") == 0);
  CHECK(plan == nullptr);

  // Reading a GPU's description needs that GPU.
  std::string json;
  st = cudnnDevicePropJson(lib, 0, json);
  if (!st) {
    INFO(st.message());
    CHECK(st.message().find("reading the properties of GPU 0: "
                            "cudnnBackendFinalize(device properties) failed: "
                            "CUDNN_STATUS_") == 0);
  } else {
    CHECK(json.find("multiProcessorCount") != std::string::npos);
  }
}

// Last: where no driver is installed this loads the toolkit's libcuda stub
// into the process, which cuDNN needs for its runtime-compiled engines
// (NVRTC) even when planning without a GPU.
TEST_CASE("deviceless planning picks a deterministic engine for a Hopper GPU",
          "[cudnn]") {
  const CudnnLibrary &lib = requireCudnn();
  if (!dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) {
    // Without the driver, heuristics drop every flash engine.
    std::unique_ptr<SdpaPlan> none;
    Status st =
        SdpaPlan::createDeviceless(lib, kH200Json, kGpt2, false, false, none);
    CHECK(st.message() ==
          "cuDNN has no deterministic engine for causal attention forward "
          "(batch 8, seq 1024, 12 query / 12 key-value heads of 64): "
          "heuristics proposed none (cuDNN's flash engines compile at run "
          "time and need the CUDA driver, libcuda.so.1; CUDNN_LOGERR_DBG=1 "
          "CUDNN_LOGDEST_DBG=stderr shows cuDNN's reasons)");
    void *stub = dlopen("/usr/local/cuda/lib64/stubs/libcuda.so",
                        RTLD_NOW | RTLD_GLOBAL);
    INFO("no libcuda.so.1 and no toolkit stub: " << dlerror());
    REQUIRE(stub != nullptr);
  }
  for (const SdpaShape &s : {kGpt2, kLlama1B, kTinyOdd}) {
    INFO(describeSdpaShape(s));
    std::unique_ptr<SdpaPlan> fwd, bwd;
    Status st =
        SdpaPlan::createDeviceless(lib, kH200Json, s, false, false, fwd);
    INFO(st.message());
    REQUIRE(st);
    CHECK_FALSE(fwd->executable());
    CHECK(fwd->description().find("engine ") == 0);
    CHECK(fwd->description().find("nondeterministic") == std::string::npos);

    st = SdpaPlan::createDeviceless(lib, kH200Json, s, true, false, bwd);
    INFO(st.message());
    REQUIRE(st);
    INFO(bwd->description());
    CHECK(bwd->description().find("engine ") == 0);
    CHECK(bwd->description().find("nondeterministic") == std::string::npos);
    CHECK_FALSE(bwd->sdpaGraph().accumulateDq);
    // The deterministic backward keeps dS in the workspace: [B, H, T, T]
    // bf16 (cuDNN 9.19 on sm_90), besides the fp32 softmax-sum scratch.
    CHECK(bwd->workspaceBytes() >=
          size_t(s.batch * s.heads * s.seq * s.seq) * 2);

    // A deviceless plan cannot run, and says so.
    CHECK(bwd->backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                        nullptr)
              .message() == "this cuDNN attention plan was made without a "
                            "GPU and cannot run");
    CHECK(bwd->forward(nullptr, nullptr, nullptr, nullptr, nullptr).message() ==
          "forward called on a backward attention plan");
    std::string json;
    Status planned = bwd->planJson(json);
    if (bwd->description().find("execution plan not finalized") !=
        std::string::npos)
      CHECK(planned.message() == "this cuDNN attention plan has no finalized "
                                 "execution plan (it was planned without a "
                                 "GPU)");
    else
      CHECK(json.size() > 0);
  }
}
