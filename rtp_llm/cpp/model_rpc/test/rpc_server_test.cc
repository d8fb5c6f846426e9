// End to end through the C ABI and gRPC: a stepping thread drives the engine with the fake
// model (rtp_llm_engine_schedule/commit), clients talk to the RPC server.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "rtp_llm/cpp/api/engine_api.h"
#include "rtp_llm/cpp/engine/test/fake_model.h"
#include "rtp_llm/cpp/model_rpc/proto/model_rpc_service.grpc.pb.h"
#include "rtp_llm/cpp/model_rpc/proto_convert.h"
#include "rtp_llm/cpp/model_rpc/proto_convert.h"  // kMaxWaitingKey
#include "rtp_llm/cpp/model_rpc/test/rpc_server_fixture.h"

namespace rtp_llm {
namespace {

using test::Ids;
using test::kBlocks;
using test::kBlockSize;
using test::LogprobOf;
using test::RpcServerTest;
using testing::FakeModel;

// Reads one GenerateStreamCall with the callback API (no thread per call).
class Call : public grpc::ClientReadReactor<GenerateOutputsPB> {
 public:
  Call(RpcService::Stub* stub, GenerateInputPB request, int max_waiting = 0) : request_(std::move(request)) {
    if (max_waiting > 0) context_.AddMetadata(kMaxWaitingKey, std::to_string(max_waiting));
    stub->async()->GenerateStreamCall(&context_, &request_, this);
    StartRead(&message_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    ++messages_;
    auto ids = Ids(message_);
    tokens_.insert(tokens_.end(), ids.begin(), ids.end());
    finished_ = message_.flatten_output().finished(0);
    const AuxInfoPB& aux = message_.flatten_output().aux_info(0);
    output_len_ = aux.output_len();
    finish_reasons_.push_back(aux.finish_reason());
    const std::string& lp = aux.logprobs().fp32_data();
    const size_t before = logprobs_.size();
    logprobs_.resize(before + lp.size() / sizeof(float));
    std::memcpy(logprobs_.data() + before, lp.data(), lp.size());
    softmax_probs_ += aux.softmax_probs().fp32_data().size();
    if (first_read_) first_read_();
    StartRead(&message_);
  }
  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    done_ = true;
    cv_.notify_all();
  }
  grpc::Status Await() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return status_;
  }
  void Cancel() { context_.TryCancel(); }

  const GenerateInputPB& request() const { return request_; }
  std::vector<int32_t> tokens_;
  int messages_ = 0;
  bool finished_ = false;
  int output_len_ = 0;
  std::vector<std::string> finish_reasons_;  // of each message
  std::vector<float> logprobs_;
  size_t softmax_probs_ = 0;  // bytes received (no longer sent)
  std::function<void()> first_read_;

 private:
  GenerateInputPB request_;
  grpc::ClientContext context_;
  GenerateOutputsPB message_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  grpc::Status status_;
};

TEST_F(RpcServerTest, ThousandConcurrentStreamsCompleteWithCorrectTokens) {
  FakeModel reference(kBlocks, kBlockSize);
  std::mt19937 rng(1234);
  const std::vector<int32_t> shared = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22};
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < 1000; ++i) {
    std::vector<int32_t> prompt = i % 3 == 0 ? shared : std::vector<int32_t>{};
    const int extra = 1 + static_cast<int>(rng() % 40);
    for (int j = 0; j < extra; ++j) prompt.push_back(static_cast<int32_t>(rng() % 900));
    GenerateInputPB r = Request(prompt, 1 + static_cast<int>(rng() % 48), i % 2 == 0);
    r.set_request_id(i);
    calls.push_back(std::make_unique<Call>(stub_.get(), r));
  }
  for (auto& call : calls) {
    grpc::Status status = call->Await();
    ASSERT_TRUE(status.ok()) << status.error_message();
    const auto& r = call->request();
    std::vector<int32_t> prompt(r.token_ids().begin(), r.token_ids().end());
    EXPECT_EQ(call->tokens_, reference.reference(prompt, r.generate_config().max_new_tokens()));
    EXPECT_TRUE(call->finished_);
    EXPECT_EQ(call->output_len_, r.generate_config().max_new_tokens());
    if (!r.generate_config().is_streaming()) {
      EXPECT_EQ(call->messages_, 1);
    }
  }
  EXPECT_GT(Stats().hit_tokens, 0);
  ExpectDrained();
}

TEST_F(RpcServerTest, StreamingSendsOnlyNewTokens) {
  step_delay_us_ = 1000;
  auto call = std::make_unique<Call>(stub_.get(), Request({1, 2, 3}, 40, true));
  ASSERT_TRUE(call->Await().ok());
  EXPECT_GT(call->messages_, 1);
  EXPECT_EQ(call->tokens_, FakeModel(kBlocks, kBlockSize).reference({1, 2, 3}, 40));  // no repeats
  ExpectDrained();
}

