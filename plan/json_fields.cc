#include "plan/json_fields.h"

#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace lbcc::plan {

absl::StatusOr<double> JsonNumber(const nlohmann::json& object, const char* key,
                                  absl::string_view where, std::optional<double> fallback,
                                  bool zero_ok) {
  const std::string field = absl::StrCat(where, ".", key);
  if (!object.contains(key)) {
    if (fallback) return *fallback;
    return absl::InvalidArgumentError(absl::StrCat(field, ": is required"));
  }
  const nlohmann::json& v = object[key];
  if (!v.is_number()) return absl::InvalidArgumentError(absl::StrCat(field, ": must be a number"));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < 0 || (x == 0 && !zero_ok)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": is ", x, "; must be ", zero_ok ? ">= 0" : "> 0"));
  }
  return x;
}

absl::StatusOr<int64_t> JsonInteger(const nlohmann::json& object, const char* key,
                                    absl::string_view where, std::optional<int64_t> fallback,
                                    bool zero_ok) {
  LBCC_ASSIGN_OR_RETURN(
      const double x,
      JsonNumber(object, key, where,
                 fallback ? std::optional<double>(static_cast<double>(*fallback)) : std::nullopt,
                 zero_ok));
  if (x != std::floor(x) || x > 9.2e18) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".", key, ": is ", x, "; must be an integer"));
  }
  return static_cast<int64_t>(x);
}

}  // namespace lbcc::plan
