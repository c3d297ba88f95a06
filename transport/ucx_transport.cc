#include "transport/ucx_transport.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "transport/ucx_engine.h"

namespace lbcc::transport {
namespace {

using ucx_internal::Engine;

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {}
  ~UcxTransport() override { engine_->Shutdown(); }

  void Shutdown() override { engine_->Shutdown(); }
  absl::string_view backend() const override { return "ucx"; }
  absl::StatusOr<std::string> Listen(absl::string_view address) override {
    return engine_->Listen(address);
  }
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(absl::string_view address,
                                                    absl::Duration timeout,
                                                    ConnectOptions options) override {
    return engine_->Connect(address, timeout, options);
  }
  absl::StatusOr<std::unique_ptr<Endpoint>> Accept(absl::Duration timeout) override {
    return engine_->Accept(timeout);
  }

 private:
  std::shared_ptr<Engine> engine_;
};

}  // namespace

absl::Status UcxAvailable() {
  const ucx_api::LoadInfo& info = ucx_api::Info();
  if (info.loaded) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "UCX could not be loaded (", info.error,
      "): install UCX (Debian: libucx0), point LBCC_UCX_LIBRARY at a libucp.so.0, or choose "
      "another transport (LBCC_TRANSPORT=socket)"));
}

absl::StatusOr<std::unique_ptr<Transport>> NewUcxTransport(const TransportOptions& options) {
  LBCC_RETURN_IF_ERROR(UcxAvailable());
  LBCC_ASSIGN_OR_RETURN(std::shared_ptr<Engine> engine, Engine::Create(options));
  return std::make_unique<UcxTransport>(std::move(engine));
}

}  // namespace lbcc::transport
