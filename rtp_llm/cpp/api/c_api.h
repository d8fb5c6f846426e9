// C ABI of the engine core (libth_transformer.so), loaded from Python with ctypes by
// rtp_llm.ops.ensure_engine_ops_loaded(). Plain C types only, so one build serves every
// Python and torch version. Strings returned are static: never freed by the caller.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// Bumped on every change of the C ABI: this header, engine_api.h and the lists of
// rtp_llm/cpp/engine/step_batch_fields.h. The Python loader refuses a mismatch, and
// c_api_test fails when those headers change without a bump (it keeps each version's
// fingerprint of them).
#define RTP_LLM_ABI_VERSION 13

int rtp_llm_abi_version(void);

// "rtp_llm core abi=<n> grpc=<version> protobuf=<version> service=<RpcService full name>":
// what the loaded library was built with, for logs and bug reports.
const char* rtp_llm_build_info(void);

#ifdef __cplusplus
}
#endif
