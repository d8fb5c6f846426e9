#include "rtp_llm/cpp/api/c_api.h"

#include <string>

#include <google/protobuf/stubs/common.h>
#include <grpcpp/grpcpp.h>

#include "rtp_llm/cpp/model_rpc/proto/model_rpc_service.grpc.pb.h"

extern "C" {

int rtp_llm_abi_version(void) { return RTP_LLM_ABI_VERSION; }

const char* rtp_llm_build_info(void) {
  static const std::string info =
      "rtp_llm core abi=" + std::to_string(RTP_LLM_ABI_VERSION) + " grpc=" + grpc::Version() +
      " protobuf=" + google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION) +
      " service=" + RpcService::service_full_name();
  return info.c_str();
}

}  // extern "C"
