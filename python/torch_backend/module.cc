// The `lbcc._c10d_lbcc` extension: ProcessGroupLBCC as a subclass of torch's
// torch._C._distributed_c10d.ProcessGroup. lbcc/torch/backend.py registers it with
// torch.distributed.Backend.register_backend("lbcc", ...).
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include "python/torch_backend/link_bytes.h"
#include "python/torch_backend/process_group_lbcc.h"

namespace py = pybind11;

PYBIND11_MODULE(_c10d_lbcc, m) {
  // The base class and the Store type must be registered before ours refers to them.
  py::module_::import("torch.distributed");
  using lbcc::torch_backend::ProcessGroupLBCC;
  py::class_<ProcessGroupLBCC, c10::intrusive_ptr<ProcessGroupLBCC>, c10d::ProcessGroup>(
      m, "ProcessGroupLBCC",
      "torch.distributed process group over an LBCC communicator (see python/torch_backend).")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<ProcessGroupLBCC>(store, rank, size, timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def(
          "link_bytes",
          [](ProcessGroupLBCC& pg) {
            return lbcc::python_common::LinkBytesDict(pg.communicator().fabric()->BytesByClass());
          },
          "Bytes this rank sent and received on fast and slow links (LBCC's link counters).");
}
