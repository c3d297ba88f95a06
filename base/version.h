// LBCC's version, printed at LBCC_DEBUG=VERSION and by `lbcc version`.
#ifndef LBCC_BASE_VERSION_H_
#define LBCC_BASE_VERSION_H_

#define LBCC_VERSION_MAJOR 0
#define LBCC_VERSION_MINOR 1
#define LBCC_VERSION_PATCH 0
#define LBCC_VERSION_STRING "0.1.0"
// One number like NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch.
#define LBCC_VERSION_CODE \
  (LBCC_VERSION_MAJOR * 10000 + LBCC_VERSION_MINOR * 100 + LBCC_VERSION_PATCH)

#endif  // LBCC_BASE_VERSION_H_
