// A member on a machine whose UCX cannot be loaded (LBCC_UCX_LIBRARY names no library, set by the
// BUILD target for the whole process): its Join fails at once with FailedPrecondition naming the
// loader's error, instead of joining and failing every epoch's set-up, which left the master
// handing out new epochs for ever. A member over another transport joins as usual.
#include <memory>
#include <vector>

#include "base/status_matchers.h"
#include "comm/elastic/elastic.h"
#include "gtest/gtest.h"

namespace lbcc::comm {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(ElasticNoUcxTest, JoinFailsAtOnceNamingWhyUcxCannotLoad) {
  ElasticMasterOptions mo;
  mo.job_id = "no-ucx";
  mo.min_members = 1;
  absl::StatusOr<std::unique_ptr<ElasticMaster>> master = ElasticMaster::Start(mo);
  ASSERT_THAT(master.status(), IsOk());
  std::vector<float> params(1024, 0.f);
  ElasticOptions o;
  o.master_address = (*master)->address();
  o.job_id = "no-ucx";
  o.name = "m0";
  o.comm_config.backend = "ucx";
  absl::StatusOr<std::unique_ptr<ElasticGroup>> g =
      ElasticGroup::Join(o, {*TensorView::Host(params.data(), {1024})});
  EXPECT_THAT(g.status(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                   AllOf(HasSubstr("ElasticGroup: the ucx transport"),
                                         HasSubstr("UCX could not be loaded"),
                                         HasSubstr("/nonexistent/libucp.so.0"))));
  EXPECT_EQ((*master)->members(), 0);

  o.comm_config.backend = "loopback";
  g = ElasticGroup::Join(o, {*TensorView::Host(params.data(), {1024})});
  ASSERT_THAT(g.status(), IsOk());
  EXPECT_EQ((*master)->members(), 1);
  EXPECT_THAT((*g)->Leave(), IsOk());
  (*master)->Stop();
}

}  // namespace
}  // namespace lbcc::comm
