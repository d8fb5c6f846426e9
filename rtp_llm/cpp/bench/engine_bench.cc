// EngineCore core benchmark (a tool, not a test): prints
//  1. the cost of one schedule() + commit() with N running decode streams (model excluded);
//  2. tokens/s the gRPC server delivers to N concurrent streaming clients, with a model that
//     costs nothing (so the engine, the server and the clients are all that is measured;
//     tokens pile up between writes), and with a model paced at one step per --pace_us
//     (one token per message, as a real model produces them).
//
//   bazelisk run //rtp_llm/cpp/bench:engine_bench [-- --steps=200 --tokens=1000]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "rtp_llm/cpp/api/engine_api.h"
#include "rtp_llm/cpp/engine/engine_core.h"
#include "rtp_llm/cpp/model_rpc/proto/model_rpc_service.grpc.pb.h"

namespace rtp_llm {
namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1))];
}

void BenchScheduleCommit(int streams, int steps) {
  EngineCoreConfig c;
  c.block_size = 16;
  c.max_seq_len = 128 + steps + 64;
  c.num_blocks = streams * ((c.max_seq_len + 15) / 16) + 16;
  c.max_batch_size = streams;
  c.max_num_batched_tokens = std::max(8192, streams);
  EngineCore engine(c);
  GenerateConfig g;
  g.max_new_tokens = steps + 32;
  g.ignore_eos = true;
  for (int i = 0; i < streams; ++i) {
    std::vector<int32_t> prompt(128);
    for (int j = 0; j < 128; ++j) prompt[j] = i * 131 + j;  // distinct: no prefix sharing
    int64_t id;
    engine.enqueue(prompt, g, &id);
  }
  std::vector<int32_t> tokens(streams, 7);
  for (;;) {  // prefill until every stream decodes
    const StepBatch& b = engine.schedule();
    engine.commit(tokens.data(), nullptr, b.num_sampled);
    if (b.num_prefill == 0 && b.num_streams == streams) break;
  }
  std::vector<double> us;
  for (int s = 0; s < steps; ++s) {
    const auto t0 = Clock::now();
    const StepBatch& b = engine.schedule();
    std::fill(tokens.begin(), tokens.end(), 1000 + s);
    engine.commit(tokens.data(), nullptr, b.num_sampled);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (b.num_streams != streams) std::fprintf(stderr, "warning: step %d ran %d streams\n", s, b.num_streams);
  }
  std::printf("schedule+commit  %5d decode streams: median %8.1f us/step  p90 %8.1f us  (%.3f us/stream)\n",
              streams, Percentile(us, 0.5), Percentile(us, 0.9), Percentile(us, 0.5) / streams);
}

