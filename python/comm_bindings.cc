// Communicator and requests (the bootstrap functions and Topology: topology_bindings.cc).
//
// Lifetimes: every operation keeps the Python objects it reads or writes (tensors, codecs,
// states) referenced until the C++ request has finished, whether the caller waits or drops the
// request; a dropped unfinished request parks its references in `Orphans` until it finishes,
// so garbage collection never blocks and never frees memory the worker thread still uses.
// Communicators are destroyed with the GIL released (their destructor joins the worker).
//
// Waiting: the GIL is released; Ctrl-C is checked every 100 ms. An interrupted blocking call
// aborts the communicator (the operation fails on every rank instead of hanging), waits for the
// operation to finish and raises KeyboardInterrupt.
#include <Python.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "codecs/subspace_codec.h"
#include "comm/activations.h"
#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/topology.h"
#include "python/bindings.h"
#include "python/comm_bindings.h"
#include "python/torch_backend/link_bytes.h"

namespace lbcc::python {
namespace {

using comm::Communicator;
using comm::RequestPtr;

// Deletes a communicator without holding the GIL: its destructor waits for the worker thread,
// which may wait for other ranks that are Python threads of this process.
std::shared_ptr<Communicator> Share(std::unique_ptr<Communicator> c) {
  return std::shared_ptr<Communicator>(c.release(), [](Communicator* p) {
    if (Py_IsInitialized() && !_Py_IsFinalizing() && PyGILState_Check()) {
      py::gil_scoped_release release;
      delete p;
    } else {
      delete p;
    }
  });
}

// What an operation holds on to until it finishes.
struct Core {
  RequestPtr request;
  std::shared_ptr<Communicator> comm;
  std::vector<py::object> keep;
  std::shared_ptr<void> native;  // C++ buffers the operation writes (strings, selectors)
};

// Unfinished operations whose Python request was dropped (GIL-protected).
std::vector<std::unique_ptr<Core>>& Orphans() {
  static auto* orphans = new std::vector<std::unique_ptr<Core>>();
  return *orphans;
}

void PurgeOrphans() {
  auto& orphans = Orphans();
  for (size_t i = 0; i < orphans.size();) {
    if (orphans[i]->request->Test()) {
      orphans[i] = std::move(orphans.back());
      orphans.pop_back();
    } else {
      ++i;
    }
  }
}

// Waits with the GIL released, checking for Ctrl-C. Returns the operation's status; throws
// error_already_set when a signal handler raised (after `on_interrupt`).
absl::Status WaitInterruptibly(const RequestPtr& request,
                               const std::function<void()>& on_interrupt) {
  while (true) {
    {
      py::gil_scoped_release release;
      (void)request->WaitFor(absl::Milliseconds(100));
    }
    if (request->Test()) return request->status();
    if (PyErr_CheckSignals() != 0) {
      if (on_interrupt) {
        py::error_scope keep_error;  // the KeyboardInterrupt, restored on exit
        on_interrupt();
      }
      throw py::error_already_set();
    }
  }
}

// lbcc.Request: the handle of an operation posted with async_op=True.
class PyRequest {
 public:
  PyRequest(std::unique_ptr<Core> core, std::function<py::object(Core&)> result)
      : core_(std::move(core)), result_(std::move(result)) {}
  PyRequest(const PyRequest&) = delete;
  PyRequest& operator=(const PyRequest&) = delete;
  ~PyRequest() {
    if (core_ != nullptr && !core_->request->Test()) Orphans().push_back(std::move(core_));
  }

  bool Test() { return core_->request->Test(); }

  py::object Wait(std::optional<double> timeout_s) {
    absl::Status status;
    if (timeout_s.has_value()) {
      const absl::Time deadline = absl::Now() + absl::Seconds(*timeout_s);
      while (!core_->request->Test() && absl::Now() < deadline) {
        {
          py::gil_scoped_release release;
          (void)core_->request->WaitFor(std::min(
              absl::Milliseconds(100), std::max(absl::ZeroDuration(), deadline - absl::Now())));
        }
        if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      }
      if (!core_->request->Test()) {
        throw StatusError(absl::DeadlineExceededError(absl::StrCat(
            "Request.wait: not finished after ", *timeout_s, " s (the operation goes on)")));
      }
      status = core_->request->status();
    } else {
      status = WaitInterruptibly(core_->request, nullptr);
    }
    py::object result = status.ok() && result_ ? result_(*core_) : py::object(py::none());
    Release();
    ThrowIfError(status);
    return result;
  }

