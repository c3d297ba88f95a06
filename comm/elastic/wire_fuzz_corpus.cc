// Writes the seed corpora of the membership fuzzers from a real session: a master and three
// members (threads over the loopback transport) that join through a FrameRecorder
// (elastic_testing.h), step, see one leave and a newcomer join, step again and leave; plus a
// join refused for another job id. Every frame is what the production code sent.
//   wire_member_corpus/: per connection, what the master sent it (the member's reader's input),
//     after the fuzzer's piece-size byte (whole stream at once, and 7-byte pieces);
//   wire_master_corpus/: what members sent, as [u8 connection][u32 length][body] records in
//     the order they arrived (the whole session, and each connection's own);
//   and the regression input of a finding (refusal_code_ok).
//
//   bazel run //comm/elastic:wire_fuzz_corpus -- $PWD/comm/elastic/testdata
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/elastic/elastic_testing.h"

namespace {

using lbcc::comm::elastic_testing::FrameRecorder;
using lbcc::comm::elastic_testing::TestMember;

bool Write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) std::fprintf(stderr, "cannot write %s\n", path.c_str());
  return static_cast<bool>(out);
}

#define CHECK_OK(expr)                                                             \
  do {                                                                             \
    absl::Status s_ = (expr);                                                      \
    if (!s_.ok()) {                                                                \
      std::fprintf(stderr, "%s: %s\n", #expr, std::string(s_.ToString()).c_str()); \
      return 1;                                                                    \
    }                                                                              \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: wire_fuzz_corpus <testdata folder>\n");
    return 2;
  }
  const std::string dir = argv[1];
  using namespace lbcc::comm;
  absl::StatusOr<std::unique_ptr<ElasticMaster>> master =
      ElasticMaster::Start(elastic_testing::TestMasterOptions(2));
  CHECK_OK(master.status());
  absl::StatusOr<std::unique_ptr<FrameRecorder>> recorder =
      FrameRecorder::Start((*master)->address());
  CHECK_OK(recorder.status());
  auto codec = elastic_testing::TestCodec();
  {
    TestMember m[3];
    std::vector<absl::Status> results(3);
    for (int i = 0; i < 3; ++i) m[i].seed = i;
    auto run = [&](std::vector<int> who, int steps, bool join) {
      std::vector<std::thread> t;
      for (int i : who) {
        t.emplace_back([&, i] {
          if (join) results[i] = m[i].Join((*recorder)->address(), absl::StrCat("m", i));
          for (int s = 0; s < steps && results[i].ok(); ++s) results[i] = m[i].Step(*codec);
        });
      }
      for (auto& x : t) x.join();
    };
    run({0, 1}, 3, true);
    for (int i : {0, 1}) CHECK_OK(results[i]);
    CHECK_OK(m[1].Leave());
    // A newcomer waits for a step boundary: m0 steps once it waits, both until step `target`.
    const uint64_t target = m[0].group->step() + 3;
    auto until = [&](int i) {
      while (results[i].ok() && m[i].group->step() < target) results[i] = m[i].Step(*codec);
    };
    std::thread newcomer([&] {
      results[2] = m[2].Join((*recorder)->address(), "m2");
      until(2);
    });
    if (!(*master)->AwaitWaiting(1, absl::Seconds(30))) {
      std::fprintf(stderr, "the newcomer never waited\n");
      return 1;
    }
    until(0);
    newcomer.join();
    CHECK_OK(results[0]);
    CHECK_OK(results[2]);
    CHECK_OK(m[0].Leave());
    CHECK_OK(m[2].Leave());
  }
  {
    // A join for another job: the master's refusal.
    TestMember stranger;
    elastic::Message join;
    join.type = elastic::MsgType::kJoin;
    join.job_id = "another-job";
    join.name = "stranger";
    absl::StatusOr<std::unique_ptr<elastic::Socket>> sock =
        elastic::Socket::Connect((*recorder)->address(), absl::Now() + absl::Seconds(10));
    CHECK_OK(sock.status());
    CHECK_OK((*sock)->Send(join, absl::Now() + absl::Seconds(5)));
    absl::StatusOr<elastic::Message> refusal = (*sock)->Receive(absl::Now() + absl::Seconds(10));
    CHECK_OK(refusal.status());
  }
  const std::vector<FrameRecorder::Frame> frames = (*recorder)->frames();
  recorder->reset();
  std::map<int, std::string> to_member, from_member;
  std::string session;
  for (const FrameRecorder::Frame& f : frames) {
    if (f.from_member) {
      const std::string record = std::string(1, static_cast<char>(f.connection & 3)) + f.framed;
      session += record;
      from_member[f.connection] += record;
    } else {
      to_member[f.connection] += f.framed;
    }
  }
  int written = 0;
  for (const auto& [connection, stream] : to_member) {
    const std::string base = absl::StrCat(dir, "/wire_member_corpus/connection", connection);
    written += Write(base, std::string(1, '\xff') + stream);
    written += Write(base + "_pieces", std::string(1, '\x06') + stream);
  }
  written += Write(dir + "/wire_master_corpus/session", session);
  for (const auto& [connection, records] : from_member) {
    written += Write(absl::StrCat(dir, "/wire_master_corpus/connection", connection), records);
  }
  // wire_member_fuzz's regression input: a refusal whose status code is OK (wire_test.cc).
  elastic::Message refuse;
  refuse.type = elastic::MsgType::kRefuse;
  refuse.code = 0;
  refuse.text = "refused with OK";
  const std::string body = elastic::Encode(refuse);
  std::string framed(4, '\0');
  const uint32_t size = static_cast<uint32_t>(body.size());
  std::memcpy(framed.data(), &size, 4);
  written += Write(dir + "/wire_member_corpus/refusal_code_ok", "\xff" + framed + body);
  std::printf("wrote %d seed files from %zu frames\n", written, frames.size());
  return 0;
}