TEST_F(RpcServerTest, MessagesCarryTheFinishReasonAndTheSamplersLogprobs) {
  const std::vector<int32_t> prompt = {9, 8, 7};
  const auto expected = FakeModel(kBlocks, kBlockSize).reference(prompt, 12);
  step_delay_us_ = 500;
  GenerateInputPB r = Request(prompt, 12, true);
  r.mutable_generate_config()->set_return_softmax_probs(true);
  auto length = std::make_unique<Call>(stub_.get(), r);
  ASSERT_TRUE(length->Await().ok());
  ASSERT_EQ(length->tokens_, expected);
  std::vector<float> want;
  for (int32_t t : expected) want.push_back(LogprobOf(t));
  EXPECT_EQ(length->logprobs_, want);  // bit-exact
  EXPECT_EQ(length->softmax_probs_, 0u);
  EXPECT_EQ(length->finish_reasons_.back(), "length");
  for (size_t i = 0; i + 1 < length->finish_reasons_.size(); ++i) EXPECT_EQ(length->finish_reasons_[i], "");

  GenerateInputPB s = Request(prompt, 12, false);
  s.mutable_generate_config()->mutable_stop_words_list()->add_rows()->add_values(expected[4]);
  auto stop = std::make_unique<Call>(stub_.get(), s);
  ASSERT_TRUE(stop->Await().ok());
  EXPECT_EQ(stop->tokens_, std::vector<int32_t>(expected.begin(), expected.begin() + 5));
  EXPECT_EQ(stop->finish_reasons_, std::vector<std::string>{"stop"});
  EXPECT_TRUE(stop->logprobs_.empty());  // not asked for
  ExpectDrained();
}

TEST_F(RpcServerTest, ClientCancelAbortsTheStreamAndFreesItsBlocks) {
  step_delay_us_ = 2000;  // 400 tokens take ~0.8 s; the clients cancel after 50 ms
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < 50; ++i) {
    GenerateInputPB r = Request(std::vector<int32_t>(100, i), 400, true);
    r.mutable_generate_config()->set_ignore_eos(true);
    calls.push_back(std::make_unique<Call>(stub_.get(), r));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const RtpEngineStats before = Stats();
  EXPECT_GT(before.running + before.waiting, 0);  // still generating (~0.8 s of work)
  for (auto& call : calls) call->Cancel();
  for (auto& call : calls) EXPECT_EQ(call->Await().error_code(), grpc::StatusCode::CANCELLED);
  ExpectDrained();  // within 2 s; typically one step
}

TEST_F(RpcServerTest, ErrorsMapToGrpcCodesWithErrorDetails) {
  auto too_long = std::make_unique<Call>(stub_.get(), Request(std::vector<int32_t>(600, 1), 4, false));
  grpc::Status status = too_long->Await();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  ErrorDetailsPB details;
  ASSERT_TRUE(details.ParseFromString(status.error_details()));
  EXPECT_EQ(details.error_code(), 511);  // LONG_PROMPT_ERROR
  EXPECT_EQ(details.field(), "token_ids");
  EXPECT_NE(details.error_message().find("max_seq_len"), std::string::npos);

  GenerateInputPB bad = Request({1, 2}, 4, false);
  bad.mutable_generate_config()->set_top_p(2.0f);
  auto invalid = std::make_unique<Call>(stub_.get(), bad);
  status = invalid->Await();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("top_p"), std::string::npos);
  ASSERT_TRUE(details.ParseFromString(status.error_details()));
  EXPECT_EQ(details.field(), "top_p");

  // 510 steps of at least 1 ms each cannot finish within the 5 ms timeout.
  step_delay_us_ = 1000;
  GenerateInputPB slow = Request({1, 2}, 100000, false);
  slow.mutable_generate_config()->set_timeout_ms(5);
  slow.mutable_generate_config()->set_ignore_eos(true);
  auto timeout = std::make_unique<Call>(stub_.get(), slow);
  status = timeout->Await();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(details.ParseFromString(status.error_details()));
  EXPECT_EQ(details.error_code(), 603);  // GENERATE_TIMEOUT
  EXPECT_EQ(details.field(), "timeout_ms");
  ExpectDrained();
}

