// Test helpers for the membership service (testonly): a member as a thread's object over the
// loopback transport (join, retried outer steps, leave), and a TCP relay between members and
// the master that records the frames each way (the seed corpora of the membership fuzzers are
// real sessions recorded this way: wire_fuzz_corpus.cc).
//
// Thread-safety: a TestMember is used by one thread at a time; FrameRecorder is thread-safe.
#ifndef LBCC_COMM_ELASTIC_ELASTIC_TESTING_H_
#define LBCC_COMM_ELASTIC_ELASTIC_TESTING_H_

#include <poll.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "codecs/topk_ef.h"
#include "comm/elastic/elastic.h"
#include "comm/elastic/wire.h"

namespace lbcc::comm::elastic_testing {

inline constexpr int64_t kTestElements = 4096;

inline ElasticMasterOptions TestMasterOptions(int min_members) {
  ElasticMasterOptions o;
  o.job_id = "job-1";
  o.peer_timeout = absl::Seconds(5);
  o.min_members = min_members;
  return o;
}

inline std::unique_ptr<codecs::TopKEfCodec> TestCodec() {
  return *codecs::TopKEfCodec::Create(codecs::TopKEfOptions());
}

// One member: a parameter vector, its error feedback and the steps it committed.
struct TestMember {
  int seed = 0;
  std::vector<float> params = std::vector<float>(kTestElements, 0.f);
  std::vector<float> out = std::vector<float>(kTestElements, 0.f);
  codecs::TopKEfState state;
  std::unique_ptr<ElasticGroup> group;
  std::vector<uint64_t> committed;
  int retries = 0;

  absl::Status Join(const std::string& master_address, const std::string& name,
                    absl::Duration peer_timeout = absl::Seconds(5)) {
    ElasticOptions o;
    o.master_address = master_address;
    o.job_id = "job-1";
    o.name = name;
    o.comm_config.backend = "loopback";
    o.peer_timeout = peer_timeout;
    o.op_timeout = absl::Seconds(30);
    o.join_timeout = absl::Seconds(60);
    LBCC_ASSIGN_OR_RETURN(TensorView p, TensorView::Host(params.data(), {kTestElements}));
    LBCC_ASSIGN_OR_RETURN(group, ElasticGroup::Join(o, {p}));
    return absl::OkStatus();
  }

  // One outer step, retried over new epochs (membership changes abort it).
  absl::Status Step(const codecs::Codec& codec) {
    for (int attempt = 0; attempt < 50; ++attempt) {
      absl::Status s = group->Boundary();
      if (IsRetryable(s)) {
        ++retries;
        continue;
      }
      LBCC_RETURN_IF_ERROR(s);
      const uint64_t step = group->step();
      std::mt19937 rng(static_cast<uint32_t>(seed * 7919 + step));
      std::normal_distribution<float> normal(0, 1);
      std::vector<float> delta(kTestElements);
      for (float& x : delta) x = normal(rng);
      LBCC_ASSIGN_OR_RETURN(TensorView d, TensorView::Host(delta.data(), {kTestElements}));
      LBCC_ASSIGN_OR_RETURN(TensorView o, TensorView::Host(out.data(), {kTestElements}));
      s = group->SparseAllReduce({{d, o, &state}}, &codec);
      if (IsRetryable(s)) {
        ++retries;
        continue;
      }
      LBCC_RETURN_IF_ERROR(s);
      for (int64_t i = 0; i < kTestElements; ++i) params[i] += out[i];
      committed.push_back(step);
      return absl::OkStatus();
    }
    return absl::InternalError(absl::StrCat("member ", seed, ": too many retries"));
  }

  absl::Status Leave() {
    absl::Status s = group->Leave();
    group.reset();
    return s;
  }
};

// A relay on 127.0.0.1 in front of the master: each member that connects to address() gets a
// connection of its own to the master; every frame is forwarded as it is and recorded.
class FrameRecorder {
 public:
  struct Frame {
    int connection;       // in the order members connected, from 0
    bool from_member;     // member -> master, else master -> member
    std::string framed;   // u32 length + body, as on the wire
  };

