#include "plan/ring.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "plan/bytes.h"
#include "plan/json_fields.h"
#include "plan/network.h"

namespace lbcc::plan {
namespace {

using Json = nlohmann::json;

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("ring.", field, ": ", what));
}


// The largest k whose K/V payloads save at least `compression` of the bf16 bytes.
absl::StatusOr<int64_t> RankFor(const RingCoding& coding, double compression, int64_t tokens,
                                int64_t dim) {
  RingCoding bf16;
  LBCC_ASSIGN_OR_RETURN(const RingTensorBytes ref, RingPayloadBytes(bf16, tokens, dim));
  RingCoding c = coding;
  int64_t best = 0;
  for (int64_t k = 1; k <= dim; ++k) {
    c.rank = k;
    LBCC_ASSIGN_OR_RETURN(const RingTensorBytes b, RingPayloadBytes(c, tokens, dim));
    if (b.forward <= (1 - compression) * ref.forward) best = k;
  }
  if (best == 0) {
    return Bad("compression", absl::StrCat(compression, " is not reached even at k = 1"));
  }
  return best;
}

}  // namespace

absl::Status ParseRingSpec(const Json& ring, int nranks, RingSpec* out) {
  LBCC_RETURN_IF_ERROR(CheckJsonKeys(
      ring,
      {"context", "batch", "d", "heads", "layers", "causal", "codec", "k", "components",
       "mixture_block", "coefficient_dtype", "int8_block", "compression", "attention_gflops",
       "codec_gelements_s", "other_s", "other_gflops", "params", "grad_tensors"},
      "ring"));
  RingSpec s;
  LBCC_ASSIGN_OR_RETURN(s.context, JsonInteger(ring, "context", "ring", std::nullopt));
  LBCC_ASSIGN_OR_RETURN(s.batch, JsonInteger(ring, "batch", "ring", int64_t{1}));
  LBCC_ASSIGN_OR_RETURN(s.d, JsonInteger(ring, "d", "ring", std::nullopt));
  LBCC_ASSIGN_OR_RETURN(s.heads, JsonInteger(ring, "heads", "ring", int64_t{1}));
  LBCC_ASSIGN_OR_RETURN(s.layers, JsonInteger(ring, "layers", "ring", int64_t{1}));
  if (s.context % nranks != 0) {
    return Bad("context", absl::StrCat(s.context, " tokens do not split evenly over ", nranks,
                                       " ranks"));
  }
  if (s.d % s.heads != 0) {
    return Bad("heads", absl::StrCat(s.heads, " heads do not divide d = ", s.d));
  }
  if (ring.contains("causal")) {
    if (!ring["causal"].is_boolean()) return Bad("causal", "must be true or false");
    s.causal = ring["causal"].get<bool>();
  }
  const std::string codec =
      ring.contains("codec") && ring["codec"].is_string() ? ring["codec"].get<std::string>()
      : ring.contains("codec")                            ? "?"
                                                          : "bf16";
  if (codec == "raw") {
    s.coding.kind = RingCoding::Kind::kRawF32;
  } else if (codec == "bf16" || codec == "fp16") {
    s.coding.kind = RingCoding::Kind::kDense;
    s.coding.dense_format = codec;
  } else if (codec == "subspace") {
    s.coding.kind = RingCoding::Kind::kSubspace;
  } else {
    return Bad("codec", "must be raw, bf16, fp16 or subspace");
  }
  const bool subspace = s.coding.kind == RingCoding::Kind::kSubspace;
  for (const char* key : {"k", "components", "mixture_block", "coefficient_dtype", "int8_block",
                          "compression"}) {
    if (!subspace && ring.contains(key)) return Bad(key, "only for codec \"subspace\"");
  }
  if (subspace) {
    LBCC_ASSIGN_OR_RETURN(s.coding.rank,
                          JsonInteger(ring, "k", "ring", int64_t{0}, /*zero_ok=*/true));
    LBCC_ASSIGN_OR_RETURN(s.coding.components, JsonInteger(ring, "components", "ring", int64_t{1}));
    LBCC_ASSIGN_OR_RETURN(s.coding.mixture_block,
                          JsonInteger(ring, "mixture_block", "ring", int64_t{64}));
    LBCC_ASSIGN_OR_RETURN(s.coding.int8_block,
                          JsonInteger(ring, "int8_block", "ring", int64_t{32}));
    if (ring.contains("coefficient_dtype")) {
      if (!ring["coefficient_dtype"].is_string()) return Bad("coefficient_dtype", "must be a name");
      absl::StatusOr<DType> t = ParseDType(ring["coefficient_dtype"].get<std::string>());
      if (!t.ok()) return Bad("coefficient_dtype", t.status().message());
      s.coding.coefficient_dtype = *t;
    }
    LBCC_ASSIGN_OR_RETURN(s.compression,
                          JsonNumber(ring, "compression", "ring", 0.0, /*zero_ok=*/true));
    if (s.compression >= 1) return Bad("compression", "must be below 1");
    if ((s.coding.rank > 0) == (s.compression > 0)) {
      return Bad("k", "give either k or compression for codec \"subspace\"");
    }
  }
  LBCC_ASSIGN_OR_RETURN(const double gflops,
                        JsonNumber(ring, "attention_gflops", "ring", std::nullopt));
  s.attention_flops_per_s = gflops * 1e9;
  const double codec_default = s.coding.kind == RingCoding::Kind::kRawF32
                                   ? kDefaultCodecGElementsPerSRaw
                               : s.coding.kind == RingCoding::Kind::kDense
                                   ? kDefaultCodecGElementsPerSDense
                                   : kDefaultCodecGElementsPerSSubspace;
  LBCC_ASSIGN_OR_RETURN(const double codec_gelements,
                        JsonNumber(ring, "codec_gelements_s", "ring", codec_default));
  s.codec_elements_per_s = codec_gelements * 1e9;
  LBCC_ASSIGN_OR_RETURN(s.other_s, JsonNumber(ring, "other_s", "ring", -1.0, /*zero_ok=*/true));
  LBCC_ASSIGN_OR_RETURN(const double other_gflops,
                        JsonNumber(ring, "other_gflops", "ring", gflops));
  s.other_flops_per_s = other_gflops * 1e9;
  LBCC_ASSIGN_OR_RETURN(s.params,
                        JsonInteger(ring, "params", "ring", int64_t{0}, /*zero_ok=*/true));
  LBCC_ASSIGN_OR_RETURN(s.grad_tensors, JsonInteger(ring, "grad_tensors", "ring", int64_t{1}));
  // The payload formula rejects what the codec would (k > d, M, blocks, dtype) at parse time.
  const int64_t tokens = s.batch * (s.context / nranks);
  if (subspace && s.compression > 0) {
    LBCC_ASSIGN_OR_RETURN(s.coding.rank, RankFor(s.coding, s.compression, tokens, s.d));
  }
  absl::StatusOr<RingTensorBytes> check = RingPayloadBytes(s.coding, tokens, s.d);
  if (!check.ok()) return Bad("codec", check.status().message());
  *out = s;
  return absl::OkStatus();
}

