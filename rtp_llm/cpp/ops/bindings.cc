#include <torch/extension.h>

#include "rtp_llm/cpp/ops/compute_ops.h"

// The module name must equal the .so stem (librtp_compute_ops.so).
PYBIND11_MODULE(librtp_compute_ops, m) {
  m.doc() = "rtp_llm torch-linked compute ops";
  m.def("rms_norm", &rtp_llm::ops::rms_norm, "x: [num_tokens, hidden], weight: [hidden]",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("eps"));
  m.def("paged_attention", &rtp_llm::ops::paged_attention,
        "q: [T, H, D] over paged k/v caches [blocks, block_size, Hkv, D] -> [T, H, D]", pybind11::arg("q"),
        pybind11::arg("k_cache"), pybind11::arg("v_cache"), pybind11::arg("block_tables"),
        pybind11::arg("query_starts"), pybind11::arg("context_lens"), pybind11::arg("scale"));
}
