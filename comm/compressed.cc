// Communicator's compressed operations: SparseAllReduce and compressed point-to-point.
#include <cstring>
#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/env.h"
#include "base/logging.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "codecs/payload.h"
#include "comm/communicator.h"
#include "comm/sparse_blob.h"
#include "kernels/device_codec.h"

namespace lbcc::comm {
namespace {

using internal::AssembleStreamed;
using internal::ErrorBlob;
using internal::SplitBlob;
using internal::StreamFinal;

// P2P tags: the sequence field holds the user's tag and the step field this marker, so they
// never meet a collective's tags (whose steps stay far below it).
constexpr uint32_t kP2pStep = 0xffff;

// Encodes host tensors with the codec, CUDA tensors on their GPU (kernels/device_codec.h;
// Unimplemented in a build without CUDA).
absl::StatusOr<size_t> EncodeTensor(const codecs::Codec& codec, const TensorView& input,
                                    codecs::CodecState* state, absl::Span<uint8_t> out,
                                    void* cuda_stream, kernels::DeviceScratch* scratch,
                                    codecs::EncodeObserver* observer = nullptr) {
  if (input.is_host()) {
    // A device state holds its memory on the GPU; the CPU codec must not be given one.
    if (dynamic_cast<kernels::DeviceTopKEfState*>(state) != nullptr) {
      return absl::InvalidArgumentError(
          "a host tensor with a device state (kernels::NewDeviceState): use a CUDA tensor or "
          "the codec's NewState()");
    }
    return observer != nullptr ? codec.EncodeStreamed(input, state, out, observer)
                               : codec.Encode(input, state, out);
  }
  return kernels::EncodeOnDevice(codec, input, state, out, cuda_stream, scratch);
}

absl::Status DecodeTensor(absl::Span<const absl::Span<const uint8_t>> payloads,
                          const codecs::DecodeOptions& options, const TensorView& out,
                          codecs::DecodeScratch* scratch, void* cuda_stream,
                          kernels::DeviceScratch* device_scratch) {
  if (out.is_host()) return codecs::DecodeAccumulate(payloads, options, out, scratch);
  return kernels::DecodeAccumulateOnDevice(payloads, options, out, cuda_stream, device_scratch);
}

// Over slow links, a large tensor alone in its exchange group goes to the peers in pieces
// while it is encoded: the codec reports its body's leading bytes as they become final
// (codecs::EncodeObserver; TopK-EF's index section, most of the payload), and they go out at
// once instead of after the encode, which for one tensor cannot otherwise overlap the wire.
// Such a group is exactly kStreamPieces piece messages and then the final message: u64 prefix
// length, u64 piece bytes used, then the blob without the piece bytes, so blob = final[0,
// prefix) + pieces[0, used) + final[prefix, end). With the direct algorithm all of them travel
// on the group's tag (matched in order); other algorithms run one all-gather per message (a
// hierarchical leader forwards a member's piece as soon as it has it). Every rank derives the
// piece count from the shapes and the topology alone; a sender with less to stream (an error, a
// device tensor, a codec that does not stream) sends empty pieces.
// Few pieces: each message costs every receiver CPU (syscalls, wake-ups) that 4 ranks on 2
// cores feel; on the 4-rank testbed (one 4M tensor, 100 Mbit/s) 4 pieces of 1/8 of the
// worst-case payload each beat 16 of 1/17 and 2 of 1/4 (comm/README.md). Over fast links the
// wire is not what one waits for, and the pieces would only add messages.
constexpr int kStreamPieces = 4;
constexpr int64_t kStreamMinElements = int64_t{1} << 16;

class PieceSender final : public codecs::EncodeObserver {
 public:
  // `send` puts one piece on the wire (and keeps it alive as long as needed). A piece goes out
  // once `threshold` bytes are pending.
  PieceSender(std::function<void(std::string)> send, size_t threshold)
      : send_(std::move(send)), threshold_(threshold) {}

  void Append(absl::Span<const uint8_t> bytes) override {
    if (!usable_) return;
    pending_.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    if (pending_.size() >= threshold_ && sent_ < kStreamPieces) {
      sent_bytes_ += pending_.size();
      Send(std::move(pending_));
      pending_.clear();
    }
  }
  void Discard() override { usable_ = false; }

  // Sends the pieces still due (empty); returns the piece bytes the blob's payload starts with.
  size_t Finish() {
    while (sent_ < kStreamPieces) Send(std::string());
    return usable_ ? sent_bytes_ : 0;
  }

