#include <torch/extension.h>

#include "rtp_llm/cpp/ops/compute_ops.h"

// The module name must equal the .so stem (librtp_compute_ops.so).
PYBIND11_MODULE(librtp_compute_ops, m) {
  m.doc() = "rtp_llm torch-linked compute ops";
  m.def("rms_norm", &rtp_llm::ops::rms_norm, "x: [num_tokens, hidden], weight: [hidden]",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("eps"));
}