 private:
  // A finished operation needs neither its buffers nor the communicator any more: dropping
  // them lets close() destroy the communicator while this handle (or a traceback holding it)
  // lives on.
  void Release() {
    core_->keep.clear();
    core_->comm.reset();
  }

  std::unique_ptr<Core> core_;
  std::function<py::object(Core&)> result_;
};

// Either waits (async_op false: returns the result, raises on failure) or returns a Request.
py::object Finish(std::unique_ptr<Core> core, bool async_op,
                  std::function<py::object(Core&)> result = nullptr) {
  if (async_op) return py::cast(std::make_unique<PyRequest>(std::move(core), std::move(result)));
  std::shared_ptr<Communicator> comm = core->comm;
  absl::Status status = WaitInterruptibly(core->request, [&] {
    comm->Abort();
    py::gil_scoped_release release;
    (void)core->request->Wait();
  });
  ThrowIfError(status);
  return result ? result(*core) : py::object(py::none());
}

comm::OpOptions MakeOptions(std::optional<double> timeout_s, const std::string& algorithm,
                            const std::string& priority, comm::OpOptions base = {}) {
  comm::OpOptions o = base;
  if (timeout_s.has_value()) o.timeout = absl::Seconds(*timeout_s);
  o.algorithm = ValueOrThrow(comm::ParseAlgorithm(algorithm));
  if (priority == "high") {
    o.priority = transport::Priority::kHigh;
  } else if (priority == "normal") {
    o.priority = transport::Priority::kNormal;
  } else if (priority == "bulk") {
    o.priority = transport::Priority::kBulk;
  } else if (!priority.empty()) {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat("unknown priority '", priority, "' (high, normal, bulk)")));
  }
  return o;
}




comm::FabricOptions MakeFabricOptions(std::optional<std::string> backend,
                                      std::optional<std::string> listen_host,
                                      std::optional<double> timeout_s, py::handle topology) {
  comm::FabricOptions o = ValueOrThrow(comm::FabricOptionsFromEnv());
  if (backend.has_value()) o.backend = *backend;
  if (listen_host.has_value()) o.listen_host = *listen_host;
  if (timeout_s.has_value()) o.timeout = absl::Seconds(*timeout_s);
  if (py::isinstance<PyTopology>(topology)) {
    o.topology = topology.cast<const PyTopology&>().topology;
  } else if (py::isinstance<py::str>(topology)) {
    o.topology = ValueOrThrow(comm::Topology::FromFile(topology.cast<std::string>()));
  } else if (!topology.is_none()) {
    throw py::type_error("topology: expected an lbcc.Topology, a JSON file path or None");
  }
  return o;
}


py::dict CountersDict(const transport::LinkCounters& c) {
  py::dict d;
  d["link_class"] = std::string(transport::LinkClassName(c.link_class));
  d["stripes"] = c.stripes;
  d["probed_send_bytes_per_second"] = c.probed_send_bytes_per_second;
  d["probed_recv_bytes_per_second"] = c.probed_recv_bytes_per_second;
  d["probed_rtt_seconds"] = c.probed_rtt_seconds;
  d["bytes_sent"] = c.bytes_sent;
  d["bytes_received"] = c.bytes_received;
  d["messages_sent"] = c.messages_sent;
  d["messages_received"] = c.messages_received;
  d["chunks_sent"] = c.chunks_sent;
  d["chunks_received"] = c.chunks_received;
  d["send_bytes_per_second"] = c.send_bytes_per_second;
  d["recv_bytes_per_second"] = c.recv_bytes_per_second;
  d["queued_messages"] = c.queued_messages;
  d["queued_bytes"] = c.queued_bytes;
  d["inflight_bytes"] = c.inflight_bytes;
  d["max_queued_messages"] = c.max_queued_messages;
  d["retries"] = c.retries;
  d["pacing_waits"] = c.pacing_waits;
  d["bulk_pace_bytes_per_second"] = c.bulk_pace_bytes_per_second;
  return d;
}

codecs::SubspaceDirection ParseDirection(const std::string& name) {
  if (name == "forward") return codecs::SubspaceDirection::kForward;
  if (name == "backward") return codecs::SubspaceDirection::kBackward;
  throw StatusError(absl::InvalidArgumentError(
      absl::StrCat("unknown direction '", name, "' (forward, backward)")));
}