 private:
  void Send(std::string piece) {
    send_(std::move(piece));
    ++sent_;
  }

  const std::function<void(std::string)> send_;
  const size_t threshold_;
  std::string pending_;
  size_t sent_bytes_ = 0;
  int sent_ = 0;
  bool usable_ = true;
};

}  // namespace

// SparseAllReduce exchanges its tensors in groups, so that encoding group g + 1 overlaps the
// exchange of group g (a model's parameters are many tensors). A group holds consecutive
// tensors totalling at least max(total / kMaxPipelineGroups, min_elements) elements; one large
// tensor is one group (SparseLoCo's quantizer sees the whole tensor). Every group costs a
// synchronisation of all ranks (its all-gather), so groups are not made small: on the 4-rank
// testbed (4M parameters as 16 tensors, 2 cores) 4 groups of 1M beat 8 of 512K by ~10 %
// (comm/README.md), hence the default minimum of 2^20 (LBCC_SPARSE_GROUP_ELEMENTS).
constexpr int kMaxPipelineGroups = 8;

// [begin, end) tensor ranges.
std::vector<std::pair<size_t, size_t>> PlanGroups(
    const std::vector<Communicator::SparseTensor>& tensors, int max_groups,
    int64_t min_elements) {
  int64_t total = 0;
  for (const auto& t : tensors) total += t.delta.num_elements();
  const int64_t target = std::max(total / std::max(1, max_groups), min_elements);
  std::vector<std::pair<size_t, size_t>> groups;
  size_t begin = 0;
  int64_t filled = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    filled += tensors[i].delta.num_elements();
    if (filled >= target || i + 1 == tensors.size()) {
      groups.emplace_back(begin, i + 1);
      begin = i + 1;
      filled = 0;
    }
  }
  if (groups.empty()) groups.emplace_back(0, 0);
  return groups;
}

