// The RPC tests' fixture: an engine behind the RPC server, stepped by a thread with the fake
// model (rtp_llm_engine_schedule/commit, through the C ABI), and helpers to check its output.
#pragma once

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "rtp_llm/cpp/api/engine_api.h"
#include "rtp_llm/cpp/engine/test/fake_model.h"
#include "rtp_llm/cpp/model_rpc/proto/model_rpc_service.grpc.pb.h"

namespace rtp_llm {
namespace test {

using testing::FakeModel;

inline constexpr int kBlocks = 1024;
inline constexpr int kBlockSize = 16;

// The "sampler's" log-prob of a token: not a round number, so that an exp/log round trip shows.
inline float LogprobOf(int32_t token) { return -0.1f - static_cast<float>(token) / 7.0f; }

inline std::vector<int32_t> Ids(const GenerateOutputsPB& msg) {
  const std::string& bytes = msg.flatten_output().output_ids().int32_data();
  std::vector<int32_t> ids(bytes.size() / sizeof(int32_t));
  std::memcpy(ids.data(), bytes.data(), bytes.size());
  return ids;
}

class RpcServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RtpEngineConfig config{};  // by name: the struct grows with RTP_LLM_ENGINE_CONFIG
    config.num_blocks = kBlocks;
    config.block_size = kBlockSize;
    config.max_batch_size = 256;
    config.max_num_batched_tokens = 2048;
    config.max_seq_len = 512;
    config.reuse_cache = 1;
    config.sp_min_token_match = 2;
    config.sp_max_token_match = 3;
    char err[256];
    engine_ = rtp_llm_engine_create(&config, err, sizeof(err));
    ASSERT_NE(engine_, nullptr) << err;
    const int port = rtp_llm_engine_start_rpc_server(engine_, "127.0.0.1:0", err, sizeof(err));
    ASSERT_GT(port, 0) << err;
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
    stub_ = RpcService::NewStub(channel_);
    loop_ = std::thread([this] {
      FakeModel model(kBlocks, kBlockSize);
      char error[256];
      while (!stop_) {
        // paused_ again after the wait: a request can end the wait of a loop paused meanwhile.
        if (paused_ || !rtp_llm_engine_wait_for_work(engine_, 10) || paused_) {
          if (paused_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          continue;
        }
        const RtpStepBatch* b = rtp_llm_engine_schedule(engine_);
        if (b->num_streams == 0) continue;
        auto tokens = model.run(*b);
        std::vector<float> logprobs(tokens.size());
        for (size_t i = 0; i < tokens.size(); ++i) logprobs[i] = LogprobOf(tokens[i]);
        std::vector<float> prompt;  // the prompt rows' log-probs: LogprobOf(target), no alternatives
        for (int t = 0; t < b->num_tokens; ++t) {
          if (b->prompt_targets[t] >= 0) prompt.push_back(LogprobOf(b->prompt_targets[t]));
        }
        if (step_delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(step_delay_us_.load()));
        if (rtp_llm_engine_commit(engine_, tokens.data(), logprobs.data(), static_cast<int32_t>(tokens.size()),
                                  nullptr, nullptr, 0, prompt.data(), static_cast<int32_t>(prompt.size()), nullptr,
                                  nullptr, 0, nullptr, error, sizeof(error)) != 0) {
          ADD_FAILURE() << error;
        }
      }
    });
  }

  void TearDown() override {
    stop_ = true;
    rtp_llm_engine_stop(engine_);
    loop_.join();
    rtp_llm_engine_destroy(engine_);
  }

  RtpEngineStats Stats() {
    RtpEngineStats s;
    rtp_llm_engine_stats(engine_, &s);
    return s;
  }

  // EngineCore idle: nothing running or tracked, every block free or cached.
  void ExpectDrained() {
    RtpEngineStats s = Stats();
    for (int i = 0; i < 200 && (s.tracked_streams > 0 || s.running + s.waiting > 0); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      s = Stats();
    }
    EXPECT_EQ(s.running + s.waiting, 0);
    EXPECT_EQ(s.tracked_streams, 0);
    EXPECT_EQ(s.used_blocks, 0);
    EXPECT_EQ(s.free_blocks + s.cached_blocks, s.total_blocks);
  }

  static GenerateInputPB Request(std::vector<int32_t> prompt, int max_new_tokens, bool streaming) {
    GenerateInputPB r;
    for (int32_t t : prompt) r.add_token_ids(t);
    r.mutable_generate_config()->set_max_new_tokens(max_new_tokens);
    r.mutable_generate_config()->set_is_streaming(streaming);
    return r;
  }

  RtpEngine* engine_ = nullptr;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<RpcService::Stub> stub_;
  std::thread loop_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> paused_{false};     // no steps: requests stay in the waiting queue
  std::atomic<int> step_delay_us_{0};  // a slower "model", so that clients can act mid-stream
};

}  // namespace test
}  // namespace rtp_llm