// lbcc.Communicator.
class PyComm {
 public:
  explicit PyComm(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  ~PyComm() { Close(); }

  Communicator& get() const {
    if (comm_ == nullptr) {
      throw StatusError(absl::FailedPreconditionError("the communicator was closed"));
    }
    return *comm_;
  }
  const std::shared_ptr<Communicator>& shared() const {
    get();
    return comm_;
  }
  void Close() { comm_.reset(); }  // The deleter releases the GIL.
  bool closed() const { return comm_ == nullptr; }

  std::unique_ptr<Core> NewCore() const {
    PurgeOrphans();
    auto core = std::make_unique<Core>();
    core->comm = shared();
    return core;
  }

 private:
  std::shared_ptr<Communicator> comm_;
};

// Called in a catch block: the arguments of collective `name` were rejected before anything was
// posted. The call still takes part: an error contribution goes in its place
// (Communicator::PostRejected), so every rank fails this operation with an error naming this
// rank and the ranks stay in step (issue 19: a TypeError here used to leave this rank one
// operation behind, and its next all_reduce paired with the peers' previous one).
void TakePartAfterError(PyComm& self, const char* name) {
  std::string what = "argument error";
  try {
    throw;
  } catch (const StatusError& e) {
    what = std::string(e.status().message());
  } catch (const py::error_already_set& e) {
    what = e.what();
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  if (self.closed()) return;
  (void)self.get().PostRejected(name, absl::InvalidArgumentError(absl::StrCat(name, ": ", what)));
}

// Runs `parse` (the argument checks of collective `name`) and returns what it returns; when it
// throws, the call takes part with an error contribution, then the exception propagates.
template <typename Parse>
auto ParseOrTakePart(PyComm& self, const char* name, Parse&& parse) -> decltype(parse()) {
  try {
    return parse();
  } catch (...) {
    TakePartAfterError(self, name);
    throw;
  }
}

py::object Split(PyComm& self, int color, int key) {
  Communicator& c = self.get();
  absl::StatusOr<std::unique_ptr<Communicator>> child;
  {
    py::gil_scoped_release release;
    child = c.Split(color, key);
  }
  std::unique_ptr<Communicator> made = ValueOrThrow(std::move(child));
  if (made == nullptr) return py::none();
  return py::cast(std::make_unique<PyComm>(Share(std::move(made))));
}

py::object AllReduce(PyComm& self, py::object tensor, py::object out, const std::string& op,
                     bool async_op, std::optional<double> timeout, const std::string& algorithm,
                     const std::string& priority) {
  if (out.is_none()) out = tensor;
  auto [in, outv, reduce, options] = ParseOrTakePart(self, "AllReduce", [&] {
    const auto floats = {DType::kF32, DType::kF16, DType::kBF16};
    TensorView in = ToView(tensor, "tensor", floats);
    TensorView outv = ToView(out, "out", floats, Access::kWrite);
    comm::ReduceOp reduce;
    if (op == "sum") {
      reduce = comm::ReduceOp::kSum;
    } else if (op == "mean") {
      reduce = comm::ReduceOp::kAvg;
    } else {
      throw StatusError(
          absl::InvalidArgumentError(absl::StrCat("unknown op '", op, "' (sum, mean)")));
    }
    return std::make_tuple(in, outv, reduce, MakeOptions(timeout, algorithm, priority));
  });
  auto core = self.NewCore();
  core->keep = {tensor, out};
  core->request = core->comm->AllReduce(in, outv, reduce, options);
  return Finish(std::move(core), async_op);
}

py::object AllGather(PyComm& self, py::object tensor, py::object out, bool async_op,
                     std::optional<double> timeout, const std::string& algorithm,
                     const std::string& priority) {
  auto [in, outv, options] = ParseOrTakePart(self, "AllGather", [&] {
    TensorView in = ToView(
        tensor, "tensor",
        {DType::kF32, DType::kF16, DType::kBF16, DType::kI8, DType::kU8, DType::kI32, DType::kI64});
    TensorView outv = ToView(out, "out", {in.dtype()}, Access::kWrite);
    return std::make_tuple(in, outv, MakeOptions(timeout, algorithm, priority));
  });
  auto core = self.NewCore();
  core->keep = {tensor, out};
  core->request = core->comm->AllGather(in, outv, options);
  return Finish(std::move(core), async_op);
}

py::object Broadcast(PyComm& self, py::object tensor, int root, bool async_op,
                     std::optional<double> timeout, const std::string& priority) {
  auto [view, options] = ParseOrTakePart(self, "Broadcast", [&] {
    TensorView view = ToView(
        tensor, "tensor",
        {DType::kF32, DType::kF16, DType::kBF16, DType::kI8, DType::kU8, DType::kI32, DType::kI64},
        Access::kWrite);
    return std::make_pair(view, MakeOptions(timeout, "auto", priority));
  });
  auto core = self.NewCore();
  core->keep = {tensor};
  core->request = core->comm->Broadcast(view, root, options);
  return Finish(std::move(core), async_op);
}

py::object Barrier(PyComm& self, bool async_op, std::optional<double> timeout) {
  comm::OpOptions options =
      ParseOrTakePart(self, "Barrier", [&] { return MakeOptions(timeout, "auto", ""); });
  auto core = self.NewCore();
  core->request = core->comm->Barrier(options);
  return Finish(std::move(core), async_op);
}

struct GatheredBytes {
  std::string mine;
  std::vector<std::string> all;
};

py::object AllGatherBytes(PyComm& self, const py::bytes& data, bool async_op,
                          std::optional<double> timeout, const std::string& algorithm) {
  auto gathered = std::make_shared<GatheredBytes>();
  gathered->mine = std::string(data);
  comm::OpOptions options =
      ParseOrTakePart(self, "AllGatherV", [&] { return MakeOptions(timeout, algorithm, ""); });
  auto core = self.NewCore();
  core->native = gathered;
  core->request = core->comm->AllGatherV(&gathered->mine, &gathered->all, options);
  return Finish(std::move(core), async_op, [gathered](Core&) {
    py::list out;
    for (const std::string& s : gathered->all) out.append(py::bytes(s));
    return py::object(out);
  });
}

py::object SparseAllReduce(PyComm& self, py::list deltas, py::list outs,
                           std::shared_ptr<codecs::Codec> codec, py::object states,
                           const std::string& aggregation, bool accumulate, bool async_op,
                           std::optional<double> timeout, const std::string& algorithm,
                           const std::string& priority, bool clip_to_median_norm) {
  auto [state_ptrs, tensors, decode, options] = ParseOrTakePart(self, "SparseAllReduce", [&] {
    if (codec == nullptr) throw py::type_error("codec: expected an lbcc.Codec");
    if (deltas.size() != outs.size()) {
      throw StatusError(absl::InvalidArgumentError(absl::StrCat(
          "sparse_all_reduce: ", deltas.size(), " deltas but ", outs.size(), " outputs")));
    }
    std::vector<std::shared_ptr<codecs::CodecState>> state_ptrs(deltas.size());
    if (!states.is_none()) {
      py::list s = states.cast<py::list>();
      if (s.size() != deltas.size()) {
        throw StatusError(absl::InvalidArgumentError(
            absl::StrCat("sparse_all_reduce: ", deltas.size(), " deltas but ", s.size(), " states")));
      }
      for (size_t i = 0; i < s.size(); ++i) {
        if (!s[i].is_none()) state_ptrs[i] = s[i].cast<std::shared_ptr<codecs::CodecState>>();
      }
    }
    std::vector<Communicator::SparseTensor> tensors;
    for (size_t i = 0; i < deltas.size(); ++i) {
      const std::string d = absl::StrCat("deltas[", i, "]"), o = absl::StrCat("outs[", i, "]");
      tensors.push_back({ToF32View(deltas[i], d.c_str()),
                         ToF32View(outs[i], o.c_str(), Access::kWrite), state_ptrs[i].get()});
    }
    codecs::DecodeOptions decode;
    decode.aggregation = ParseAggregationOrThrow(aggregation);
    decode.accumulate = accumulate;
    decode.clip_to_median_norm = clip_to_median_norm;
    comm::OpOptions options = MakeOptions(timeout, algorithm, priority.empty() ? "bulk" : priority);
    return std::make_tuple(std::move(state_ptrs), std::move(tensors), decode, options);
  });
  auto core = self.NewCore();
  // Tuples and the state pointers themselves: the caller may change its lists meanwhile.
  core->keep = {py::tuple(deltas), py::tuple(outs), py::cast(codec)};
  core->native = std::make_shared<std::vector<std::shared_ptr<codecs::CodecState>>>(state_ptrs);
  core->request = core->comm->SparseAllReduce(std::move(tensors), codec.get(), decode, options);
  return Finish(std::move(core), async_op);
}

py::object SendCompressed(PyComm& self, py::object tensor, int peer, uint32_t tag,
                          std::shared_ptr<codecs::Codec> codec,
                          std::shared_ptr<codecs::CodecState> state, bool async_op) {
  if (codec == nullptr) throw py::type_error("codec: expected an lbcc.Codec");
  TensorView view = ToF32View(tensor, "tensor");
  auto core = self.NewCore();
  core->keep = {tensor, py::cast(codec), py::cast(state)};
  {
    py::gil_scoped_release release;  // Encodes before it returns.
    core->request = core->comm->SendCompressed(view, codec.get(), state.get(), peer, tag);
  }
  return Finish(std::move(core), async_op);
}

py::object RecvCompressed(PyComm& self, py::object out, int peer, uint32_t tag, bool async_op) {
  TensorView view = ToF32View(out, "out", Access::kWrite);
  auto core = self.NewCore();
  core->keep = {out};
  core->request = core->comm->RecvCompressed(view, peer, tag);
  return Finish(std::move(core), async_op);
}

// send_subspace / recv_subspace: thin wrappers over comm/activations.h, so Python puts the
// same bytes on the wire as C and C++.
py::object SendSubspace(PyComm& self, py::object tensor, int peer, uint32_t tag,
                        std::shared_ptr<PySubspaceCodec> codec, py::object ids,
                        const std::string& direction, py::object selectors, bool async_op) {
  if (codec == nullptr) throw py::type_error("codec: expected an lbcc.SubspaceCodec");
  const codecs::SubspaceDirection dir = ParseDirection(direction);
  TensorView view = ToF32View(tensor, "tensor");
  absl::Span<const int32_t> id_span;
  if (!ids.is_none()) id_span = ToIds(ids, "ids");
  const codecs::SubspaceSelectors sel = ToSelectors(selectors);
  auto core = self.NewCore();
  {
    py::gil_scoped_release release;  // Encodes before it returns: tensor and ids are read here.
    core->request =
        dir == codecs::SubspaceDirection::kForward
            ? comm::SendActivations(*core->comm, view, id_span, codec->basis, codec->options,
                                    peer, tag)
            : comm::SendActivationGrads(*core->comm, view, codec->basis, codec->options, sel,
                                        peer, tag);
  }
  return Finish(std::move(core), async_op);
}

// What a subspace receive reports once done.
struct SubspaceReceived {
  comm::ActivationRoute route;
  std::vector<uint8_t> payload;
};

py::object RecvSubspace(PyComm& self, py::object out, int peer, uint32_t tag, py::object codecs_arg,
                        py::object ids_out, const std::string& direction, bool return_payload,
                        bool async_op) {
  const codecs::SubspaceDirection dir = ParseDirection(direction);
  std::vector<comm::SubspaceBasisPtr> accepted;
  if (py::isinstance<PySubspaceCodec>(codecs_arg)) {
    accepted.push_back(codecs_arg.cast<std::shared_ptr<PySubspaceCodec>>()->basis);
  } else {
    for (py::handle c : codecs_arg) {
      accepted.push_back(c.cast<std::shared_ptr<PySubspaceCodec>>()->basis);
    }
  }
  if (accepted.empty()) throw py::value_error("codecs: need at least one lbcc.SubspaceCodec");
  TensorView view = ToF32View(out, "out", Access::kWrite);
  absl::Span<int32_t> ids;
  if (!ids_out.is_none()) {
    TensorView iv = ToView(ids_out, "ids_out", {DType::kI32}, Access::kWrite);
    ids = absl::Span<int32_t>(iv.data_as<int32_t>(), iv.num_elements());
  }
  auto received = std::make_shared<SubspaceReceived>();
  std::vector<uint8_t>* payload = return_payload ? &received->payload : nullptr;
  auto core = self.NewCore();
  core->keep = {out, ids_out};
  core->native = received;
  core->request = dir == codecs::SubspaceDirection::kForward
                      ? comm::RecvActivations(*core->comm, view, ids, std::move(accepted), peer,
                                              tag, &received->route, payload)
                      : comm::RecvActivationGrads(*core->comm, view, std::move(accepted), peer,
                                                  tag, &received->route, payload);
  return Finish(std::move(core), async_op, [received, return_payload](Core&) -> py::object {
    py::object selectors = SelectorsObject(received->route.selectors);
    if (!return_payload) return selectors;
    return py::make_tuple(selectors, ToBytes(received->payload));
  });
}

// Waits for a point-to-point operation that has no deadline of its own, up to `timeout_s`
// (none: as long as it takes). When the time passes first, the communicator is aborted (as a
// timed-out collective aborts it, so the peer fails too instead of waiting) and
// DeadlineExceededError is raised once the operation finished; buffers are no longer used then.
// The callers checked that `timeout_s` is a number >= 0 before posting.
py::object FinishWithin(std::unique_ptr<Core> core, std::optional<double> timeout_s,
                        const char* what, std::function<py::object(Core&)> result) {
  if (!timeout_s.has_value()) return Finish(std::move(core), false, std::move(result));
  const absl::Time deadline = absl::Now() + absl::Seconds(*timeout_s);
  std::shared_ptr<Communicator> comm = core->comm;
  auto abort_and_wait = [&] {
    comm->Abort();
    py::gil_scoped_release release;
    (void)core->request->Wait();
  };
  while (!core->request->Test() && absl::Now() < deadline) {
    {
      py::gil_scoped_release release;
      (void)core->request->WaitFor(
          std::min(absl::Milliseconds(100), std::max(absl::ZeroDuration(), deadline - absl::Now())));
    }
    if (PyErr_CheckSignals() != 0) {
      {
        py::error_scope keep_error;
        abort_and_wait();
      }
      throw py::error_already_set();
    }
  }
  if (!core->request->Test()) {
    abort_and_wait();
    if (!core->request->status().ok()) {
      throw StatusError(absl::DeadlineExceededError(absl::StrCat(
          what, ": not finished after ", *timeout_s,
          " s; the communicator was aborted (recreate it)")));
    }
  }
  ThrowIfError(core->request->status());
  return result(*core);
}

// send_table_update / recv_table_update: comm/activations.h's table updates (blocking).
py::object SendTableUpdate(PyComm& self, py::object before, py::object after, int peer,
                           uint32_t tag, std::optional<double> timeout) {
  if (timeout.has_value() && !(*timeout >= 0)) {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat("send_table_update: timeout ", *timeout, " is not a number >= 0")));
  }
  TensorView b = ToF32View(before, "before");
  TensorView a = ToF32View(after, "after");
  auto bytes = std::make_shared<size_t>(0);
  auto core = self.NewCore();
  core->keep = {before, after};
  core->native = bytes;
  {
    py::gil_scoped_release release;  // Encodes before it returns: before and after are read here.
    core->request = comm::SendTableUpdate(
        *core->comm, absl::MakeConstSpan(b.data_as<const float>(), b.num_elements()),
        absl::MakeConstSpan(a.data_as<const float>(), a.num_elements()), peer, tag, bytes.get());
  }
  return FinishWithin(std::move(core), timeout, "send_table_update",
                      [bytes](Core&) { return py::int_(*bytes); });
}