  static absl::StatusOr<std::unique_ptr<FrameRecorder>> Start(std::string master) {
    auto r = std::unique_ptr<FrameRecorder>(new FrameRecorder(std::move(master)));
    LBCC_ASSIGN_OR_RETURN(r->listener_, elastic::Socket::Listen("127.0.0.1:0", &r->address_));
    r->acceptor_ = std::thread([p = r.get()] { p->AcceptLoop(); });
    return r;
  }
  ~FrameRecorder() {
    stop_ = true;
    listener_->Shutdown();
    acceptor_.join();
    std::vector<std::thread> pumps;
    {
      MutexLock lock(&mu_);
      for (auto& s : socks_) s->Shutdown();
      pumps.swap(pumps_);
    }
    for (std::thread& t : pumps) t.join();
  }
  const std::string& address() const { return address_; }
  std::vector<Frame> frames() {
    MutexLock lock(&mu_);
    return frames_;
  }

 private:
  explicit FrameRecorder(std::string master) : master_(std::move(master)) {}

  void AcceptLoop() {
    while (!stop_) {
      absl::StatusOr<std::unique_ptr<elastic::Socket>> member =
          listener_->Accept(absl::Now() + absl::Milliseconds(100));
      if (!member.ok()) continue;
      absl::StatusOr<std::unique_ptr<elastic::Socket>> master =
          elastic::Socket::Connect(master_, absl::Now() + absl::Seconds(10));
      if (!master.ok()) continue;
      std::shared_ptr<elastic::Socket> a = std::move(*member), b = std::move(*master);
      MutexLock lock(&mu_);
      const int id = connections_++;
      socks_.push_back(a);
      socks_.push_back(b);
      pumps_.emplace_back([this, a, b, id] { Pump(a, b, id, true); });
      pumps_.emplace_back([this, a, b, id] { Pump(b, a, id, false); });
    }
  }

  // Forwards frames from `in` to `out` until either closes, then closes both.
  void Pump(std::shared_ptr<elastic::Socket> in, std::shared_ptr<elastic::Socket> out, int id,
            bool from_member) {
    elastic::FrameReader frames(elastic::kMaxFrame);
    char buffer[4096];
    while (true) {
      absl::StatusOr<size_t> n = in->ReadSome(buffer, sizeof(buffer));
      if (!n.ok()) break;
      if (*n == 0) {
        pollfd p{in->fd(), POLLIN, 0};
        poll(&p, 1, elastic::kPollSliceMs);
        continue;
      }
      frames.Append(absl::string_view(buffer, *n));
      bool failed = false;
      while (true) {
        absl::StatusOr<std::optional<std::string>> body = frames.Next();
        if (!body.ok()) {
          failed = true;
          break;
        }
        if (!body->has_value()) break;
        absl::StatusOr<elastic::Message> m = elastic::Decode(**body);
        if (!m.ok()) {
          failed = true;
          break;
        }
        // Recorded before it is forwarded: once the other side has it, the frame is in frames().
        std::string framed(4, '\0');
        const uint32_t size = static_cast<uint32_t>((*body)->size());
        std::memcpy(framed.data(), &size, 4);
        framed += **body;
        {
          MutexLock lock(&mu_);
          frames_.push_back(Frame{id, from_member, std::move(framed)});
        }
        if (!out->Send(*m, absl::Now() + absl::Seconds(5)).ok()) {
          failed = true;
          break;
        }
      }
      if (failed) break;
    }
    in->Shutdown();
    out->Shutdown();
  }

  const std::string master_;
  std::string address_;
  std::unique_ptr<elastic::Socket> listener_;
  std::thread acceptor_;
  std::atomic<bool> stop_{false};
  Mutex mu_;
  int connections_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::shared_ptr<elastic::Socket>> socks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
  std::vector<Frame> frames_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lbcc::comm::elastic_testing

#endif  // LBCC_COMM_ELASTIC_ELASTIC_TESTING_H_