RequestPtr Communicator::SparseAllReduce(std::vector<SparseTensor> tensors,
                                         const codecs::Codec* codec, codecs::DecodeOptions decode,
                                         OpOptions options) {
  if (codec == nullptr) {
    return CompletedRequest(absl::InvalidArgumentError("SparseAllReduce: null codec"));
  }
  return Post("SparseAllReduce", [this, tensors = std::move(tensors), codec, decode, options](
                                     const Group& group, transport::Tag tag,
                                     absl::Time deadline) -> absl::Status {
    auto abort_states = [&tensors] {
      for (const SparseTensor& t : tensors) {
        if (t.state != nullptr && t.state->has_pending()) (void)t.state->Abort();
      }
    };
    const absl::Time t0 = absl::Now();
    // Every rank plans the same groups and picks the same algorithm: both depend only on the
    // shapes and the codec (the worst-case payload size), never on what a rank encoded.
    // AllGatherV uses at most max(n, 3) tag steps; groups take disjoint step ranges.
    const uint32_t steps = static_cast<uint32_t>(std::max(group.size(), 3));
    const int max_groups =
        static_cast<int>(std::min<uint32_t>(kMaxPipelineGroups, 0xff00u / steps));
    int64_t min_elements = options.sparse_group_elements;
    if (min_elements <= 0) min_elements = *config_.sparse_group_elements;
    const std::vector<std::pair<size_t, size_t>> plan =
        PlanGroups(tensors, max_groups, min_elements);
    const int num_groups = static_cast<int>(plan.size());
    const bool streamed = group.size() > 1;
    std::vector<Algorithm> algorithms(num_groups);
    for (int g = 0; g < num_groups; ++g) {
      size_t bytes = 5;
      for (size_t i = plan[g].first; i < plan[g].second; ++i) {
        absl::StatusOr<size_t> max = codec->MaxEncodedBytes(tensors[i].delta.shape());
        bytes += 8 + (max.ok() ? *max : 0);  // A bad shape fails in Encode below.
      }
      absl::StatusOr<Algorithm> chosen =
          ChooseAlgorithm(Collective::kAllGatherV, group, bytes, options.algorithm);
      if (!chosen.ok()) return chosen.status();
      algorithms[g] = *chosen;
    }

    // The exchanger thread runs group g's all-gather as soon as its blob is ready; this thread
    // encodes (CUDA tensors too: the encode stays on the thread the caller's device is set on).
    // A blob is u8 ok, then u32 count + (u64 size, bytes) per tensor, or the error message that
    // made this rank give up; the exchange stops after the first group in which any rank gave
    // up (every rank sees the same blobs, so every rank stops at the same group).
    Mutex mu;
    std::vector<std::string> blobs(num_groups);               // Written before `encoded` moves.
    std::vector<std::vector<std::string>> all(num_groups);    // Owned by the exchanger.
    int encoded = 0;                                          // Guarded by mu.
    absl::Status exchanged;                                   // Written by the exchanger.
    int groups_exchanged = 0;                                 // Written by the exchanger.
    bool exchanger_failed = false;                            // Guarded by mu.
    // Group g's payloads, validated by the exchanger while later groups are on the wire:
    // per_rank[r] lists rank r's payloads, tensor by tensor. Host outputs: PrepareDecode checks
    // every payload in full (envelope, XXH3 checksum, indices, values, shape) and stages it in
    // the tensor's scratch, so that after the exchange ApplyDecode only writes. CUDA outputs:
    // every envelope is checked here, and every tensor but the first in full (InspectPayload);
    // the device decode checks the first before it writes. Either way a bad payload fails the
    // collective before any output is written. A bad payload does not stop the exchange (the
    // peers expect every group).
    std::vector<std::vector<absl::Span<const uint8_t>>> per_rank(group.size());
    absl::Status invalid;  // Written by the exchanger.
    if (decode_scratch_.size() < tensors.size()) decode_scratch_.resize(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (decode_scratch_[i] == nullptr) decode_scratch_[i] = std::make_unique<codecs::DecodeScratch>();
    }
    auto validate = [&](int g) -> absl::Status {
      const size_t count = plan[g].second - plan[g].first;
      for (int r = 0; r < group.size(); ++r) {
        LBCC_ASSIGN_OR_RETURN(std::vector<absl::Span<const uint8_t>> spans,
                              SplitBlob(all[g][r], count, r));
        per_rank[r].insert(per_rank[r].end(), spans.begin(), spans.end());
      }
      std::vector<absl::Span<const uint8_t>> payloads(group.size());
      for (size_t i = plan[g].first; i < plan[g].second; ++i) {
        for (int r = 0; r < group.size(); ++r) payloads[r] = per_rank[r][i];
        if (tensors[i].out.is_host()) {
          absl::Status status =
              codecs::PrepareDecode(payloads, decode, tensors[i].out, decode_scratch_[i].get());
          if (!status.ok()) return Annotate(status, absl::StrCat("tensor ", i));
          continue;
        }
        for (int r = 0; r < group.size(); ++r) {
          absl::Status status;
          Shape shape;
          if (i == 0) {
            absl::StatusOr<codecs::PayloadInfo> info = codecs::ParsePayload(payloads[r]);
            status = info.status();
            if (status.ok()) shape = info->shape;
          } else {
            absl::StatusOr<codecs::PayloadSummary> summary = codecs::InspectPayload(payloads[r]);
            status = summary.status();
            if (status.ok()) shape = summary->shape;
          }
          if (status.ok() && shape != tensors[i].out.shape()) {
            status = absl::InvalidArgumentError(absl::StrCat(
                "shape ", ShapeToString(shape), " != ", ShapeToString(tensors[i].out.shape())));
          }
          if (!status.ok()) {
            return Annotate(status, absl::StrCat("tensor ", i, ": payload ", r));
          }
        }
      }
      return absl::OkStatus();
    };
    // Groups are exchanged as soon as they are encoded, without waiting for the previous
    // group's all-gather to complete: a rank whose encode runs ahead keeps the links busy while
    // a slower one catches up. With the direct algorithm throughout, this thread sends each
    // group's blob to every peer (below) and the exchanger only receives; other algorithms
    // forward what they receive, so each group's all-gather runs on a thread of its own and the
    // exchanger joins them in order. The exchanger validates group by group. Since a rank may
    // start group g + 1 before it learns that someone gave up in group g, every rank then
    // exchanges every group (a placeholder once it knows, or after its own error blob), so no
    // send waits for a receive that never comes.
    const bool direct = std::all_of(algorithms.begin(), algorithms.end(),
                                    [](Algorithm a) { return a == Algorithm::kDirect; });
    // Groups sent in pieces while they are encoded (PieceSender): one large tensor. Without the
    // direct algorithm each of its messages is an all-gather of its own, with its own tag
    // steps, so only while they fit in the operation's tag space.
    const bool slow_links = ShapeOf(topology(), group.ranks).any_slow;
    std::vector<int> pieces(num_groups, 0);
    std::vector<uint32_t> first_step(num_groups + 1, 0);
    for (int g = 0; g < num_groups; ++g) {
      if (streamed && slow_links && plan[g].second - plan[g].first == 1 &&
          tensors[plan[g].first].delta.num_elements() >= kStreamMinElements) {
        pieces[g] = kStreamPieces;
      }
      const uint32_t rounds = direct ? 1 : static_cast<uint32_t>(pieces[g] + 1);
      first_step[g + 1] = first_step[g] + rounds * steps;
    }
    if (first_step[num_groups] > 0xff00u) {
      std::fill(pieces.begin(), pieces.end(), 0);
      for (int g = 0; g < num_groups; ++g) first_step[g + 1] = first_step[g] + steps;
    }
    // Piece groups without the direct algorithm: message j's all-gather (j = pieces: the final
    // message), its result and status.
    std::vector<std::vector<std::thread>> message_gathers(num_groups);
    std::vector<std::vector<std::vector<std::string>>> message_all(num_groups);
    std::vector<std::vector<absl::Status>> message_status(num_groups);
    for (int g = 0; g < num_groups; ++g) {
      if (direct || pieces[g] == 0) continue;
      message_gathers[g].resize(pieces[g] + 1);
      message_all[g].resize(pieces[g] + 1);
      message_status[g].resize(pieces[g] + 1);
    }
    auto message_tag = [&](int g, int j) {
      return tag + first_step[g] + static_cast<uint32_t>(j) * steps;
    };
    std::vector<std::thread> gathers(num_groups);  // streamed, not direct: group g's all-gather
    std::vector<absl::Status> gathered(num_groups);
    auto group_tag = [&](int g) { return tag + first_step[g]; };
    bool stop_encoding = false;  // Guarded by mu; streamed: someone gave up, send placeholders.
    // A piece group's blobs from its peers' pieces and final messages (rank order).
    auto assemble = [&](int g, const std::vector<std::vector<std::string>>& parts,
                        const std::vector<std::string>& finals) {
      for (int r = 0; r < group.size(); ++r) {
        if (r == group.me) continue;
        absl::StatusOr<std::string> blob = AssembleStreamed(parts[r], finals[r], r);
        if (blob.ok()) {
          all[g][r] = *std::move(blob);
        } else if (invalid.ok()) {
          invalid = blob.status();  // all[g][r] stays empty: looked at as giving up
        }
      }
    };
    std::thread exchanger([&] {
      bool gave_up = false;
      for (int g = 0; g < num_groups; ++g) {
        {
          MutexLock lock(&mu);
          mu.Await([&] { return encoded > g; });
        }
        absl::Status status;
        if (streamed && direct) {
          all[g].assign(group.size(), std::string());
          all[g][group.me] = blobs[g];
          std::vector<std::vector<std::string>> parts(group.size());
          std::vector<std::string> finals(group.size());
          Batch batch(group.fabric, deadline);
          for (int r = 0; r < group.size(); ++r) {
            if (r == group.me) continue;
            parts[r].resize(pieces[g]);
            for (std::string& part : parts[r]) {
              batch.RecvAny(group.ranks[r], group_tag(g), &part, size_t{1} << 40);
            }
            batch.RecvAny(group.ranks[r], group_tag(g), pieces[g] > 0 ? &finals[r] : &all[g][r],
                          size_t{1} << 40);
          }
          status = batch.Wait();
          if (status.ok() && pieces[g] > 0) assemble(g, parts, finals);
        } else if (streamed && pieces[g] > 0) {
          for (size_t j = 0; j < message_gathers[g].size(); ++j) {
            message_gathers[g][j].join();
            if (status.ok()) status = message_status[g][j];
          }
          all[g].assign(group.size(), std::string());
          all[g][group.me] = blobs[g];
          std::vector<std::vector<std::string>> parts(group.size());
          std::vector<std::string> finals(group.size());
          for (int r = 0; r < group.size() && status.ok(); ++r) {
            for (int j = 0; j < pieces[g]; ++j) {
              parts[r].push_back(std::move(message_all[g][j][r]));
            }
            finals[r] = std::move(message_all[g][pieces[g]][r]);
          }
          if (status.ok()) assemble(g, parts, finals);
        } else if (streamed) {
          gathers[g].join();
          status = gathered[g];
        } else {
          status = comm::AllGatherV(group, group_tag(g), blobs[g], &all[g], algorithms[g],
                                    options.priority, deadline, size_t{1} << 40);
        }
        if (!status.ok()) {
          exchanged = status;
          MutexLock lock(&mu);
          exchanger_failed = true;
          return;
        }
        if (gave_up) continue;  // streamed: later groups are received, not looked at
        groups_exchanged = g + 1;
        bool someone_gave_up = false;
        for (const std::string& blob : all[g]) someone_gave_up |= blob.empty() || blob[0] == '\0';
        if (someone_gave_up) {
          // The first rank's message, the same on every rank.
          for (int r = 0; r < group.size() && invalid.ok(); ++r) {
            invalid = SplitBlob(all[g][r], plan[g].second - plan[g].first, r).status();
          }
          if (!streamed) return;
          // Streamed: every rank sends every group, so every group is received; the encoder
          // sends placeholders from now on.
          gave_up = true;
          MutexLock lock(&mu);
          stop_encoding = true;
          continue;
        }
        if (invalid.ok()) invalid = validate(g);
      }
    });

    // 1. Encode group by group (or record why not; later groups are then not encoded, only
    // their error or placeholder blobs sent when streamed).
    std::deque<std::string> piece_bytes;  // streamed pieces and final messages, until sent
    std::vector<std::unique_ptr<Batch>> sends;  // streamed direct: each group's blob to each peer
    // Streamed direct: `bytes` (alive until `sends` are waited for) to every peer on g's tag.
    auto send_to_peers = [&](int g, const std::string& bytes) {
      for (int r = 0; r < group.size(); ++r) {
        if (r == group.me) continue;
        sends.back()->Send(
            group.ranks[r], group_tag(g),
            absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
            options.priority);
      }
    };
    absl::Status local;
    std::vector<uint8_t>& buffer = encode_buffer_;
    std::unique_ptr<kernels::DeviceScratch> scratch;
    for (int g = 0; g < num_groups; ++g) {
      bool placeholder = false;
      {
        MutexLock lock(&mu);
        if (exchanger_failed) break;
        placeholder = stop_encoding;
      }
      std::unique_ptr<PieceSender> piece_sender;
      size_t stream_prefix = 0;  // the blob's bytes before the streamed ones
      // Message j of a piece group goes out (j = pieces[g]: the final message).
      auto send_message = [&, g](int j, std::string message) {
        if (!direct) {
          message_gathers[g][j] = std::thread([&, g, j, message = std::move(message)] {
            message_status[g][j] =
                comm::AllGatherV(group, message_tag(g, j), message, &message_all[g][j],
                                 algorithms[g], options.priority, deadline, size_t{1} << 40);
          });
          return;
        }
        piece_bytes.push_back(std::move(message));
        send_to_peers(g, piece_bytes.back());
      };
      int messages_sent = 0;
      if (pieces[g] > 0) {
        if (direct) sends.push_back(std::make_unique<Batch>(group.fabric, deadline));
        absl::StatusOr<size_t> max = codec->MaxEncodedBytes(tensors[plan[g].first].delta.shape());
        const size_t threshold =
            std::max<size_t>(4096, (max.ok() ? *max : 0) / (2 * kStreamPieces));
        piece_sender = std::make_unique<PieceSender>(
            [&](std::string piece) { send_message(messages_sent++, std::move(piece)); },
            threshold);
      }
      std::string& blob = blobs[g];
      blob.assign(1, '\1');
      const uint32_t count = static_cast<uint32_t>(plan[g].second - plan[g].first);
      blob.append(reinterpret_cast<const char*>(&count), 4);
      for (size_t i = plan[g].first; i < plan[g].second && local.ok() && !placeholder; ++i) {
        const SparseTensor& t = tensors[i];
        if (t.out.shape() != t.delta.shape() || t.out.dtype() != DType::kF32) {
          local = absl::InvalidArgumentError(absl::StrCat("tensor ", i, ": out ",
                                                          t.out.DebugString(), " must be f32 of ",
                                                          t.delta.DebugString(), "'s shape"));
          break;
        }
        absl::StatusOr<size_t> max = codec->MaxEncodedBytes(t.delta.shape());
        if (!max.ok()) {
          local = Annotate(max.status(), absl::StrCat("tensor ", i));
          break;
        }
        buffer.resize(*max);
        if (!t.delta.is_host() && scratch == nullptr) {
          scratch = std::make_unique<kernels::DeviceScratch>();
        }
        absl::StatusOr<size_t> size =
            EncodeTensor(*codec, t.delta, t.state, absl::MakeSpan(buffer), t.cuda_stream,
                         scratch.get(), piece_sender.get());
        if (!size.ok()) {
          local = Annotate(size.status(), absl::StrCat("tensor ", i));
          break;
        }
        if (piece_sender != nullptr) {
          absl::StatusOr<size_t> body =
              codecs::PeekPayloadBodyOffset(absl::MakeConstSpan(buffer.data(), *size));
          if (!body.ok()) {
            local = Annotate(body.status(), absl::StrCat("tensor ", i, " (as encoded)"));
            break;
          }
          stream_prefix = blob.size() + 8 + *body;
        }
        const uint64_t size64 = *size;
        blob.append(reinterpret_cast<const char*>(&size64), 8);
        blob.append(reinterpret_cast<const char*>(buffer.data()), *size);
      }
      if (!local.ok()) blob = ErrorBlob(local);
      if (placeholder && local.ok()) blob = ErrorBlob(absl::AbortedError("another rank gave up"));
      if (piece_sender != nullptr) {
        size_t used = piece_sender->Finish();
        if (!local.ok() || placeholder || stream_prefix == 0) used = 0;
        send_message(pieces[g], StreamFinal(blob, used > 0 ? stream_prefix : blob.size(), used));
      } else if (streamed && !direct) {
        gathers[g] = std::thread([&, g] {
          gathered[g] = comm::AllGatherV(group, group_tag(g), blobs[g], &all[g], algorithms[g],
                                         options.priority, deadline, size_t{1} << 40);
        });
      } else if (streamed) {
        sends.push_back(std::make_unique<Batch>(group.fabric, deadline));
        send_to_peers(g, blob);
      }
      {
        MutexLock lock(&mu);
        encoded = g + 1;
      }
      if (!local.ok() && !streamed) break;
    }
    const absl::Time t1 = absl::Now();
    // After an error blob the exchanger stops by itself once that group (streamed: the last) is
    // exchanged.
    exchanger.join();
    for (std::thread& gather : gathers) {  // those the exchanger did not reach after a failure
      if (gather.joinable()) gather.join();
    }
    for (std::vector<std::thread>& threads : message_gathers) {
      for (std::thread& gather : threads) {
        if (gather.joinable()) gather.join();
      }
    }
    for (const std::unique_ptr<Batch>& batch : sends) {
      absl::Status sent = batch->Wait();
      if (!sent.ok() && exchanged.ok()) exchanged = sent;
    }
    const absl::Time t2 = absl::Now();
    if (!exchanged.ok()) {
      abort_states();
      return exchanged;
    }
    if (!local.ok()) {
      abort_states();
      return local;
    }
    if (!invalid.ok()) {
      abort_states();
      return invalid;
    }
    if (groups_exchanged != num_groups) {
      abort_states();
      return absl::InternalError("SparseAllReduce: exchange ended early without an error");
    }
    // 2. Write the outputs (decoded in rank order), then commit.
    std::unique_ptr<kernels::DeviceScratch> device_scratch;
    std::vector<absl::Span<const uint8_t>> payloads(group.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      absl::Status status;
      if (tensors[i].out.is_host()) {
        status = codecs::ApplyDecode(decode_scratch_[i].get());
      } else {
        for (int r = 0; r < group.size(); ++r) payloads[r] = per_rank[r][i];
        if (device_scratch == nullptr) device_scratch = std::make_unique<kernels::DeviceScratch>();
        status = kernels::DecodeAccumulateOnDevice(payloads, decode, tensors[i].out,
                                                   tensors[i].cuda_stream, device_scratch.get());
        if (!status.ok() && i == 0) {
          // Checked in full by the device decode, before it writes.
          abort_states();
          return Annotate(status, absl::StrCat("tensor ", i));
        }
      }
      if (!status.ok()) {
        // Validated in full above: an error here is an LBCC bug.
        abort_states();
        return absl::InternalError(absl::StrCat("tensor ", i, ": ", status.ToString()));
      }
    }
    for (const SparseTensor& t : tensors) {
      if (t.state != nullptr) LBCC_RETURN_IF_ERROR(t.state->Commit());
    }
    LBCC_LOG(TRACE) << "SparseAllReduce rank " << rank() << ": " << tensors.size()
                    << " tensors in " << num_groups << " groups, algorithm "
                    << AlgorithmName(algorithms[0]) << ", encode "
                    << absl::ToDoubleMilliseconds(t1 - t0) << " ms, then exchange and validation "
                    << absl::ToDoubleMilliseconds(t2 - t1) << " ms, decode "
                    << absl::ToDoubleMilliseconds(absl::Now() - t2) << " ms";
    return absl::OkStatus();
  }, options.timeout);
}