py::object RecvTableUpdate(PyComm& self, py::object table, int peer, uint32_t tag,
                           std::optional<double> timeout) {
  if (timeout.has_value() && !(*timeout >= 0)) {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat("recv_table_update: timeout ", *timeout, " is not a number >= 0")));
  }
  TensorView t = ToF32View(table, "table", Access::kWrite);
  auto bytes = std::make_shared<size_t>(0);
  auto core = self.NewCore();
  core->keep = {table};
  core->native = bytes;
  core->request = comm::RecvTableUpdate(
      *core->comm, absl::MakeSpan(t.data_as<float>(), t.num_elements()), peer, tag, bytes.get());
  return FinishWithin(std::move(core), timeout, "recv_table_update",
                      [bytes](Core&) { return py::int_(*bytes); });
}

std::unique_ptr<PyComm> InitComm(const py::bytes& unique_id, int nranks, int rank,
                                 std::optional<std::string> backend,
                                 std::optional<std::string> listen_host,
                                 std::optional<double> timeout, py::object topology) {
  comm::UniqueId id = IdFromBytes(unique_id);
  comm::FabricOptions options = MakeFabricOptions(backend, listen_host, timeout, topology);
  absl::StatusOr<std::unique_ptr<Communicator>> c;
  {
    py::gil_scoped_release release;
    c = Communicator::Init(id, nranks, rank, std::move(options));
  }
  return std::make_unique<PyComm>(Share(ValueOrThrow(std::move(c))));
}