TEST_F(RpcServerTest, TheCallersQueueCapRefusesTheExcessWithResourceExhausted) {
  paused_ = true;
  auto first = std::make_unique<Call>(stub_.get(), Request({1, 2}, 4, false), 2);
  auto second = std::make_unique<Call>(stub_.get(), Request({3, 4}, 4, false), 2);
  // Generous: under qemu (the aarch64 run) the calls' first connection alone can take a second.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (Stats().waiting < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_EQ(Stats().waiting, 2);
  auto third = std::make_unique<Call>(stub_.get(), Request({5, 6}, 4, false), 2);
  grpc::Status status = third->Await();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  ErrorDetailsPB details;
  ASSERT_TRUE(details.ParseFromString(status.error_details()));
  EXPECT_EQ(details.error_code(), 513);  // CONCURRENCY_LIMIT_ERROR
  paused_ = false;
  EXPECT_TRUE(first->Await().ok());
  EXPECT_TRUE(second->Await().ok());
  ExpectDrained();
}

TEST_F(RpcServerTest, HealthWorkerAndCacheStatus) {
  grpc::ClientContext c1, c2, c3;
  CheckHealthResponsePB health;
  ASSERT_TRUE(stub_->CheckHealth(&c1, EmptyPB(), &health).ok());
  EXPECT_EQ(health.health(), "ok");
  WorkerStatusPB worker;
  ASSERT_TRUE(stub_->GetWorkerStatus(&c2, StatusVersionPB(), &worker).ok());
  EXPECT_TRUE(worker.alive());
  EXPECT_EQ(worker.total_kv_cache(), int64_t{kBlocks} * kBlockSize);
  EXPECT_EQ(worker.max_seq_len(), 512);
  CacheStatusPB cache;
  ASSERT_TRUE(stub_->GetCacheStatus(&c3, CacheVersionPB(), &cache).ok());
  EXPECT_EQ(cache.block_size(), kBlockSize);
  EXPECT_EQ(cache.available_kv_cache(), cache.total_kv_cache());
}