RequestPtr Communicator::SendCompressed(const TensorView& input, const codecs::Codec* codec,
                                        codecs::CodecState* state, int peer, uint32_t tag,
                                        void* cuda_stream) {
  if (codec == nullptr || peer < 0 || peer >= nranks() || peer == rank()) {
    return CompletedRequest(absl::InvalidArgumentError(
        absl::StrCat("SendCompressed: bad codec or peer ", peer)));
  }
  absl::Status status = fabric_->aborted();
  if (!status.ok()) {
    return CompletedRequest(absl::FailedPreconditionError(
        absl::StrCat("SendCompressed: the communicator failed earlier: ", status.ToString())));
  }
  absl::StatusOr<size_t> max = codec->MaxEncodedBytes(input.shape());
  if (!max.ok()) return CompletedRequest(max.status());
  auto payload = std::make_shared<std::vector<uint8_t>>(*max);
  absl::StatusOr<size_t> size =
      EncodeTensor(*codec, input, state, absl::MakeSpan(*payload), cuda_stream, nullptr);
  if (!size.ok()) return CompletedRequest(Annotate(size.status(), "SendCompressed"));
  payload->resize(*size);
  auto request = std::make_shared<Request>();
  fabric_->out(group_.ranks[peer])
      ->Send(MakeTag(comm_id_, tag, kP2pStep), *payload, {transport::Priority::kHigh},
             [request, payload, state](absl::Status status) {
               if (state != nullptr) {
                 absl::Status s = status.ok() ? state->Commit() : state->Abort();
                 if (status.ok()) status = s;
               }
               request->Complete(Annotate(status, "SendCompressed"));
             });
  return request;
}

