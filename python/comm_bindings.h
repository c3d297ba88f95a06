// Shared by comm_bindings.cc and topology_bindings.cc (the communicator's part of the module).
#ifndef LBCC_PYTHON_COMM_BINDINGS_H_
#define LBCC_PYTHON_COMM_BINDINGS_H_

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/topology.h"
#include "python/bindings.h"

namespace lbcc::python {

// lbcc.Topology: an immutable value (mark_slow_ranks returns a copy).
struct PyTopology {
  comm::Topology topology;
};

// A unique id from its bytes; InvalidArgument (raised) for the wrong size.
comm::UniqueId IdFromBytes(const py::bytes& b);

// create_unique_id, unique_id_from_address, start_root, unique_id_address.
void BindUniqueIdFunctions(py::module_& m);
void BindTopology(py::module_& m);
// The Communicator of an lbcc.Communicator object (TypeError for another object; lbcc's
// FailedPrecondition once it was closed), for other binding files (context_ring_bindings.cc).
std::shared_ptr<comm::Communicator> SharedCommunicator(py::handle comm);

}  // namespace lbcc::python

#endif  // LBCC_PYTHON_COMM_BINDINGS_H_
