#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "rtp_llm/cpp/api/c_api.h"
#include "rtp_llm/cpp/model_rpc/proto/model_rpc_service.grpc.pb.h"

namespace {

// The C ABI's headers as the compiler sees them: comments dropped, white space folded.
std::string AbiText(const std::string& path) {
  const char* root = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  std::ifstream in(std::string(root ? root : ".") + "/" + (workspace ? workspace : "rtp_llm") + "/rtp_llm/" + path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 2, "//") == 0) {
      i = text.find('\n', i);
      if (i == std::string::npos) break;
    } else if (text.compare(i, 2, "/*") == 0) {
      i = text.find("*/", i) + 1;
    } else if (std::isspace(static_cast<unsigned char>(text[i]))) {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += text[i];
    }
  }
  return out;
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

}  // namespace

// A layout or signature change of the C ABI without a version bump fails here: each version
// keeps the fingerprint of its headers. Changed them? Bump RTP_LLM_ABI_VERSION (c_api.h) and
// ENGINE_ABI_VERSION (rtp_llm/ops/__init__.py) and add the new version's line.
TEST(CApi, TheAbiVersionCoversItsHeaders) {
  const std::map<int, uint64_t> fingerprints = {
      {2, 0xf109ba13e1f32e4ULL},
      {3, 0x5a15d44f10c2f92fULL},
      {5, 0x2bbaa36ebf83198ULL},
      {6, 0x8a74aa663e8f8b07ULL},
      {7, 0xdf002d89981e0864ULL},
      {8, 0x6e999bd89c606671ULL},
      {9, 0xc29856afd26697d4ULL},
      {10, 0xda89623b75a17f90ULL},
      {11, 0x74a9d2ab847bd0a7ULL},
      {12, 0xd5381d64d33fb3feULL},
      {13, 0x8bf58f886db87a41ULL},
  };
  const uint64_t now = Fnv1a(AbiText("cpp/api/c_api.h") + AbiText("cpp/api/engine_api.h") +
                             AbiText("cpp/engine/step_batch_fields.h"));
  auto it = fingerprints.find(RTP_LLM_ABI_VERSION);
  ASSERT_NE(it, fingerprints.end()) << "no fingerprint for ABI version " << RTP_LLM_ABI_VERSION << ": add {"
                                    << RTP_LLM_ABI_VERSION << ", 0x" << std::hex << now << "ULL}";
  EXPECT_EQ(it->second, now) << "the C ABI headers changed without a bump of RTP_LLM_ABI_VERSION: bump it (and "
                                "ENGINE_ABI_VERSION) and add {version, 0x"
                             << std::hex << now << "ULL}";
}

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
