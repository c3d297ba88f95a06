// The context-parallel ring in the planning model: one training step of a model whose sequence
// is split over the ranks of a topology, with ring attention over comm::ContextRing
// (docs/context_parallel.md, "Planning", has every term).
//
//   absl::StatusOr<PlanInput> in = ParsePlanInput(json_text);   // with a "ring" section
//   absl::StatusOr<RingPrediction> p = PredictRing(*in);
//
// Per layer and pass, rank i's timeline follows comm::ContextRing's message pattern and its
// caller's (python/lbcc/torch/ring_attention.py):
//   forward   n-1 rounds; in round r every rank sends K and V (the block it got in round r-1,
//             its own in round 1) to rank i+1. BeginForward encodes the own block (a lossy
//             codec also decodes it back: the block as the others see it) before it posts the
//             pass, which takes b = E (+ D); the worker then relays the same bytes without
//             waiting for compute, so block r arrives at a_r = b + r (w_f + L); the caller
//             decodes block r (attended or skipped by the causal mask) and computes it once it
//             has arrived and the previous block is done: f_r = max(f_{r-1}, a_r) + D + c_r,
//             f_0 = b + the own block. Pass end: max(f_{n-1}, a_{n-1}).
//   backward  n-1 rounds the other way; in round r rank i adds its dK, dV contribution for
//             block i+r to the partial sum from rank i+1 (received in round r-1, decoded) and
//             encodes and sends it to rank i-1: s_r(i) = max(s_{r-1}(i) + c_r(i), s_{r-1}(i+1)
//             + w_b + L) + [r > 1] D + E, s_0 = the own block's gradients. The received K/V
//             blocks are kept from the forward, so the backward sends gradients only (not K/V
//             again). Pass end: the last partial sum in and decoded (EndBackward, + D).
// E, D: the caller's encode and decode of one block's two tensors (tokens x d f32 elements
// each) at the codec rate (ring.codec_gelements_s; default per codec below), x max(1, n / C)
// on shared cores (every rank codes in every round). ContextRing runs them on the caller's
// thread, between its block products, never on the worker: they add to the compute side of
// each round and overlap only the link.
// w = the round's two payloads (plan/bytes.h RingPayloadBytes) through TimeOfPhase's bandwidth
// term, L its latency term (path latency + per-message time); c = block flops / the attention
// rate (forward 4 B T^2 d, backward 10 B T^2 d with the recomputed scores; 0 for a block the
// causal mask skips; with cpu.shared_cores = C, x max(1, busy / C) for the ranks computing a
// block in that round). In steady state a round takes max(c + D (+ E), w + L): the link hides
// behind the caller's compute and coding, or they hide behind the link. A pass takes as long
// as its slowest rank, and the layers' passes run one after the other. The step adds the
// non-ring compute and the dense gradient all-reduce (PredictCollective per tensor: the
// table's direct or ring).
//
// Errors: InvalidArgument naming the field. Thread-safety: pure functions.
#ifndef LBCC_PLAN_RING_H_
#define LBCC_PLAN_RING_H_

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "plan/plan.h"

namespace lbcc::plan {

// Default codec rates (ring.codec_gelements_s, G f32 elements encoded or decoded per second by
// one rank) when the ring section gives none: orders of magnitude for one CPU core, not
// measurements (raw f32 is a copy, bf16/fp16 a conversion, the subspace codec a projection
// onto M components of rank k). Measure the caller's codec and give its rate.
inline constexpr double kDefaultCodecGElementsPerSRaw = 1.0;
inline constexpr double kDefaultCodecGElementsPerSDense = 0.5;
inline constexpr double kDefaultCodecGElementsPerSSubspace = 0.1;

struct RingPrediction {
  int ranks = 0;
  int64_t tokens_per_rank = 0;     // context / ranks
  int64_t k = 0;                   // subspace k used (0: not a subspace codec)
  double forward_bytes = 0;        // one round's payloads (K + V) on one link
  double backward_bytes = 0;       // one round's partial sums (dK + dV)
  double bf16_bytes = 0;           // one round's K + V as dense bf16 (the reference)
  double saved = 0;                // 1 - forward_bytes / bf16_bytes
  double ring_bytes_step = 0;      // what one rank sends on the ring per step, every layer
  double block_forward_s = 0;      // c: one block's attention, forward
  double block_backward_s = 0;     // and backward
  double codec_gelements_s = 0;    // the codec rate used (given or the codec's default)
  double block_encode_s = 0;       // E: the caller encodes one block's two tensors (K and V,
                                   // or dK and dV), shared cores' slowdown included
  double block_decode_s = 0;       // D: and decodes them
  double round_forward_wire_s = 0;   // w_f: a forward round's bandwidth term
  double round_backward_wire_s = 0;  // w_b
  double round_latency_s = 0;        // L
  double forward_s = 0;            // one layer's forward pass (slowest rank)
  double backward_s = 0;           // one layer's backward pass (slowest rank)
  double ring_s = 0;               // layers x (forward + backward)
  double ring_compute_s = 0;       // the busiest rank's block compute, every layer (shared
                                   // cores' slowdown included)
  double ring_wire_s = 0;          // every round's w + L in sequence, every layer
  double ring_codec_s = 0;         // one rank's encodes and decodes, both passes, every layer
                                   // (the same on every rank; on the caller's thread beside
                                   // ring_compute_s, not part of it)
  double overlap_ratio = 0;        // ring_s / max(ring_compute_s + ring_codec_s, ring_wire_s):
                                   // the caller's thread against the link
  double other_s = 0;              // non-ring compute and optimizer
  double allreduce_s = 0;          // dense gradient all-reduce
  double step_s = 0;               // ring_s + other_s + allreduce_s
  std::string limit;               // "compute" (block compute + codec, the caller's thread)
                                   // or "wire": which bounds the ring
};

// One step; `in.ring` must be set (FailedPrecondition otherwise).
absl::StatusOr<RingPrediction> PredictRing(const PlanInput& in);

nlohmann::json ToJson(const RingPrediction& p);
std::string FormatRingPrediction(const RingPrediction& p);

}  // namespace lbcc::plan

#endif  // LBCC_PLAN_RING_H_