absl::StatusOr<RingPrediction> PredictRing(const PlanInput& in) {
  if (!in.ring) return absl::FailedPreconditionError("PredictRing: the input has no ring section");
  const RingSpec& s = *in.ring;
  const int n = in.net.topology.nranks();
  RingPrediction p;
  p.ranks = n;
  p.tokens_per_rank = s.context / n;
  p.k = s.coding.kind == RingCoding::Kind::kSubspace ? s.coding.rank : 0;
  const int64_t tokens = s.batch * p.tokens_per_rank;  // rows of one K or V block
  LBCC_ASSIGN_OR_RETURN(const RingTensorBytes kv, RingPayloadBytes(s.coding, tokens, s.d));
  LBCC_ASSIGN_OR_RETURN(const RingTensorBytes ref, RingPayloadBytes(RingCoding(), tokens, s.d));
  p.forward_bytes = 2 * kv.forward;  // K and V
  p.backward_bytes = 2 * kv.backward;
  p.bf16_bytes = 2 * ref.forward;
  p.saved = 1 - p.forward_bytes / p.bf16_bytes;
  p.ring_bytes_step =
      static_cast<double>(s.layers) * (n - 1) * (p.forward_bytes + p.backward_bytes);

  // One block: [B, H, T, T/H-wide] score and value products, counted as 2 flops per MAC.
  const double t = static_cast<double>(p.tokens_per_rank);
  const double block_macs = static_cast<double>(s.batch) * t * t * static_cast<double>(s.d);
  p.block_forward_s = 2 * 2 * block_macs / s.attention_flops_per_s;   // Q K^T, P V
  p.block_backward_s = 5 * 2 * block_macs / s.attention_flops_per_s;  // S again, dV, dP, dQ, dK

  // The caller's codec work per block: two f32 [tokens, d] tensors each way. Every rank encodes
  // or decodes in every round, so on shared cores all n of them share the C cores.
  const double block_elements = 2.0 * static_cast<double>(tokens) * static_cast<double>(s.d);
  const double codec_slow = CpuSerialisation(in.net, n);
  p.codec_gelements_s = s.codec_elements_per_s / 1e9;
  p.block_encode_s = block_elements / s.codec_elements_per_s * codec_slow;
  p.block_decode_s = p.block_encode_s;
  const double enc = p.block_encode_s, dec = p.block_decode_s;

  // A round's wire: every rank sends K and V to its neighbour at once.
  std::vector<Transfer> fwd, bwd;
  for (int i = 0; i < n && n > 1; ++i) {
    for (int tensor = 0; tensor < 2; ++tensor) {
      fwd.push_back({i, (i + 1) % n, kv.forward});
      bwd.push_back({i, (i + n - 1) % n, kv.backward});
    }
  }
  const PhaseTime pf = n > 1 ? TimeOfPhase(in.net, fwd) : PhaseTime{};
  const PhaseTime pb = n > 1 ? TimeOfPhase(in.net, bwd) : PhaseTime{};
  p.round_forward_wire_s = pf.seconds - pf.latency_s;
  p.round_backward_wire_s = pb.seconds - pb.latency_s;
  p.round_latency_s = std::max(pf.latency_s, pb.latency_s);
  const double hop_f = pf.seconds, hop_b = pb.seconds;

  // Does rank i attend to the block of rank j?
  auto attends = [&](int i, int j) { return !s.causal || j <= i; };

  // Shared cores (cpu.shared_cores = C): the ranks that compute a block in the same round
  // share the C cores, each block taking max(1, busy / C) times as long (round 0: the own
  // block, every rank). Per round: forward rank i attends block i - r, backward block i + r.
  std::vector<double> slow_f(n), slow_b(n);
  for (int r = 0; r < n; ++r) {
    int busy_f = 0, busy_b = 0;
    for (int i = 0; i < n; ++i) {
      busy_f += attends(i, (i - r + n) % n) ? 1 : 0;
      busy_b += attends(i, (i + r) % n) ? 1 : 0;
    }
    slow_f[r] = CpuSerialisation(in.net, busy_f);
    slow_b[r] = CpuSerialisation(in.net, busy_b);
  }
  // Forward: BeginForward encodes the own block (a lossy codec also decodes it back, as
  // python's RingAttention asks for the block the others see) before it posts the pass, so the
  // relays start at `begin` and then run ahead of the compute (a_r = begin + r hop_f). Every
  // received block is decoded on the caller's thread before its compute, skipped or not.
  const bool lossy = s.coding.kind != RingCoding::Kind::kRawF32;
  const double begin = enc + (lossy ? dec : 0);
  double forward = 0;
  std::vector<double> compute(n, 0);  // per rank: its blocks' compute, both passes
  for (int i = 0; i < n; ++i) {
    double f = begin + p.block_forward_s * slow_f[0];
    compute[i] = p.block_forward_s * slow_f[0];
    for (int r = 1; r < n; ++r) {
      const double c = attends(i, (i - r + n) % n) ? p.block_forward_s * slow_f[r] : 0;
      compute[i] += c;
      f = std::max(f, begin + r * hop_f) + dec + c;
    }
    forward = std::max(forward, std::max(f, begin + (n - 1) * hop_f));
  }
  // Backward: ready[i] = when rank i has queued round r's partial sum. PassGradient decodes
  // the sum that arrived (from round 2 on), adds the contribution and encodes the new sum on
  // the caller's thread; EndBackward decodes the last one.
  std::vector<double> ready(n, p.block_backward_s * slow_b[0]), next(n);
  for (int i = 0; i < n; ++i) compute[i] += ready[i];
  for (int r = 1; r < n; ++r) {
    for (int i = 0; i < n; ++i) {
      const double c = attends(i, (i + r) % n) ? p.block_backward_s * slow_b[r] : 0;
      compute[i] += c;
      const double arrived = r > 1 ? ready[(i + 1) % n] + hop_b : 0;
      next[i] = std::max(ready[i] + c, arrived) + (r > 1 ? dec : 0) + enc;
    }
    ready.swap(next);
  }
  double backward = n > 1 ? 0 : p.block_backward_s;
  for (int i = 0; i < n && n > 1; ++i) {
    backward = std::max(backward, std::max(ready[i], ready[(i + 1) % n]) + hop_b + dec);
  }
  p.forward_s = forward;
  p.backward_s = backward;
  const double layers = static_cast<double>(s.layers);
  p.ring_s = layers * (forward + backward);
  p.ring_compute_s = layers * *std::max_element(compute.begin(), compute.end());
  p.ring_wire_s = layers * (n - 1) * (hop_f + hop_b);
  // Forward: begin + n-1 decodes; backward: n-1 encodes and n-1 decodes (rounds 2..n-1 and
  // EndBackward's). A single rank still encodes (and decodes) its own block in BeginForward.
  p.ring_codec_s = layers * (begin + (n - 1) * dec + (n - 1) * (enc + dec));
  p.limit = p.ring_compute_s + p.ring_codec_s >= p.ring_wire_s ? "compute" : "wire";
  p.overlap_ratio = p.ring_s / std::max(p.ring_compute_s + p.ring_codec_s, p.ring_wire_s);

  p.other_s = s.other_s >= 0 ? s.other_s
                             : 6.0 * static_cast<double>(s.params) * static_cast<double>(tokens) /
                                   s.other_flops_per_s;
  if (s.params > 0 && n > 1) {
    PlanInput one = in;
    one.ring.reset();
    one.collective = CollectiveSpec{"allreduce",
                                    std::max<int64_t>(4, 4 * s.params / s.grad_tensors), 1};
    LBCC_ASSIGN_OR_RETURN(const CollectivePrediction c, PredictCollective(one));
    p.allreduce_s = static_cast<double>(s.grad_tensors) * c.seconds;
  }
  p.step_s = p.ring_s + p.other_s + p.allreduce_s;
  return p;
}

