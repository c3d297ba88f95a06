// lbcc.ElasticMaster and lbcc._ElasticGroup over comm/elastic/elastic.h (python/lbcc/elastic.py
// wraps the group with the retry loop).
//
// Lifetimes: a group keeps its shared-state arrays referenced for its whole life (the C++ group
// writes them in Boundary()). Blocking calls (joining, Boundary, SparseAllReduce, Leave, Stop)
// release the GIL; the group's own threads never touch Python objects.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "comm/elastic/elastic.h"
#include "python/bindings.h"

namespace lbcc::python {
namespace {

struct PyElasticGroup {
  std::unique_ptr<comm::ElasticGroup> group;
  py::tuple shared;  // the arrays the group reads and writes
  // The outputs of the last successful exchange, kept alive until the next call: the group
  // may forward them from there to a member whose exchange failed (comm/elastic/elastic.h).
  py::list held_outs;
};

// comm::ElasticUnits is opaque: Python holds it through this.
struct PyElasticUnits {
  std::shared_ptr<comm::ElasticUnits> units;
};

comm::ElasticGroup& Group(PyElasticGroup& self) {
  if (self.group == nullptr) {
    throw StatusError(absl::FailedPreconditionError("ElasticGroup: this member left the group"));
  }
  return *self.group;
}

std::unique_ptr<comm::ElasticMaster> StartElasticMaster(const std::string& job_id,
                                                        const std::string& listen,
                                                        double peer_timeout_ms, int min_members,
                                                        const std::string& bootstrap_host,
                                                        const PyElasticUnits* units) {
  comm::ElasticMasterOptions o;
  if (units != nullptr) o.units = units->units;
  o.job_id = job_id;
  o.listen_address = listen;
  o.peer_timeout = absl::Milliseconds(peer_timeout_ms);
  o.min_members = min_members;
  o.bootstrap_host = bootstrap_host;
  py::gil_scoped_release release;
  return ValueOrThrow(comm::ElasticMaster::Start(o));
}

std::unique_ptr<PyElasticGroup> JoinElasticGroup(
    py::list shared, const std::string& master, const std::string& job_id,
    const std::string& name, const std::string& backend, double op_timeout, double join_timeout,
    double peer_timeout_ms, int64_t state_step, const std::string& replica, int stage,
    int replica_stages) {
  auto self = std::make_unique<PyElasticGroup>();
  self->shared = py::tuple(shared);
  std::vector<TensorView> views;
  for (size_t i = 0; i < shared.size(); ++i) {
    const std::string what = absl::StrCat("shared_state[", i, "]");
    views.push_back(ToF32View(shared[i], what.c_str(), Access::kWrite));
  }
  comm::ElasticOptions o;
  o.master_address = master;
  o.job_id = job_id;
  o.name = name;
  if (!backend.empty()) o.comm_config.backend = backend;
  o.op_timeout = absl::Seconds(op_timeout);
  o.join_timeout = absl::Seconds(join_timeout);
  o.peer_timeout = absl::Milliseconds(peer_timeout_ms);
  o.state_step = state_step;
  o.replica = replica;
  o.stage = stage;
  o.replica_stages = replica_stages;
  py::gil_scoped_release release;
  self->group = ValueOrThrow(comm::ElasticGroup::Join(o, std::move(views)));
  return self;
}

void GroupSparseAllReduce(PyElasticGroup& self, py::list deltas, py::list outs,
                          std::shared_ptr<codecs::Codec> codec, py::list states,
                          const std::string& aggregation) {
  if (codec == nullptr) throw py::type_error("codec: expected an lbcc.Codec");
  if (deltas.size() != outs.size() || deltas.size() != states.size()) {
    throw StatusError(absl::InvalidArgumentError(absl::StrCat(
        "ElasticGroup.sparse_all_reduce: ", deltas.size(), " deltas, ", outs.size(),
        " outputs, ", states.size(), " states")));
  }
  std::vector<std::shared_ptr<codecs::CodecState>> keep;
  std::vector<comm::Communicator::SparseTensor> tensors;
  for (size_t i = 0; i < deltas.size(); ++i) {
    const std::string d = absl::StrCat("deltas[", i, "]"), o = absl::StrCat("outs[", i, "]");
    keep.push_back(states[i].is_none() ? nullptr
                                       : states[i].cast<std::shared_ptr<codecs::CodecState>>());
    tensors.push_back({ToF32View(deltas[i], d.c_str()),
                       ToF32View(outs[i], o.c_str(), Access::kWrite), keep.back().get()});
  }
  codecs::DecodeOptions decode;
  decode.aggregation = ParseAggregationOrThrow(aggregation);
  comm::ElasticGroup& g = Group(self);
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = g.SparseAllReduce(tensors, codec.get(), decode);
  }
  if (status.ok()) self.held_outs = outs;
  ThrowIfError(status);
}

void LeaveGroup(PyElasticGroup& self) {
  if (self.group == nullptr) return;
  std::unique_ptr<comm::ElasticGroup> g = std::move(self.group);
  py::gil_scoped_release release;
  ThrowIfError(g->Leave());
  g.reset();
}

py::dict GroupStats(PyElasticGroup& self) {
  const comm::ElasticStats st = Group(self).stats();
  py::dict d;
  d["state_bytes"] = st.state_bytes;
  d["state_bytes_sent"] = st.state_bytes_sent;
  d["state_bytes_received"] = st.state_bytes_received;
  d["epochs_seen"] = st.epochs_seen;
  d["aborted_calls"] = st.aborted_calls;
  d["committed_epoch"] = st.committed_epoch;
  return d;
}

void BindElasticUnits(py::module_& m) {
  py::class_<PyElasticUnits>(
      m, "ElasticUnits",
      "Shared by the ElasticMasters of one model's shard jobs (in one process): pipeline "
      "replicas leave and join as units across them (comm/elastic/elastic.h).")
      .def(py::init([] { return PyElasticUnits{comm::NewElasticUnits()}; }));
}

void BindElasticMaster(py::module_& m) {
  py::class_<comm::ElasticMaster>(m, "ElasticMaster",
                                  "The membership service of an elastic job (lbcc-master).")
      .def(py::init(&StartElasticMaster), py::arg("job_id"), py::arg("listen") = "127.0.0.1:0",
           py::arg("peer_timeout_ms") = 0.0, py::arg("min_members") = 1,
           py::arg("bootstrap_host") = "", py::arg("units") = nullptr)
      .def_property_readonly("address", &comm::ElasticMaster::address)
      .def_property_readonly("epoch", &comm::ElasticMaster::epoch)
      .def_property_readonly("committed_steps", &comm::ElasticMaster::committed_steps)
      .def_property_readonly("members", &comm::ElasticMaster::members)
      .def(
          "await_committed_steps",
          [](comm::ElasticMaster& m, uint64_t n, double timeout_s) {
            return m.AwaitCommittedSteps(n, absl::Seconds(timeout_s));
          },
          py::arg("n"), py::arg("timeout_s") = 60.0, py::call_guard<py::gil_scoped_release>(),
          "Waits until the job committed n outer steps (members commit first, the master's "
          "decision follows); False at the timeout.")
      .def("stop", &comm::ElasticMaster::Stop, py::call_guard<py::gil_scoped_release>());
}

void BindElasticGroup(py::module_& m) {
  py::class_<PyElasticGroup>(m, "_ElasticGroup",
                             "One member of an elastic job (use lbcc.ElasticGroup).")
      .def(py::init(&JoinElasticGroup), py::arg("shared_state"), py::arg("master_address") = "",
           py::arg("job_id"), py::arg("name") = "", py::arg("backend") = "",
           py::arg("op_timeout") = 300.0, py::arg("join_timeout") = 600.0,
           py::arg("peer_timeout_ms") = 0.0, py::arg("state_step") = -1,
           py::arg("replica") = "", py::arg("stage") = 0, py::arg("replica_stages") = 0)
      .def("boundary",
           [](PyElasticGroup& self) {
             comm::ElasticGroup& g = Group(self);
             py::gil_scoped_release release;
             ThrowIfError(g.Boundary());
           })
      .def("sparse_all_reduce", &GroupSparseAllReduce, py::arg("deltas"), py::arg("outs"),
           py::arg("codec"), py::arg("states"), py::arg("aggregation") = "sparseloco")
      .def("leave", &LeaveGroup)
      .def(
          "await_epoch",
          [](PyElasticGroup& self, uint64_t n, double timeout) {
            comm::ElasticGroup& g = Group(self);
            py::gil_scoped_release release;
            return g.AwaitEpoch(n, absl::Seconds(timeout));
          },
          py::arg("n"), py::arg("timeout"),
          "Waits up to `timeout` seconds until the epoch is at least `n`; False at the timeout "
          "and, at once, when the group failed (evicted, its pipeline replica left, the master "
          "lost): its next call raises why.")
      .def_property_readonly("epoch", [](PyElasticGroup& s) { return Group(s).epoch(); })
      .def_property_readonly("rank", [](PyElasticGroup& s) { return Group(s).rank(); })
      .def_property_readonly("size", [](PyElasticGroup& s) { return Group(s).size(); })
      .def_property_readonly("step", [](PyElasticGroup& s) { return Group(s).step(); })
      .def_property_readonly("stats", &GroupStats);
}

}  // namespace

void BindElastic(py::module_& m) {
  BindElasticUnits(m);
  BindElasticMaster(m);
  BindElasticGroup(m);
}

}  // namespace lbcc::python
