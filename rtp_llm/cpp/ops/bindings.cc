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
  m.def("paged_attention_vectorized", &rtp_llm::ops::paged_attention_vectorized,
        "whether paged_attention runs its AVX-512 kernel here for these shapes", pybind11::arg("head_dim"),
        pybind11::arg("group"), pybind11::arg("block_size"));
  m.def("fused_add_rms_norm", &rtp_llm::ops::fused_add_rms_norm, "residual += x; rms_norm(residual)",
        pybind11::arg("x"), pybind11::arg("residual"), pybind11::arg("weight"), pybind11::arg("eps"));
  m.def("rotary_embedding", &rtp_llm::ops::rotary_embedding, "in-place rotary on q and k", pybind11::arg("q"),
        pybind11::arg("k"), pybind11::arg("positions"), pybind11::arg("cos"), pybind11::arg("sin"));
  m.def("qkv_rope_store", &rtp_llm::ops::qkv_rope_store,
        "qkv [T, (H + 2 Hkv) D]: q/k norm (optional), rotary in place, k/v into the paged cache -> (q, k, v) views",
        pybind11::arg("qkv"), pybind11::arg("num_heads"), pybind11::arg("num_kv_heads"), pybind11::arg("positions"),
        pybind11::arg("cos"), pybind11::arg("sin"), pybind11::arg("kv_cache"), pybind11::arg("slot_mapping"),
        pybind11::arg("q_norm") = pybind11::none(), pybind11::arg("k_norm") = pybind11::none(),
        pybind11::arg("eps") = 0.0);
  m.def("argmax_rows", &rtp_llm::ops::argmax_rows, "logits [N, V] -> [N] int64: each row's argmax",
        pybind11::arg("logits"));
  m.def("apply_token_bitmask", &rtp_llm::ops::apply_token_bitmask,
        "logits [N, V] fp32: rows[g] keep the tokens whose bit is set in bits[g], the others -inf (in place)",
        pybind11::arg("logits"), pybind11::arg("rows"), pybind11::arg("bits"));
  m.def("silu_and_mul", &rtp_llm::ops::silu_and_mul, "x: [T, 2I] -> silu(gate) * up", pybind11::arg("x"));
  m.def("cpu_bf16_peak_gflops", &rtp_llm::ops::cpu_bf16_peak_gflops,
        "the cores' bf16 multiply-add peak (GFLOP/s; 0 without AVX512-BF16)");
  m.def("bf16_linear_supported", &rtp_llm::ops::bf16_linear_supported,
        "whether bf16_linear runs here (AVX512-BF16)");
  m.def("pack_bf16_linear", &rtp_llm::ops::pack_bf16_linear, "bf16 [N, K] -> bf16_linear's packed weight",
        pybind11::arg("weight"));
  m.def("bf16_linear", &rtp_llm::ops::bf16_linear, "x: [M, K] bf16 @ packed weight -> [M, N]", pybind11::arg("x"),
        pybind11::arg("packed"), pybind11::arg("out") = pybind11::none());
  m.def("pack_bf16_gate_up", &rtp_llm::ops::pack_bf16_gate_up,
        "bf16 [2 I, K] (gate rows, then up rows) -> bf16_linear_silu's packed weight", pybind11::arg("weight"));
  m.def("bf16_linear_silu", &rtp_llm::ops::bf16_linear_silu, "x: [M, K] bf16 -> silu(x gate^T) * (x up^T), [M, I]",
        pybind11::arg("x"), pybind11::arg("packed"));
  m.def("q8_0_linear_vectorized", &rtp_llm::ops::q8_0_linear_vectorized,
        "whether q8_0_linear runs its AVX-512 VNNI kernel here");
  m.def("pack_q8_0_linear", &rtp_llm::ops::pack_q8_0_linear,
        "a GGUF Q8_0 tensor's rows, uint8 [N, K / 32 * 34] -> q8_0_linear's packed weight", pybind11::arg("blocks"));
  m.def("pack_q4_0_linear", &rtp_llm::ops::pack_q4_0_linear,
        "a GGUF Q4_0 tensor's rows, uint8 [N, K / 32 * 18] -> q8_0_linear's packed weight", pybind11::arg("blocks"));
  m.def("pack_q4_1_linear", &rtp_llm::ops::pack_q4_1_linear,
        "a GGUF Q4_1 tensor's rows, uint8 [N, K / 32 * 20] -> q8_0_linear's packed weight", pybind11::arg("blocks"));
  m.def("pack_q5_0_linear", &rtp_llm::ops::pack_q5_0_linear,
        "a GGUF Q5_0 tensor's rows, uint8 [N, K / 32 * 22] -> q8_0_linear's packed weight", pybind11::arg("blocks"));
  m.def("pack_q5_1_linear", &rtp_llm::ops::pack_q5_1_linear,
        "a GGUF Q5_1 tensor's rows, uint8 [N, K / 32 * 24] -> q8_0_linear's packed weight", pybind11::arg("blocks"));
  m.def("q8_0_linear", &rtp_llm::ops::q8_0_linear,
        "x: [M, K] fp32/bf16 @ a 32-block weight of n columns packed from qtype (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) -> [M, n]",
        pybind11::arg("x"), pybind11::arg("packed"), pybind11::arg("n"), pybind11::arg("qtype"),
        pybind11::arg("out") = pybind11::none(),
        pybind11::arg("portable") = false);
  m.def("pack_q4_k_linear", &rtp_llm::ops::pack_q4_k_linear,
        "a GGUF Q4_K tensor's rows, uint8 [N, K / 256 * 144] -> q4_k_linear's packed weight", pybind11::arg("blocks"));
  m.def("q4_k_linear", &rtp_llm::ops::q4_k_linear, "x: [M, K] fp32/bf16 @ packed Q4_K weight of n columns -> [M, n]",
        pybind11::arg("x"), pybind11::arg("packed"), pybind11::arg("n"), pybind11::arg("out") = pybind11::none(),
        pybind11::arg("portable") = false);
  m.def("pack_q5_k_linear", &rtp_llm::ops::pack_q5_k_linear,
        "a GGUF Q5_K tensor's rows, uint8 [N, K / 256 * 176] -> q5_k_linear's packed weight", pybind11::arg("blocks"));
  m.def("q5_k_linear", &rtp_llm::ops::q5_k_linear, "x: [M, K] fp32/bf16 @ packed Q5_K weight of n columns -> [M, n]",
        pybind11::arg("x"), pybind11::arg("packed"), pybind11::arg("n"), pybind11::arg("out") = pybind11::none(),
        pybind11::arg("portable") = false);
  m.def("pack_q6_k_linear", &rtp_llm::ops::pack_q6_k_linear,
        "a GGUF Q6_K tensor's rows, uint8 [N, K / 256 * 210] -> q6_k_linear's packed weight", pybind11::arg("blocks"));
  m.def("q6_k_linear", &rtp_llm::ops::q6_k_linear, "x: [M, K] fp32/bf16 @ packed Q6_K weight of n columns -> [M, n]",
        pybind11::arg("x"), pybind11::arg("packed"), pybind11::arg("n"), pybind11::arg("out") = pybind11::none(),
        pybind11::arg("portable") = false);
  m.def("store_kv", &rtp_llm::ops::store_kv, "k, v into the paged cache at slot_mapping", pybind11::arg("k"),
        pybind11::arg("v"), pybind11::arg("kv_cache"), pybind11::arg("slot_mapping"));
}