Json ToJson(const RingPrediction& p) {
  return {{"ranks", p.ranks},
          {"tokens_per_rank", p.tokens_per_rank},
          {"k", p.k},
          {"forward_bytes", p.forward_bytes},
          {"backward_bytes", p.backward_bytes},
          {"bf16_bytes", p.bf16_bytes},
          {"saved", p.saved},
          {"ring_bytes_step", p.ring_bytes_step},
          {"block_forward_s", p.block_forward_s},
          {"block_backward_s", p.block_backward_s},
          {"codec_gelements_s", p.codec_gelements_s},
          {"block_encode_s", p.block_encode_s},
          {"block_decode_s", p.block_decode_s},
          {"round_forward_wire_s", p.round_forward_wire_s},
          {"round_backward_wire_s", p.round_backward_wire_s},
          {"round_latency_s", p.round_latency_s},
          {"forward_s", p.forward_s},
          {"backward_s", p.backward_s},
          {"ring_s", p.ring_s},
          {"ring_compute_s", p.ring_compute_s},
          {"ring_wire_s", p.ring_wire_s},
          {"ring_codec_s", p.ring_codec_s},
          {"overlap_ratio", p.overlap_ratio},
          {"other_s", p.other_s},
          {"allreduce_s", p.allreduce_s},
          {"step_s", p.step_s},
          {"limit", p.limit}};
}

