// C ABI of the engine core (libth_transformer.so), loaded from Python with ctypes by
// rtp_llm.ops.ensure_engine_ops_loaded(). Plain C types only, so one build serves every
// Python and torch version. Strings returned are static: never freed by the caller.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// Bumped on every incompatible change of this header; the Python loader refuses a mismatch.
#define RTP_LLM_ABI_VERSION 1

int rtp_llm_abi_version(void);

// "rtp_llm core abi=<n> grpc=<version> protobuf=<version> service=<RpcService full name>":
// what the loaded library was built with, for logs and bug reports.
const char* rtp_llm_build_info(void);

#ifdef __cplusplus
}
#endif
