// Numbers in a planning document (plan.h's input, ring.h's "ring" section), read with errors that
// name the field: InvalidArgument "<where>.<key>: is required | must be a number | is -1; must
// be > 0 | ...; must be an integer". Thread-safety: pure functions.
#ifndef LBCC_PLAN_JSON_FIELDS_H_
#define LBCC_PLAN_JSON_FIELDS_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace lbcc::plan {

// object[key] as a finite number > 0 (>= 0 with zero_ok); `fallback` when absent (nullopt:
// required; a fallback is returned as given).
absl::StatusOr<double> JsonNumber(const nlohmann::json& object, const char* key,
                                  absl::string_view where, std::optional<double> fallback,
                                  bool zero_ok = false);
// The same, and a whole number.
absl::StatusOr<int64_t> JsonInteger(const nlohmann::json& object, const char* key,
                                    absl::string_view where, std::optional<int64_t> fallback,
                                    bool zero_ok = false);

}  // namespace lbcc::plan

#endif  // LBCC_PLAN_JSON_FIELDS_H_