std::unique_ptr<PyComm> InitCommFromEnvironment(std::optional<std::string> backend,
                                                std::optional<std::string> listen_host,
                                                std::optional<double> timeout,
                                                py::object topology) {
  comm::FabricOptions options = MakeFabricOptions(backend, listen_host, timeout, topology);
  absl::StatusOr<std::unique_ptr<Communicator>> c;
  {
    py::gil_scoped_release release;
    c = Communicator::InitFromEnvironment(std::move(options));
  }
  return std::make_unique<PyComm>(Share(ValueOrThrow(std::move(c))));
}

void TakePartRejected(PyComm& c, const std::string& op, const std::string& message) {
  (void)c.get().PostRejected(op, absl::InvalidArgumentError(message));
}

py::dict LinkCounters(const PyComm& c, int peer) {
  Communicator& comm = c.get();
  if (peer < 0 || peer >= comm.nranks() || peer == comm.rank()) {
    throw StatusError(absl::InvalidArgumentError(absl::StrCat("link_counters: bad peer ", peer)));
  }
  return CountersDict(comm.fabric()->Counters(comm.global_ranks()[peer]));
}

py::dict BytesByClass(const PyComm& c) {
  return python_common::LinkBytesDict(c.get().fabric()->BytesByClass());
}

}  // namespace

