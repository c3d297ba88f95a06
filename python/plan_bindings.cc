// lbcc.plan's core: the planning model (plan/plan.h) over JSON text, so Python passes the same
// documents `lbcc plan` reads and gets the same JSON back (lbcc/plan.py wraps these as dicts).
#include <string>

#include "plan/plan.h"
#include "plan/ring.h"
#include "python/bindings.h"

namespace lbcc::python {
namespace {

plan::PlanInput Parse(const std::string& job) { return ValueOrThrow(plan::ParsePlanInput(job)); }

}  // namespace

void BindPlan(py::module_& m) {
  m.def(
      "plan_predict",
      [](const std::string& job) {
        const plan::PlanInput in = Parse(job);
        if (in.ring) return plan::ToJson(ValueOrThrow(plan::PredictRing(in))).dump();
        if (in.collective) return plan::ToJson(ValueOrThrow(plan::PredictCollective(in))).dump();
        return plan::ToJson(ValueOrThrow(plan::Predict(in))).dump();
      },
      py::arg("job"),
      "One outer step (or the job's \"collective\", or its context \"ring\" step) predicted from a plan document (JSON text);"
      " returns JSON text. InvalidArgumentError names a bad field.");
  m.def(
      "plan_recommend",
      [](const std::string& job) {
        return plan::ToJson(ValueOrThrow(plan::Recommend(Parse(job)))).dump();
      },
      py::arg("job"),
      "The least compression per replica reaching job.target_utilization, beside compress-all; "
      "JSON text.");
}

}  // namespace lbcc::python
