// Cases of the layer GPU kernels (KernelCases.h): embedding, position
// embedding, layer norm and RMS norm, forward and backward (also fused with
// the residual stream's add).
#include <array>

#include "runtime/hal/gpu/test/KernelCases.h"

namespace piper::runtime::hal::testing {
namespace {

std::string dims(std::initializer_list<int64_t> ds) {
  std::string s;
  for (int64_t d : ds)
    s += (s.empty() ? "" : "x") + std::to_string(d);
  return s;
}

void embeddingCases(std::vector<KernelCase> &out) {
  // (ids shape, vocab, hidden): one token; odd sizes; [B,S] ids; many
  // repeats of few ids (long buckets); more rows than one sort chunk
  // (LayerMath.h: 64 rows) and than kMaxChunks chunks of it; a vocabulary of
  // several scan tiles (1024 ids).
  struct Shape {
    std::vector<int64_t> ids;
    int64_t vocab, hidden;
  };
  for (const Shape &s : std::vector<Shape>{{{1}, 1, 1},
                                           {{2, 5}, 7, 13},
                                           {{4, 33}, 50, 65},
                                           {{1000}, 3, 17},
                                           {{3001}, 1000, 8},
                                           {{5000}, 2500, 4},
                                           {{70001}, 5, 3},
                                           {{0}, 4, 3}}) {
    int64_t rows = 1;
    for (int64_t d : s.ids)
      rows *= d;
    std::string n =
        dims({rows, s.vocab, s.hidden}) + (s.ids.size() == 2 ? " [B,S]" : "");
    out.push_back({"embedding " + n,
                   "embedding",
                   {},
                   {tokens(s.ids, s.vocab), f32({s.vocab, s.hidden})},
                   {zeros({rows, s.hidden})}});
    // dtable starts non-zero: every element is written (ids that do not
    // occur get zeros).
    out.push_back({"embedding_grad " + n,
                   "embedding_grad",
                   {{"vocab", intAttr(s.vocab)}},
                   {tokens(s.ids, s.vocab), f32({rows, s.hidden})},
                   {f32({s.vocab, s.hidden})}});
    // Vocabulary parallelism: each member of 3 holds `vocab` of the 3
    // vocab ids; other members' ids give zero rows and no gradient.
    const int64_t members = 3;
    for (int64_t m = 0; m < members && rows > 0; ++m) {
      std::string v = n + " member " + std::to_string(m) + " of 3";
      KernelCase fwd{"embedding " + v,
                     "embedding",
                     {{"members", intAttr(members)}},
                     {tokens(s.ids, s.vocab * members),
                      f32({s.vocab, s.hidden})},
                     {f32({rows, s.hidden})}};
      KernelCase bwd{"embedding_grad " + v,
                     "embedding_grad",
                     {{"vocab", intAttr(s.vocab)},
                      {"members", intAttr(members)}},
                     {tokens(s.ids, s.vocab * members), f32({rows, s.hidden})},
                     {f32({s.vocab, s.hidden})}};
      fwd.tensorMember = bwd.tensorMember = m;
      out.push_back(fwd);
      out.push_back(bwd);
    }
  }
}

void positionCases(std::vector<KernelCase> &out) {
  // (rows, hidden, seq, positions): size 1; P == seq; P > seq (the rows
  // past seq get zero gradients); a batch over one column chunk (64
  // rows, LayerMath.h) and over kMaxChunks chunks.
  struct Shape {
    int64_t rows, hidden, seq, positions;
  };
  for (const Shape &s : std::vector<Shape>{{1, 1, 1, 1},
                                           {6, 5, 3, 3},
                                           {12, 7, 4, 9},
                                           {600, 3, 2, 5},
                                           {20000, 3, 1, 2},
                                           {0, 3, 2, 2}}) {
    std::string n = dims({s.rows, s.hidden, s.seq, s.positions});
    out.push_back({"position_add " + n,
                   "position_add",
                   {{"seq", intAttr(s.seq)}},
                   {f32({s.rows, s.hidden}), f32({s.positions, s.hidden})},
                   {zeros({s.rows, s.hidden})}});
    out.push_back({"position_add_grad " + n,
                   "position_add_grad",
                   {{"seq", intAttr(s.seq)}},
                   {f32({s.rows, s.hidden})},
                   {f32({s.positions, s.hidden})}});
  }
  // Context parallelism: member m's rows of each sequence (seq / cp of
  // them) at the global positions of chunks m and 2 cp - 1 - m; its
  // gradient only at those positions (the others zero). (rows, hidden,
  // seq, positions, cp, member); one batch over several column chunks.
  struct CpShape {
    int64_t rows, hidden, seq, positions, cp, member;
  };
  for (const CpShape &s : std::vector<CpShape>{{8, 3, 8, 8, 2, 0},
                                               {8, 3, 8, 10, 2, 1},
                                               {6, 5, 24, 24, 4, 3},
                                               {600, 2, 8, 9, 4, 2}}) {
    std::string n = dims({s.rows, s.hidden, s.seq, s.positions}) + " cp" +
                    std::to_string(s.cp) + " m" + std::to_string(s.member);
    KernelCase fwd{"position_add " + n,
                   "position_add",
                   {{"seq", intAttr(s.seq)}, {"cp", intAttr(s.cp)}},
                   {f32({s.rows, s.hidden}), f32({s.positions, s.hidden})},
                   {zeros({s.rows, s.hidden})}};
    fwd.contextMember = s.member;
    out.push_back(fwd);
    KernelCase bwd{"position_add_grad " + n,
                   "position_add_grad",
                   {{"seq", intAttr(s.seq)}, {"cp", intAttr(s.cp)}},
                   {f32({s.rows, s.hidden})},
                   {f32({s.positions, s.hidden})}};
    bwd.contextMember = s.member;
    out.push_back(bwd);
  }
}

void normCases(std::vector<KernelCase> &out) {
  // (rows, hidden): size 1 (zero variance: rstd = 1/sqrt(eps)); odd sizes;
  // rows spanning several column chunks (64 rows) and kMaxChunks chunks;
  // a row wider than a warp's stride several times; hidden 0.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {1, 7}, {5, 33}, {64, 129}, {300, 1000}, {20000, 5}, {3, 0}};
  // The default eps, and an explicit one (larger, so it matters).
  const std::vector<std::pair<std::string, double>> epsVariants = {
      {"default eps", -1}, {"eps 0.1", 0.1}};
  for (auto [rows, hidden] : shapes) {
    for (const auto &[epsName, eps] : epsVariants) {
      std::string n = dims({rows, hidden}) + " " + epsName;
      std::vector<std::pair<std::string, plan::AttrValue>> attrs;
      if (eps >= 0)
        attrs.push_back({"eps", floatAttr(eps)});
      // x with scale 3: a spread row; gamma and beta around 1 and 0.
      out.push_back(
          {"layer_norm " + n,
           "layer_norm",
           attrs,
           {f32({rows, hidden}, 3), positive({hidden}), f32({hidden})},
           {zeros({rows, hidden})}});
      out.push_back(
          {"layer_norm_grad_input " + n,
           "layer_norm_grad_input",
           attrs,
           {f32({rows, hidden}, 3), positive({hidden}), f32({rows, hidden})},
           {zeros({rows, hidden})}});
      out.push_back({"layer_norm_grad_weight " + n,
                     "layer_norm_grad_weight",
                     attrs,
                     {f32({rows, hidden}, 3), f32({rows, hidden})},
                     {f32({hidden}), f32({hidden})}});
      out.push_back({"rms_norm " + n,
                     "rms_norm",
                     attrs,
                     {f32({rows, hidden}, 3), positive({hidden})},
                     {zeros({rows, hidden})}});
      out.push_back(
          {"rms_norm_grad_input " + n,
           "rms_norm_grad_input",
           attrs,
           {f32({rows, hidden}, 3), positive({hidden}), f32({rows, hidden})},
           {zeros({rows, hidden})}});
      out.push_back({"rms_norm_grad_weight " + n,
                     "rms_norm_grad_weight",
                     attrs,
                     {f32({rows, hidden}, 3), f32({rows, hidden})},
                     {f32({hidden})}});
      // Added to the outputs (the gradient accumulators' initial values).
      auto accumulating = attrs;
      accumulating.push_back({"accumulate", intAttr(1)});
      out.push_back({"layer_norm_grad_weight accumulate " + n,
                     "layer_norm_grad_weight",
                     accumulating,
                     {f32({rows, hidden}, 3), f32({rows, hidden})},
                     {f32({hidden}), f32({hidden})}});
      out.push_back({"rms_norm_grad_weight accumulate " + n,
                     "rms_norm_grad_weight",
                     accumulating,
                     {f32({rows, hidden}, 3), f32({rows, hidden})},
                     {f32({hidden})}});
      // The residual stream's add fused into the norms: (x, r, gamma[,
      // beta]) -> (s, y); (x, gamma, dy, r) -> r + dx.
      out.push_back({"add_layer_norm " + n,
                     "add_layer_norm",
                     attrs,
                     {f32({rows, hidden}, 3), f32({rows, hidden}),
                      positive({hidden}), f32({hidden})},
                     {zeros({rows, hidden}), zeros({rows, hidden})}});
      out.push_back(
          {"add_rms_norm " + n,
           "add_rms_norm",
           attrs,
           {f32({rows, hidden}, 3), f32({rows, hidden}), positive({hidden})},
           {zeros({rows, hidden}), zeros({rows, hidden})}});
      for (const char *op :
           {"layer_norm_grad_input_add", "rms_norm_grad_input_add"})
        out.push_back({std::string(op) + " " + n,
                       op,
                       attrs,
                       {f32({rows, hidden}, 3), positive({hidden}),
                        f32({rows, hidden}), f32({rows, hidden})},
                       {zeros({rows, hidden})}});
    }
  }
  // qk_norm (Qwen3's per-head q/k norm): (rows, heads, kv_heads (0: the
  // attribute left out), hd): one head; grouped-query; hd wider than a
  // warp's stride; rows over several column chunks; hd odd.
  struct QkShape {
    int64_t rows, heads, kv, hd;
  };
  for (const QkShape &q : std::vector<QkShape>{{1, 1, 0, 1},
                                               {5, 4, 2, 8},
                                               {3, 2, 1, 70},
                                               {700, 3, 3, 4},
                                               {9, 6, 2, 5}}) {
    const int64_t kv = q.kv ? q.kv : q.heads;
    const int64_t w = (q.heads + 2 * kv) * q.hd;
    for (const auto &[epsName, eps] : epsVariants) {
      std::string n = dims({q.rows, q.heads, kv, q.hd}) + " " + epsName;
      std::vector<std::pair<std::string, plan::AttrValue>> attrs = {
          {"heads", intAttr(q.heads)}};
      if (q.kv)
        attrs.push_back({"kv_heads", intAttr(q.kv)});
      if (eps >= 0)
        attrs.push_back({"eps", floatAttr(eps)});
      out.push_back({"qk_norm " + n,
                     "qk_norm",
                     attrs,
                     {f32({q.rows, w}, 3), positive({2 * q.hd})},
                     {zeros({q.rows, w})}});
      out.push_back(
          {"qk_norm_grad_input " + n,
           "qk_norm_grad_input",
           attrs,
           {f32({q.rows, w}, 3), positive({2 * q.hd}), f32({q.rows, w})},
           {zeros({q.rows, w})}});
      out.push_back({"qk_norm_grad_weight " + n,
                     "qk_norm_grad_weight",
                     attrs,
                     {f32({q.rows, w}, 3), f32({q.rows, w})},
                     {f32({2 * q.hd})}});
    }
  }
}

// Ulysses' layouts (runtime/kernels/UlyssesLayout.h): cp, heads,
// kv_heads (0: query heads only), head dimension, sequences, seq; each
// kernel, and calls the checks reject.
void ulyssesCases(std::vector<KernelCase> &out) {
  for (auto [cp, heads, kv, hd, batch, seq] :
       std::vector<std::array<int64_t, 6>>{{2, 2, 0, 3, 1, 4},
                                           {2, 4, 2, 2, 2, 8},
                                           {4, 8, 4, 4, 3, 16},
                                           {4, 8, 0, 8, 2, 32}}) {
    std::string n = "cp " + std::to_string(cp) + " heads " +
                    std::to_string(heads) + " kv_heads " + std::to_string(kv) +
                    " hd " + std::to_string(hd) + " " + std::to_string(batch) +
                    "x" + std::to_string(seq);
    const int64_t rows = batch * seq / cp, wide = (heads + 2 * kv) * hd;
    std::vector<std::pair<std::string, plan::AttrValue>> cols = {
        {"cp", intAttr(cp)}, {"heads", intAttr(heads)}};
    if (kv > 0)
      cols.push_back({"kv_heads", intAttr(kv)});
    out.push_back({"cp_ulysses_split " + n,
                   "cp_ulysses_split",
                   cols,
                   {f32({rows, wide})},
                   {zeros({cp * rows, wide / cp}), zeros({cp}, plan::I32)}});
    out.push_back({"cp_ulysses_merge " + n,
                   "cp_ulysses_merge",
                   cols,
                   {f32({cp * rows, wide / cp})},
                   {zeros({rows, wide})}});
    std::vector<std::pair<std::string, plan::AttrValue>> seqAttrs = {
        {"cp", intAttr(cp)}, {"seq", intAttr(seq)}};
    out.push_back({"cp_ulysses_natural " + n,
                   "cp_ulysses_natural",
                   seqAttrs,
                   {f32({batch * seq, hd})},
                   {zeros({batch * seq, hd})}});
    out.push_back({"cp_ulysses_zigzag " + n,
                   "cp_ulysses_zigzag",
                   seqAttrs,
                   {f32({batch * seq, hd})},
                   {zeros({batch * seq, hd}), zeros({cp}, plan::I32)}});
  }
  // The member's rows of the gathered sequence, every member.
  for (auto [cp, batch, seq, cols] : std::vector<std::array<int64_t, 4>>{
           {2, 1, 4, 3}, {2, 3, 8, 5}, {4, 2, 16, 7}})
    for (int64_t m = 0; m < cp; ++m) {
      std::string n = "cp " + std::to_string(cp) + " member " +
                      std::to_string(m) + " " + std::to_string(batch) + "x" +
                      std::to_string(seq) + "x" + std::to_string(cols);
      std::vector<std::pair<std::string, plan::AttrValue>> attrs = {
          {"cp", intAttr(cp)}, {"seq", intAttr(seq)}};
      const int64_t rows = batch * seq;
      KernelCase split{"cp_split " + n,
                       "cp_split",
                       attrs,
                       {f32({rows, cols})},
                       {zeros({rows / cp, cols})}};
      split.contextMember = m;
      out.push_back(split);
      KernelCase grad{"cp_split_grad " + n,
                      "cp_split_grad",
                      attrs,
                      {f32({rows / cp, cols})},
                      {f32({rows, cols})}};
      grad.contextMember = m;
      out.push_back(grad);
    }
  KernelCase heads{"cp_ulysses_split heads not a multiple of cp",
                   "cp_ulysses_split",
                   {{"cp", intAttr(4)}, {"heads", intAttr(6)}},
                   {f32({4, 12})},
                   {zeros({16, 3}), zeros({4}, plan::I32)}};
  heads.rejects = "must be multiples of cp = 4";
  out.push_back(heads);
  KernelCase seq{"cp_ulysses_natural seq not a multiple of 2 cp",
                 "cp_ulysses_natural",
                 {{"cp", intAttr(2)}, {"seq", intAttr(6)}},
                 {f32({12, 2})},
                 {zeros({12, 2})}};
  seq.rejects = "must be a multiple of 2 cp = 4";
  out.push_back(seq);
}

std::vector<KernelCase> cases() {
  std::vector<KernelCase> out;
  embeddingCases(out);
  positionCases(out);
  normCases(out);
  ulyssesCases(out);
  return out;
}

RegisterCases registered(cases());

} // namespace
} // namespace piper::runtime::hal::testing
