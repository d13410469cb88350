// The CPU kernels' registry, attribute decoding, and the errors every
// kernel shares (operand counts, shapes, dtypes, storage, empty batches).
#include "runtime/kernels/kernels_test_util.h"

TEST_CASE("kernelNames lists every kernel once", "[kernels]") {
  std::vector<std::string> names = kernelNames();
  std::set<std::string> unique(names.begin(), names.end());
  CHECK(unique.size() == names.size());
  const std::vector<std::string> spec = {"embedding",
                                         "position_add",
                                         "layer_norm",
                                         "rms_norm",
                                         "add_layer_norm",
                                         "add_rms_norm",
                                         "qk_norm",
                                         "linear",
                                         "gelu",
                                         "linear_gelu",
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
                                         "layer_norm_grad_input_add",
                                         "rms_norm_grad_input_add",
                                         "qk_norm_grad_input",
                                         "qk_norm_grad_weight",
                                         "linear_grad_input",
                                         "columns_grad",
                                         "cp_split_grad",
                                         "tp_kv_assemble_grad",
                                         "linear_grad_weight",
                                         "bias_grad",
                                         "linear_grad_weight_bias",
                                         "gelu_grad",
                                         "linear_grad_input_gelu",
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
                                         "cross_entropy_fused",
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
      {KernelAttr::kAccumulate, "accumulate"},
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
      {KernelAttr::kValidCols, "valid_cols"},
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
  // Its bf16 copy is fp32 storage or packed, not both.
  std::vector<float> copy(2);
  std::vector<uint16_t> packed(2);
  ctx.step = 1;
  ctx.bf16Copy = copy.data();
  ctx.bf16PackedCopy = packed.data();
  s = run(K("adamw").f("lr", 0.1), grad, adamOuts, ctx);
  CHECK(s.message() == "adamw: a bf16 copy and a packed bf16 copy at once");
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
