// The membership protocol's pure parts (wire.h): the join's answer as a status, frames cut
// from a stream that arrives in pieces, size limits, and counts that the bytes cannot back.
// The regression inputs are in testdata/wire_*_corpus too.
#include "comm/elastic/wire.h"

#include <cstring>
#include <string>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::comm::elastic {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;

std::string Framed(const std::string& body) {
  std::string out(4, '\0');
  const uint32_t size = static_cast<uint32_t>(body.size());
  std::memcpy(out.data(), &size, 4);
  return out + body;
}

// wire_member_fuzz: a refusal whose code is OK read as a successful join (MasterLink::Connect
// built a StatusOr from an OK status: an abort in debug builds), and codes absl does not know
// were passed on as they came.
TEST(WireTest, ARefusalWithoutARealStatusCodeIsDataLoss) {
  Message refuse;
  refuse.type = MsgType::kRefuse;
  refuse.text = "go away";
  refuse.code = 0;
  EXPECT_THAT(JoinAnswerStatus(refuse),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("unknown status code 0")));
  refuse.code = 1000;
  EXPECT_THAT(JoinAnswerStatus(refuse), StatusIs(absl::StatusCode::kDataLoss));
  refuse.code = static_cast<uint32_t>(absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(JoinAnswerStatus(refuse), StatusIs(absl::StatusCode::kInvalidArgument, "go away"));
  Message welcome;
  welcome.type = MsgType::kWelcome;
  EXPECT_THAT(JoinAnswerStatus(welcome), IsOk());
  Message epoch;
  epoch.type = MsgType::kHeartbeat;
  EXPECT_THAT(JoinAnswerStatus(epoch), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(WireTest, FramesArePiecedTogetherAndOversizedOnesRejected) {
  Message hb;
  hb.type = MsgType::kHeartbeat;
  const std::string stream = Framed(Encode(hb)) + Framed(Encode(hb));
  FrameReader frames(kMaxMemberFrame);
  int got = 0;
  for (char c : stream) {
    frames.Append(std::string(1, c));
    absl::StatusOr<std::optional<std::string>> body = frames.Next();
    ASSERT_THAT(body.status(), IsOk());
    if (body->has_value()) {
      ++got;
      EXPECT_THAT(Decode(**body).status(), IsOk());
    }
  }
  EXPECT_EQ(got, 2);
  EXPECT_EQ(frames.buffered(), 0u);
  FrameReader small(16);
  small.Append(Framed(std::string(17, 'x')));
  EXPECT_THAT(small.Next().status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("17 bytes (at most 16)")));
}

// An epoch message whose member count the body cannot back is truncated, not a 2^18-entry
// allocation per 30 bytes.
TEST(WireTest, CountsLargerThanTheBodyAreTruncation) {
  Message e;
  e.type = MsgType::kEpoch;
  e.nranks = 1;
  e.names = {"a"};
  std::string body = Encode(e);
  // Magic, version, type, epoch, step, rank, nranks, unique_id (empty): the needs_state count.
  const size_t at = 4 + 1 + 1 + 8 + 8 + 4 + 4 + 4;
  const uint32_t huge = 1 << 18;
  std::memcpy(body.data() + at, &huge, 4);
  EXPECT_THAT(Decode(body).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  EXPECT_THAT(Decode(Encode(e)).status(), IsOk());
}

}  // namespace
}  // namespace lbcc::comm::elastic
