#include <string>

#include <gtest/gtest.h>

#include "rtp_llm/cpp/api/c_api.h"
#include "rtp_llm/cpp/model_rpc/proto/model_rpc_service.grpc.pb.h"

TEST(CApi, ReportsItsAbiVersion) { EXPECT_EQ(rtp_llm_abi_version(), RTP_LLM_ABI_VERSION); }

TEST(CApi, BuildInfoNamesLinkedLibrariesAndService) {
  const std::string info = rtp_llm_build_info();
  EXPECT_NE(info.find("abi=" + std::to_string(RTP_LLM_ABI_VERSION)), std::string::npos) << info;
  EXPECT_NE(info.find("grpc=1."), std::string::npos) << info;
  EXPECT_NE(info.find("service=RpcService"), std::string::npos) << info;
}

// Wire compatibility with upstream: these field numbers are the contract, not the names.
TEST(ModelRpcProto, GenerateInputUsesUpstreamFieldNumbers) {
  GenerateInputPB input;
  input.set_request_id(7);             // field 1, varint: tag 0x08
  input.add_token_ids(5);              // field 2, packed: tag 0x12
  input.mutable_generate_config()->set_max_new_tokens(3);  // field 4: tag 0x22; inner 0x08
  const std::string wire = input.SerializeAsString();
  const std::string expected("\x08\x07\x12\x01\x05\x22\x02\x08\x03", 9);
  EXPECT_EQ(wire, expected);

  GenerateInputPB parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  EXPECT_EQ(parsed.generate_config().max_new_tokens(), 3);
}

TEST(ModelRpcProto, ServiceDeclaresTheServedMethods) {
  const auto* service = GenerateInputPB::descriptor()->file()->FindServiceByName("RpcService");
  ASSERT_NE(service, nullptr);
  for (const char* method : {"GenerateStreamCall", "CheckHealth", "GetWorkerStatus", "GetCacheStatus"}) {
    EXPECT_NE(service->FindMethodByName(method), nullptr) << method;
  }
  EXPECT_TRUE(service->FindMethodByName("GenerateStreamCall")->server_streaming());
}
