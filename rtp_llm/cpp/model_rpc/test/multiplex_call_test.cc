// FrontendStreamService::GenerateMultiplexed end to end: many requests on one call get the
// right tokens in few messages, cancels and errors stay per request, and a frontend that goes
// away takes its streams with it.
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "rtp_llm/cpp/model_rpc/proto_convert.h"  // kMaxWaitingKey
#include "rtp_llm/cpp/model_rpc/test/rpc_server_fixture.h"

namespace rtp_llm {
namespace {

using test::Ids;
using test::kBlocks;
using test::kBlockSize;
using testing::FakeModel;

// What one tag received.
struct Received {
  std::vector<int32_t> tokens;
  int updates = 0;
  bool finished = false;
  int status_code = 0;
  ErrorDetailsPB error;
  bool last() const { return finished || status_code != 0; }
};

// One multiplexed call with the synchronous API: requests are written from the test thread,
// read() collects updates until the given tags have their last one.
class MuxClient {
 public:
  MuxClient(const std::shared_ptr<grpc::Channel>& channel, int max_waiting = 0)
      : stub_(FrontendStreamService::NewStub(channel)) {
    if (max_waiting > 0) context_.AddMetadata(kMaxWaitingKey, std::to_string(max_waiting));
    stream_ = stub_->GenerateMultiplexed(&context_);
  }

  void start(int64_t tag, const GenerateInputPB& input) {
    MultiplexRequestPB r;
    r.set_tag(tag);
    *r.mutable_input() = input;
    ASSERT_TRUE(stream_->Write(r));
  }
  void cancel(int64_t tag) {
    MultiplexRequestPB r;
    r.set_tag(tag);
    r.set_cancel(true);
    ASSERT_TRUE(stream_->Write(r));
  }
  // Reads until every tag in `tags` has its last update (or the call ends).
  bool read(const std::set<int64_t>& tags) {
    MultiplexOutputsPB out;
    while (!done(tags) && stream_->Read(&out)) {
      ++messages;
      for (const MultiplexUpdatePB& u : out.updates()) {
        Received& r = got[u.tag()];
        EXPECT_FALSE(r.last()) << "an update after tag " << u.tag() << "'s last";
        ++r.updates;
        const auto ids = Ids(u.output());
        r.tokens.insert(r.tokens.end(), ids.begin(), ids.end());
        r.finished = u.output().flatten_output().finished_size() > 0 && u.output().flatten_output().finished(0);
        r.status_code = u.status_code();
        r.error = u.error();
      }
    }
    return done(tags);
  }
  grpc::Status close() {
    stream_->WritesDone();
    MultiplexOutputsPB out;
    while (stream_->Read(&out)) {
    }
    return stream_->Finish();
  }
  void drop() { context_.TryCancel(); }

  std::map<int64_t, Received> got;
  int messages = 0;

