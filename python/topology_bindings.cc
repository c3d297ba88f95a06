// Bootstrap functions (unique ids, roots) and lbcc.Topology.
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "comm/bootstrap.h"
#include "comm/config.h"
#include "comm/topology.h"
#include "python/bindings.h"
#include "python/comm_bindings.h"

namespace lbcc::python {
namespace {

py::bytes IdBytes(const comm::UniqueId& id) { return py::bytes(id.internal, sizeof(id.internal)); }

py::dict RoleDict(const comm::RankRole& role) {
  py::dict d;
  d["kind"] = role.kind == comm::RankRole::Kind::kFull ? "full" : "pipeline";
  d["replica"] = role.replica;
  d["stage"] = role.stage;
  return d;
}

}  // namespace

comm::UniqueId IdFromBytes(const py::bytes& b) {
  absl::Span<const uint8_t> s = BytesSpan(b);
  if (s.size() != sizeof(comm::UniqueId)) {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat("unique id: expected ", sizeof(comm::UniqueId), " bytes, got ", s.size())));
  }
  comm::UniqueId id;
  std::memcpy(id.internal, s.data(), sizeof(id.internal));
  return id;
}

void BindUniqueIdFunctions(py::module_& m) {
  m.def(
      "create_unique_id",
      [](std::optional<std::string> listen_host, std::optional<double> timeout_s) {
        comm::CommConfig config;
        config.listen_host = std::move(listen_host);
        if (timeout_s.has_value()) config.timeout = absl::Seconds(*timeout_s);
        absl::StatusOr<comm::UniqueId> id;
        {
          py::gil_scoped_release release;
          id = comm::CreateUniqueId(config);
        }
        return IdBytes(ValueOrThrow(std::move(id)));
      },
      py::arg("listen_host") = py::none(), py::arg("timeout") = py::none(),
      "Starts a bootstrap root (this process, a background thread) and returns its unique id "
      "(bytes): send it to every rank, then each calls Communicator.init. Unset: "
      "LBCC_LISTEN_ADDR, LBCC_TIMEOUT_S.");
  m.def(
      "unique_id_from_address",
      [](const std::string& address, uint64_t session) {
        return IdBytes(ValueOrThrow(comm::UniqueIdFromAddress(address, session)));
      },
      py::arg("address"), py::arg("session") = 0);
  m.def(
      "start_root",
      [](const std::string& address, int nranks, uint64_t session, double timeout_s) {
        py::gil_scoped_release release;
        ThrowIfError(comm::StartRoot(address, nranks, session, absl::Seconds(timeout_s)));
      },
      py::arg("address"), py::arg("nranks"), py::arg("session") = 0, py::arg("timeout") = 300.0);
  m.def(
      "unique_id_address",
      [](const py::bytes& id) { return comm::UniqueIdAddress(IdFromBytes(id)); },
      py::arg("unique_id"));
}

void BindTopology(py::module_& m) {
  py::class_<PyTopology>(
      m, "Topology", "Fast islands, full and pipeline replicas, link classes (comm/topology.h).")
      .def_static(
          "flat", [](int nranks) { return PyTopology{comm::Topology::Flat(nranks)}; },
          py::arg("nranks"))
      .def_static(
          "from_json",
          [](const std::string& json) {
            return PyTopology{ValueOrThrow(comm::Topology::FromJson(json))};
          },
          py::arg("json"))
      .def_static(
          "from_file",
          [](const std::string& path) {
            return PyTopology{ValueOrThrow(comm::Topology::FromFile(path))};
          },
          py::arg("path"))
      .def("to_json", [](const PyTopology& t) { return t.topology.ToJson(); })
      .def_property_readonly("nranks", [](const PyTopology& t) { return t.topology.nranks(); })
      .def_property_readonly("num_shards",
                             [](const PyTopology& t) { return t.topology.num_shards(); })
      .def_property_readonly("islands", [](const PyTopology& t) { return t.topology.islands(); })
      .def_property_readonly("replicas",
                             [](const PyTopology& t) {
                               py::list out;
                               for (const auto& r : t.topology.replicas()) {
                                 py::dict d;
                                 d["kind"] =
                                     r.kind == comm::RankRole::Kind::kFull ? "full" : "pipeline";
                                 d["ranks"] = r.ranks;
                                 out.append(d);
                               }
                               return out;
                             })
      .def(
          "shard_ranks", [](const PyTopology& t, int s) { return t.topology.ShardRanks(s); },
          py::arg("shard"))
      .def(
          "role",
          [](const PyTopology& t, int rank) {
            if (rank < 0 || rank >= t.topology.nranks()) throw py::index_error("rank out of range");
            return RoleDict(t.topology.role(rank));
          },
          py::arg("rank"))
      .def(
          "link",
          [](const PyTopology& t, int a, int b) {
            if (a < 0 || b < 0 || a >= t.topology.nranks() || b >= t.topology.nranks()) {
              throw py::index_error("rank out of range");
            }
            return std::string(comm::LinkClassName(t.topology.link(a, b)));
          },
          py::arg("a"), py::arg("b"))
      .def(
          "with_slow_ranks",
          [](const PyTopology& t, std::vector<int> ranks) {
            PyTopology copy = t;
            ThrowIfError(copy.topology.MarkSlowRanks(ranks));
            return copy;
          },
          py::arg("ranks"), "A copy in which every link touching `ranks` is slow.")
      .def(py::pickle([](const PyTopology& t) { return py::make_tuple(t.topology.ToJson()); },
                      [](const py::tuple& t) {
                        if (t.size() != 1) throw py::value_error("Topology: bad pickle");
                        return PyTopology{
                            ValueOrThrow(comm::Topology::FromJson(t[0].cast<std::string>()))};
                      }))
      .def("__repr__", [](const PyTopology& t) { return "Topology(" + t.topology.ToJson() + ")"; });
}

}  // namespace lbcc::python