RequestPtr Communicator::RecvCompressed(const TensorView& out, int peer, uint32_t tag,
                                        PayloadDecoder decode, void* cuda_stream) {
  if (peer < 0 || peer >= nranks() || peer == rank()) {
    return CompletedRequest(
        absl::InvalidArgumentError(absl::StrCat("RecvCompressed: bad peer ", peer)));
  }
  if (out.dtype() != DType::kF32) {
    return CompletedRequest(
        absl::InvalidArgumentError("RecvCompressed: out must be an f32 tensor"));
  }
  absl::Status status = fabric_->aborted();
  if (!status.ok()) {
    return CompletedRequest(absl::FailedPreconditionError(
        absl::StrCat("RecvCompressed: the communicator failed earlier: ", status.ToString())));
  }
  if (!decode) {
    decode = [cuda_stream](absl::Span<const uint8_t> payload, const TensorView& target) {
      codecs::DecodeOptions options;
      options.aggregation = codecs::Aggregation::kSum;
      return DecodeTensor({payload}, options, target, nullptr, cuda_stream, nullptr);
    };
  }
  auto request = std::make_shared<Request>();
  auto buffer = std::make_shared<std::vector<uint8_t>>();
  // A payload is at most the dense f32 tensor plus headers, whatever the codec.
  const size_t limit = out.num_bytes() + (size_t{1} << 20);
  fabric_->in(group_.ranks[peer])
      ->Recv(
          MakeTag(comm_id_, tag, kP2pStep),
          [buffer, limit](size_t size) -> absl::StatusOr<absl::Span<uint8_t>> {
            if (size > limit) {
              return absl::DataLossError(
                  absl::StrCat("compressed message of ", size, " bytes for a tensor of ",
                               limit - (size_t{1} << 20), " bytes"));
            }
            buffer->resize(size);
            return absl::MakeSpan(*buffer);
          },
          [request, buffer, out, decode](absl::StatusOr<size_t> n) {
            absl::Status status = n.status();
            if (status.ok()) status = decode(*buffer, out);
            request->Complete(Annotate(status, "RecvCompressed"));
          });
  return request;
}

}  // namespace lbcc::comm