 private:
  bool done(const std::set<int64_t>& tags) {
    for (int64_t t : tags) {
      if (!got[t].last()) return false;
    }
    return true;
  }
  std::unique_ptr<FrontendStreamService::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<MultiplexRequestPB, MultiplexOutputsPB>> stream_;
};

class MultiplexTest : public test::RpcServerTest {};

TEST_F(MultiplexTest, ManyRequestsOnOneCallGetTheirTokensInFewMessages) {
  step_delay_us_ = 200;
  FakeModel reference(kBlocks, kBlockSize);
  std::mt19937 rng(99);
  MuxClient mux(channel_);
  std::map<int64_t, GenerateInputPB> inputs;
  std::set<int64_t> tags;
  for (int64_t tag = 1; tag <= 200; ++tag) {
    std::vector<int32_t> prompt;
    for (int j = 0, n = 1 + static_cast<int>(rng() % 30); j < n; ++j) prompt.push_back(static_cast<int32_t>(rng() % 900));
    inputs[tag] = Request(prompt, 8 + static_cast<int>(rng() % 24), tag % 4 != 0);  // a quarter not streaming
    inputs[tag].mutable_generate_config()->set_ignore_eos(true);
    mux.start(tag, inputs[tag]);
    tags.insert(tag);
  }
  ASSERT_TRUE(mux.read(tags));
  int updates = 0;
  for (const auto& [tag, input] : inputs) {
    const Received& r = mux.got[tag];
    std::vector<int32_t> prompt(input.token_ids().begin(), input.token_ids().end());
    EXPECT_EQ(r.tokens, reference.reference(prompt, input.generate_config().max_new_tokens())) << "tag " << tag;
    EXPECT_TRUE(r.finished);
    if (!input.generate_config().is_streaming()) {
      EXPECT_EQ(r.updates, 1) << "tag " << tag;
    }
    updates += r.updates;
  }
  // Every stream steps together: each message carries many streams' updates.
  EXPECT_LT(mux.messages * 2, updates) << mux.messages << " messages for " << updates << " updates";
  EXPECT_TRUE(mux.close().ok());
  ExpectDrained();
}

TEST_F(MultiplexTest, ACancelEndsOnlyItsRequest) {
  step_delay_us_ = 1000;
  MuxClient mux(channel_);
  for (int64_t tag = 1; tag <= 10; ++tag) {
    GenerateInputPB r = Request({static_cast<int32_t>(tag), 2, 3}, tag % 2 ? 400 : 20, true);
    r.mutable_generate_config()->set_ignore_eos(true);
    mux.start(tag, r);
  }
  for (int64_t tag = 1; tag <= 10; tag += 2) mux.cancel(tag);  // the long ones
  ASSERT_TRUE(mux.read({2, 4, 6, 8, 10}));
  for (int64_t tag = 2; tag <= 10; tag += 2) {
    EXPECT_EQ(mux.got[tag].tokens, FakeModel(kBlocks, kBlockSize).reference({static_cast<int32_t>(tag), 2, 3}, 20));
  }
  for (int64_t tag = 1; tag <= 10; tag += 2) EXPECT_FALSE(mux.got[tag].finished) << "tag " << tag;
  ExpectDrained();  // the cancelled streams were aborted, not run to 400 tokens
  EXPECT_TRUE(mux.close().ok());
}

TEST_F(MultiplexTest, ErrorsArePerRequestWithTheirCodeAndField) {
  paused_ = true;  // tag 3 is still running when it is reused
  MuxClient mux(channel_);
  mux.start(1, Request({}, 4, true));
  mux.start(2, Request(std::vector<int32_t>(600, 1), 4, true));  // over max_seq_len 512
  mux.start(3, Request({1, 2, 3}, 4, true));
  mux.start(3, Request({1, 2, 3}, 4, true));  // a tag in use: both end with one error
  ASSERT_TRUE(mux.read({1, 2, 3}));
  EXPECT_EQ(mux.got[1].status_code, grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(mux.got[1].error.field(), "token_ids");
  EXPECT_EQ(mux.got[2].status_code, grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_FALSE(mux.got[2].error.error_message().empty());
  EXPECT_EQ(mux.got[3].status_code, grpc::StatusCode::INVALID_ARGUMENT);
  paused_ = false;
  mux.start(4, Request({7, 7}, 3, false));  // the call serves on
  ASSERT_TRUE(mux.read({4}));
  EXPECT_EQ(mux.got[4].tokens, FakeModel(kBlocks, kBlockSize).reference({7, 7}, 3));
  EXPECT_TRUE(mux.close().ok());
  ExpectDrained();
}

TEST_F(MultiplexTest, TheQueueCapOfTheCallRefusesTheExcess) {
  paused_ = true;
  MuxClient mux(channel_, 2);
  mux.start(1, Request({1, 2}, 4, false));
  mux.start(2, Request({3, 4}, 4, false));
  mux.start(3, Request({5, 6}, 4, false));
  ASSERT_TRUE(mux.read({3}));
  EXPECT_EQ(mux.got[3].status_code, grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(mux.got[3].error.error_code(), 513);  // CONCURRENCY_LIMIT_ERROR
  paused_ = false;
  ASSERT_TRUE(mux.read({1, 2}));
  EXPECT_TRUE(mux.got[1].finished && mux.got[2].finished);
  EXPECT_TRUE(mux.close().ok());
  ExpectDrained();
}

TEST_F(MultiplexTest, AFrontendThatGoesAwayTakesItsStreamsWithIt) {
  step_delay_us_ = 2000;
  {
    MuxClient mux(channel_);
    for (int64_t tag = 1; tag <= 20; ++tag) {
      GenerateInputPB r = Request(std::vector<int32_t>(50, static_cast<int32_t>(tag)), 400, true);
      r.mutable_generate_config()->set_ignore_eos(true);
      mux.start(tag, r);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const RtpEngineStats s = Stats();
    EXPECT_GT(s.running + s.waiting, 0);
    mux.drop();
  }
  ExpectDrained();  // well before the ~0.8 s the streams would take
}

}  // namespace
}  // namespace rtp_llm