namespace {

void BindRequest(py::module_& m) {
  py::class_<PyRequest>(m, "Request", "A pending operation (async_op=True).")
      .def("test", &PyRequest::Test, "True once the operation finished (successfully or not).")
      .def("wait", &PyRequest::Wait, py::arg("timeout") = py::none(),
           "Waits (GIL released) and returns the result; raises the operation's error, or "
           "DeadlineExceededError when `timeout` seconds pass first (the operation goes on).");
}

void BindCommunicator(py::module_& m) {
  py::class_<PyComm>(m, "Communicator",
                     "A group of ranks running collectives together (comm/communicator.h). "
                     "Ranks must post operations in the same order.")
      .def_static(
          "init", &InitComm, py::arg("unique_id"), py::arg("nranks"), py::arg("rank"),
          py::arg("backend") = py::none(), py::arg("listen_host") = py::none(),
          py::arg("timeout") = py::none(), py::arg("topology") = py::none(),
          "Joins the job named by `unique_id` (blocks until every rank joined). Unset options "
          "come from LBCC_TRANSPORT, LBCC_LISTEN_ADDR, LBCC_TIMEOUT_S, LBCC_TOPO_FILE.")
      .def_static(
          "init_from_environment", &InitCommFromEnvironment, py::arg("backend") = py::none(),
          py::arg("listen_host") = py::none(), py::arg("timeout") = py::none(),
          py::arg("topology") = py::none(),
          "Joins from torchrun's (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT + 1) or mpirun's "
          "environment.")
      .def_property_readonly("rank", [](const PyComm& c) { return c.get().rank(); })
      .def_property_readonly("nranks", [](const PyComm& c) { return c.get().nranks(); })
      .def_property_readonly("global_rank", [](const PyComm& c) { return c.get().global_rank(); })
      .def_property_readonly("global_ranks", [](const PyComm& c) { return c.get().global_ranks(); })
      .def_property_readonly("topology",
                             [](const PyComm& c) { return PyTopology{c.get().topology()}; })
      .def_property_readonly("closed", &PyComm::closed)
      .def(
          "check", [](const PyComm& c) { ThrowIfError(c.get().status()); },
          "Raises the first failure if the communicator failed (then recreate it).")
      .def(
          "abort", [](PyComm& c) { c.get().Abort(); },
          "Aborts the connections: running and queued operations fail on every rank.")
      .def("close", &PyComm::Close,
           "Destroys the communicator (queued operations fail with Cancelled). Idempotent.")
      .def("_take_part_rejected", &TakePartRejected, py::arg("op"), py::arg("message"),
           "For wrappers that reject a collective's arguments in Python: posts an error "
           "contribution in its place, so every rank fails that operation and stays in step.")
      .def("split", &Split, py::arg("color"), py::arg("key") = 0,
           "Ranks passing the same color form a new communicator ordered by (key, rank); a "
           "negative color returns None. Collective and blocking.")
      .def("all_reduce", &AllReduce, py::arg("tensor"), py::arg("out") = py::none(),
           py::arg("op") = "sum", py::arg("async_op") = false, py::arg("timeout") = py::none(),
           py::arg("algorithm") = "auto", py::arg("priority") = "")
      .def("all_gather", &AllGather, py::arg("tensor"), py::arg("out"), py::arg("async_op") = false,
           py::arg("timeout") = py::none(), py::arg("algorithm") = "auto", py::arg("priority") = "")
      .def("broadcast", &Broadcast, py::arg("tensor"), py::arg("root"), py::arg("async_op") = false,
           py::arg("timeout") = py::none(), py::arg("priority") = "")
      .def("barrier", &Barrier, py::arg("async_op") = false, py::arg("timeout") = py::none())
      .def("all_gather_bytes", &AllGatherBytes, py::arg("data"), py::arg("async_op") = false,
           py::arg("timeout") = py::none(), py::arg("algorithm") = "auto",
           "Every rank's bytes, in rank order (a list).")
      .def("sparse_all_reduce", &SparseAllReduce, py::arg("deltas"), py::arg("outs"),
           py::arg("codec"), py::arg("states") = py::none(), py::arg("aggregation") = "sparseloco",
           py::arg("accumulate") = false, py::arg("async_op") = false,
           py::arg("timeout") = py::none(), py::arg("algorithm") = "auto", py::arg("priority") = "",
           py::arg("clip_to_median_norm") = false,
           "SparseLoCo's exchange: encodes each delta with its state, exchanges, decodes in rank "
           "order into outs (identical bits on every rank). States commit only on success. "
           "clip_to_median_norm: templar's outer step (each rank's contribution scaled by "
           "min(1, median(norms) / (norm + 1e-8)) before the aggregation).")
      .def("send_compressed", &SendCompressed, py::arg("tensor"), py::arg("peer"), py::arg("tag"),
           py::arg("codec"), py::arg("state") = nullptr, py::arg("async_op") = false)
      .def("recv_compressed", &RecvCompressed, py::arg("out"), py::arg("peer"), py::arg("tag"),
           py::arg("async_op") = false)
      .def("send_subspace", &SendSubspace, py::arg("tensor"), py::arg("peer"), py::arg("tag"),
           py::arg("codec"), py::arg("ids") = py::none(), py::arg("direction") = "forward",
           py::arg("selectors") = py::none(), py::arg("async_op") = false,
           "Sends activations [tokens, d] with ids (forward) or activation gradients (backward, "
           "with the forward's selectors for a mixture basis), subspace-compressed.")
      .def("recv_subspace", &RecvSubspace, py::arg("out"), py::arg("peer"), py::arg("tag"),
           py::arg("codecs"), py::arg("ids_out") = py::none(), py::arg("direction") = "forward",
           py::arg("return_payload") = false, py::arg("async_op") = false,
           "Receives and decodes a subspace payload into out [tokens, d] (ids into ids_out) "
           "with the codec whose basis the payload names; returns the selectors, or "
           "(selectors, payload bytes as received) with return_payload=True.")
      .def("send_table_update", &SendTableUpdate, py::arg("before"), py::arg("after"),
           py::arg("peer"), py::arg("tag") = 0, py::arg("timeout") = py::none(),
           "Sends the elements of `after` whose bits differ from `before` (contiguous float32 "
           "CPU tensors of one size) to `peer` as a table delta; returns the message's bytes. "
           "After `timeout` seconds (None: no limit) the communicator is aborted and "
           "DeadlineExceededError raised.")
      .def("recv_table_update", &RecvTableUpdate, py::arg("table"), py::arg("peer"),
           py::arg("tag") = 0, py::arg("timeout") = py::none(),
           "Receives a table delta from `peer` and applies it to `table` in place (which then "
           "holds the sender's `after` if it held its `before`); returns the message's bytes. "
           "DataLossError for a corrupt or foreign message, InvalidArgumentError (a ValueError) "
           "for another table size; `table` is untouched then. `timeout` as send_table_update.")
      .def("link_counters", &LinkCounters, py::arg("peer"),
           "Counters of the link to `peer` (a rank of this communicator).")
      .def("bytes_by_class", &BytesByClass,
           "Bytes sent and received on fast and slow links by every communicator of the job.");
}

}  // namespace

std::shared_ptr<Communicator> SharedCommunicator(py::handle comm) {
  return comm.cast<PyComm&>().shared();
}

// The communicator's part of the module: bootstrap functions and Topology
// (topology_bindings.cc), Request, Communicator.
void BindComm(py::module_& m) {
  BindUniqueIdFunctions(m);
  BindTopology(m);
  BindRequest(m);
  BindCommunicator(m);
}

}  // namespace lbcc::python