std::string FormatRingPrediction(const RingPrediction& p) {
  std::string out = absl::StrFormat(
      "context ring: %d ranks x %d tokens, k %d (%.1f %% fewer bytes than bf16)\n"
      "  per round and link: forward %.0f B, backward %.0f B; wire %.6g s / %.6g s + latency "
      "%.6g s\n"
      "  per block: attention forward %.6g s, backward %.6g s; encode %.6g s, decode %.6g s "
      "(%.6g G elements/s)\n"
      "  per layer: forward pass %.6g s, backward pass %.6g s\n"
      "  ring per step: %.6g s (compute %.6g s + encode/decode %.6g s, wire %.6g s; %s-bound, "
      "%.3fx the larger of compute + encode/decode and wire), %.0f B sent per rank\n"
      "  step: %.6g s = ring %.6g s + other compute %.6g s + gradient all-reduce %.6g s\n",
      p.ranks, p.tokens_per_rank, p.k, 100 * p.saved, p.forward_bytes, p.backward_bytes,
      p.round_forward_wire_s, p.round_backward_wire_s, p.round_latency_s, p.block_forward_s,
      p.block_backward_s, p.block_encode_s, p.block_decode_s, p.codec_gelements_s, p.forward_s,
      p.backward_s, p.ring_s, p.ring_compute_s, p.ring_codec_s, p.ring_wire_s, p.limit,
      p.overlap_ratio, p.ring_bytes_step, p.step_s, p.ring_s, p.other_s, p.allreduce_s);
  return out;
}

}  // namespace lbcc::plan