class Reader : public grpc::ClientReadReactor<GenerateOutputsPB> {
 public:
  Reader(RpcService::Stub* stub, const GenerateInputPB& request, std::atomic<int>* pending, std::mutex* mu,
         std::condition_variable* cv)
      : request_(request), pending_(pending), mu_(mu), cv_(cv) {
    stub->async()->GenerateStreamCall(&context_, &request_, this);
    StartRead(&message_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    ++messages;
    tokens += static_cast<int64_t>(message_.flatten_output().output_ids().int32_data().size() / sizeof(int32_t));
    StartRead(&message_);
  }
  void OnDone(const grpc::Status& s) override {
    ok = s.ok();
    std::lock_guard<std::mutex> lock(*mu_);
    if (--*pending_ == 0) cv_->notify_all();
  }
  int64_t tokens = 0, messages = 0;
  bool ok = false;

 private:
  GenerateInputPB request_;
  grpc::ClientContext context_;
  GenerateOutputsPB message_;
  std::atomic<int>* pending_;
  std::mutex* mu_;
  std::condition_variable* cv_;
};

void BenchGrpcDelivery(int streams, int tokens_per_stream, int pace_us) {
  const int max_seq_len = 16 + tokens_per_stream + 16;
  RtpEngineConfig config{};  // by name: the struct grows with RTP_LLM_ENGINE_CONFIG
  config.num_blocks = streams * ((max_seq_len + 15) / 16) + 16;
  config.block_size = 16;
  config.max_batch_size = streams;
  config.max_num_batched_tokens = 8192;
  config.max_seq_len = max_seq_len;
  config.reuse_cache = 1;
  config.sp_min_token_match = 2;
  config.sp_max_token_match = 3;
  char err[256];
  RtpEngine* engine = rtp_llm_engine_create(&config, err, sizeof(err));
  const int port = rtp_llm_engine_start_rpc_server(engine, "127.0.0.1:0", err, sizeof(err));
  if (port < 0) {
    std::fprintf(stderr, "cannot start the RPC server: %s\n", err);
    return;
  }
  std::atomic<bool> stop{false};
  std::thread loop([&] {
    std::vector<int32_t> tokens(streams, 7);
    while (!stop) {
      if (!rtp_llm_engine_wait_for_work(engine, 10)) continue;
      const RtpStepBatch* b = rtp_llm_engine_schedule(engine);
      if (b->num_streams == 0) continue;
      if (pace_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(pace_us));
      rtp_llm_engine_commit(engine, tokens.data(), nullptr, b->num_sampled, nullptr, nullptr, 0, nullptr, 0, nullptr,
                            nullptr, 0, nullptr, err, sizeof(err));
    }
  });
  auto stub = RpcService::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                      grpc::InsecureChannelCredentials()));
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> pending{streams};
  std::vector<std::unique_ptr<Reader>> readers;
  const auto t0 = Clock::now();
  for (int i = 0; i < streams; ++i) {
    GenerateInputPB r;
    for (int j = 0; j < 16; ++j) r.add_token_ids(i * 17 + j);
    r.mutable_generate_config()->set_max_new_tokens(tokens_per_stream);
    r.mutable_generate_config()->set_ignore_eos(true);
    r.mutable_generate_config()->set_is_streaming(true);
    readers.push_back(std::make_unique<Reader>(stub.get(), r, &pending, &mu, &cv));
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return pending == 0; });
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  int64_t tokens = 0, messages = 0, failed = 0;
  for (auto& r : readers) {
    tokens += r->tokens;
    messages += r->messages;
    failed += r->ok ? 0 : 1;
  }
  stop = true;
  loop.join();
  RtpEngineStats stats;
  rtp_llm_engine_stats(engine, &stats);
  rtp_llm_engine_destroy(engine);
  std::printf("gRPC delivery    %5d streaming clients x %d tokens, model step %s: %10.0f tokens/s  (%.2f s, %.1f tokens/message, "
              "%ld engine steps, %ld failed)\n",
              streams, tokens_per_stream, pace_us > 0 ? (std::to_string(pace_us) + " us").c_str() : "free",
              static_cast<double>(tokens) / seconds, seconds,
              static_cast<double>(tokens) / std::max<int64_t>(messages, 1), static_cast<long>(stats.steps),
              static_cast<long>(failed));
}

int Flag(int argc, char** argv, const char* name, int fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return std::atoi(argv[i] + prefix.size());
  }
  return fallback;
}

}  // namespace
}  // namespace rtp_llm

int main(int argc, char** argv) {
  const int steps = rtp_llm::Flag(argc, argv, "steps", 200);
  const int tokens = rtp_llm::Flag(argc, argv, "tokens", 1000);
  const int pace_us = rtp_llm::Flag(argc, argv, "pace_us", 1000);
  std::printf("rtp_llm engine core benchmark (%u hardware threads)\n", std::thread::hardware_concurrency());
  for (int streams : {64, 256, 1024}) rtp_llm::BenchScheduleCommit(streams, steps);
  for (int streams : {16, 256, 1024}) rtp_llm::BenchGrpcDelivery(streams, tokens, 0);
  for (int streams : {256, 1024}) rtp_llm::BenchGrpcDelivery(streams, tokens / 4, pace_us);
  return 0;
}