TEST_F(RpcServerTest, PollThroughTheCApi) {
  GenerateInputPB r = Request({4, 4, 4}, 6, false);
  const std::string bytes = r.SerializeAsString();
  int64_t id = 0;
  char err[256];
  char field[64];
  ASSERT_EQ(rtp_llm_engine_enqueue(engine_, bytes.data(), static_cast<int32_t>(bytes.size()), &id, err, sizeof(err),
                                   field, sizeof(field)),
            0)
      << err;
  EXPECT_STREQ(field, "");
  std::vector<char> buf(16);
  GenerateOutputsPB out;
  for (int i = 0; i < 500; ++i) {
    int32_t code = -1;
    int32_t n = rtp_llm_engine_poll(engine_, id, 0, buf.data(), static_cast<int32_t>(buf.size()), &code);
    ASSERT_GE(n, 0);
    EXPECT_EQ(code, 0);
    // Too small: n says how much is needed now; the stream may have grown again by the retry.
    while (n > static_cast<int32_t>(buf.size())) {
      buf.resize(n);
      n = rtp_llm_engine_poll(engine_, id, 0, buf.data(), static_cast<int32_t>(buf.size()), &code);
    }
    ASSERT_TRUE(out.ParseFromArray(buf.data(), n));
    if (out.flatten_output().finished(0)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(Ids(out), FakeModel(kBlocks, kBlockSize).reference({4, 4, 4}, 6));
  rtp_llm_engine_release(engine_, id);
  EXPECT_EQ(rtp_llm_engine_poll(engine_, id, 0, nullptr, 0, nullptr), -1);
  std::string garbage = "\xff\xff\xff";
  EXPECT_EQ(rtp_llm_engine_enqueue(engine_, garbage.data(), 3, &id, err, sizeof(err), field, sizeof(field)), 605);
  const std::string empty = Request({}, 4, false).SerializeAsString();
  EXPECT_EQ(rtp_llm_engine_enqueue(engine_, empty.data(), static_cast<int32_t>(empty.size()), &id, err, sizeof(err),
                                   field, sizeof(field)),
            605);
  EXPECT_STREQ(field, "token_ids");
  ExpectDrained();
}

TEST(ProtoConvert, LogitBiasThinkingAndNgramFieldsArrive) {
  GenerateConfigPB pb;
  (*pb.mutable_logit_bias())[9] = -100.0f;
  (*pb.mutable_logit_bias())[3] = 2.5f;
  pb.set_top_logprobs(4);
  pb.set_in_think_mode(true);
  pb.set_max_thinking_tokens(7);
  pb.add_end_think_token_ids(90);
  pb.mutable_no_repeat_ngram_size()->set_value(3);
  const GenerateConfig c = from_proto(pb, 64);
  EXPECT_EQ(c.logit_bias, (std::vector<std::pair<int32_t, float>>{{3, 2.5f}, {9, -100.0f}}));  // sorted by id
  EXPECT_EQ(c.top_logprobs, 4);
  EXPECT_TRUE(c.in_think_mode);
  EXPECT_EQ(c.max_thinking_tokens, 7);
  EXPECT_EQ(c.end_think_token_ids, std::vector<int32_t>{90});
  EXPECT_EQ(c.no_repeat_ngram_size, 3);
  EXPECT_EQ(from_proto(GenerateConfigPB(), 64).no_repeat_ngram_size, 0);
}

// Reads a GenerateStreamCall to its end: the last message, and every token.
GenerateOutputsPB ReadAll(RpcService::Stub* stub, const GenerateInputPB& input, std::vector<int32_t>* tokens) {
  grpc::ClientContext ctx;
  auto reader = stub->GenerateStreamCall(&ctx, input);
  GenerateOutputsPB msg, last;
  while (reader->Read(&msg)) {
    for (int32_t t : Ids(msg)) tokens->push_back(t);
    last = msg;
  }
  EXPECT_TRUE(reader->Finish().ok());
  return last;
}

TEST_F(RpcServerTest, APrefillHandOffThenADecodeRequestOverTheWire) {
  const std::vector<int32_t> prompt(40, 3);  // 2 full blocks of 16, and 8 tokens
  const auto expected = FakeModel(kBlocks, kBlockSize).reference(prompt, 8);
  GenerateInputPB p;
  for (int32_t t : prompt) p.add_token_ids(t);
  p.mutable_generate_config()->set_max_new_tokens(8);
  p.mutable_generate_config()->set_can_use_pd_separation(true);
  std::vector<int32_t> first;
  const GenerateOutputsPB handed = ReadAll(stub_.get(), p, &first);
  ASSERT_EQ(first, std::vector<int32_t>{expected[0]});
  const AuxInfoPB& aux = handed.flatten_output().aux_info(0);
  ASSERT_TRUE(aux.pd_sep());
  EXPECT_EQ(aux.finish_reason(), "");  // handed off, not finished here
  EXPECT_EQ(aux.kv_export().block_ids_size(), 2);
  EXPECT_EQ(aux.kv_export().block_size(), kBlockSize);
  grpc::ClientContext rc;
  RemoteFinishRequestPB finish;
  finish.set_request_id(aux.kv_export().export_id());
  EmptyPB empty;
  ASSERT_TRUE(stub_->RemoteFinish(&rc, finish, &empty).ok());
  ExpectDrained();  // RemoteFinish freed the kept blocks (the prompt's stay cached)

  // The same engine as the decode side: its prefix cache has both blocks, so the read is empty.
  std::thread reader([this] {
    int32_t remote[64], local[64], n = 0, len = 0;
    char source[256];
    int64_t waited = 0;
    const int64_t id = rtp_llm_engine_next_kv_import(engine_, 5000, remote, local, 64, &n, source, sizeof(source),
                                                     &len, &waited);
    EXPECT_GT(id, 0);
    EXPECT_EQ(n, 0);
    rtp_llm_engine_kv_import_done(engine_, id, 1, 0, 0);
  });
  GenerateInputPB d = p;
  d.mutable_generate_config()->set_can_use_pd_separation(false);
  d.add_generated_token_ids(expected[0]);
  *d.mutable_kv_export() = aux.kv_export();
  std::vector<int32_t> rest;
  ReadAll(stub_.get(), d, &rest);
  reader.join();
  EXPECT_EQ(rest, std::vector<int32_t>(expected.begin() + 1, expected.end()));  // the first is not sent again
  ExpectDrained();
}

TEST(ProtoConvert, AlternativesAreAnIdsAndALogprobsMatrix) {
  StreamUpdate u;
  u.new_tokens = {5, 6};
  u.top_logprobs = 2;
  u.new_top_ids = {5, 1, 6, 2};
  u.new_top_logprobs = {-0.1f, -2.0f, -0.2f, -3.0f};
  GenerateOutputsPB out;
  to_proto(1, u, 0, &out);
  const AuxInfoPB& aux = out.flatten_output().aux_info(0);
  EXPECT_EQ(std::vector<int64_t>(aux.top_token_ids().shape().begin(), aux.top_token_ids().shape().end()),
            (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(aux.top_logprobs().fp32_data().size(), 4 * sizeof(float));
  float lp[4];
  std::memcpy(lp, aux.top_logprobs().fp32_data().data(), sizeof(lp));
  EXPECT_EQ(lp[3], -3.0f);
  u.top_logprobs = 0;
  to_proto(1, u, 0, &out);
  EXPECT_FALSE(out.flatten_output().aux_info(0).has_top_token_ids());  // not asked: nothing sent
}

}  // namespace
}  // namespace rtp_llm
