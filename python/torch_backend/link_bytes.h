// A communicator's bytes by link class as the Python dict both extensions return
// (lbcc.Communicator.bytes_by_class and ProcessGroupLBCC.link_bytes). Header-only, without torch:
// //python:lbcc/_lbcc.so includes it too.
#ifndef LBCC_PYTHON_TORCH_BACKEND_LINK_BYTES_H_
#define LBCC_PYTHON_TORCH_BACKEND_LINK_BYTES_H_

#include <pybind11/pybind11.h>

#include "comm/fabric.h"

namespace lbcc::python_common {

inline pybind11::dict LinkBytesDict(const comm::Fabric::ClassBytes& b) {
  pybind11::dict d;
  d["fast_sent"] = b.fast_sent;
  d["fast_received"] = b.fast_received;
  d["slow_sent"] = b.slow_sent;
  d["slow_received"] = b.slow_received;
  return d;
}

}  // namespace lbcc::python_common

#endif  // LBCC_PYTHON_TORCH_BACKEND_LINK_BYTES_H_
