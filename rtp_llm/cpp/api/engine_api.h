// C ABI of the engine core for Python (ctypes) and other hosts. All functions are
// thread-safe unless noted; a stepping loop calls schedule() then commit() alternately.
//
// Ownership and lifetime:
// - RtpEngine* is created by rtp_llm_engine_create and freed by rtp_llm_engine_destroy
//   (which stops the RPC server first). No other function frees anything.
// - The RtpStepBatch returned by schedule() / schedule_ahead() and every array it points to
//   are owned by the engine: valid until the second schedule call after it or destroy(); a
//   batch's pointers never change (the engine cycles through preallocated buffers).
// - Input buffers (protos, tokens, addresses) are only read during the call.
// - Output buffers (err, out) are caller-owned; strings are NUL-terminated and truncated to
//   the given capacity.
#pragma once

#include <stdint.h>

#include "rtp_llm/cpp/api/c_api.h"
#include "rtp_llm/cpp/engine/step_batch_fields.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct RtpEngine RtpEngine;

// The structs below are expanded from the lists in step_batch_fields.h (meanings there) and
// describe themselves (rtp_llm_struct_info), so a host builds its mirror from the library.
#define RTP_LLM_DECLARE_FIELD(type, name, ...) RTP_LLM_CTYPE(type) name;
#define RTP_LLM_DECLARE_COUNT(name) int32_t name;
#define RTP_LLM_DECLARE_ARRAY(type, name, ...) const RTP_LLM_CTYPE(type)* name;

typedef struct {
  RTP_LLM_ENGINE_CONFIG(RTP_LLM_DECLARE_FIELD)
  const int32_t* eos_token_ids;  // may be NULL when num_eos_token_ids == 0
  int32_t num_eos_token_ids;
} RtpEngineConfig;

// Arrays of S = num_streams, T = num_tokens, B = block_table_stride, H = num_history_tokens,
// L = num_bias_entries.
typedef struct {
  RTP_LLM_STEP_COUNTS(RTP_LLM_DECLARE_COUNT)
  RTP_LLM_STEP_ARRAYS(RTP_LLM_DECLARE_ARRAY)
  RTP_LLM_ALL_SAMPLING(RTP_LLM_DECLARE_ARRAY)
} RtpStepBatch;

typedef struct {
  RTP_LLM_ENGINE_STATS(RTP_LLM_DECLARE_FIELD)
} RtpEngineStats;

// Self-description of the structs above. type: element type; length: RTP_LLM_LEN_SCALAR for
// a plain field, else the length of the array it points to; group: a step array's
// (RTP_LLM_GROUP_*); offset: offsetof(struct, name). Sampling parameters (group
// RTP_LLM_GROUP_PARAM) and engine config fields carry their default and valid range [lo, hi]
// ((lo, hi] when lo_open; +-HUGE_VAL: no bound).
enum { RTP_LLM_TYPE_i32 = 1, RTP_LLM_TYPE_i64 = 2, RTP_LLM_TYPE_f32 = 3 };
// (RTP_LLM_LEN_EOS: num_eos_token_ids)
enum { RTP_LLM_LEN_SCALAR, RTP_LLM_LEN_S, RTP_LLM_LEN_S1, RTP_LLM_LEN_T, RTP_LLM_LEN_SB, RTP_LLM_LEN_H, RTP_LLM_LEN_EOS,
       RTP_LLM_LEN_L };
enum { RTP_LLM_GROUP_NONE = 0, RTP_LLM_GROUP_HOST = 1, RTP_LLM_GROUP_MODEL = 2, RTP_LLM_GROUP_SAMPLE = 3,
       RTP_LLM_GROUP_PARAM = 4 };

typedef struct {
  const char* name;
  int32_t type;
  int32_t length;
  int32_t group;
  int32_t lo_open;
  int64_t offset;
  double default_value, lo, hi;
} RtpFieldInfo;

typedef struct {
  int64_t size;  // sizeof the struct
  int32_t num_fields;
  const RtpFieldInfo* fields;  // in declaration order
} RtpStructInfo;

// "RtpEngineConfig", "RtpStepBatch" or "RtpEngineStats"; NULL for any other name. Static.
const RtpStructInfo* rtp_llm_struct_info(const char* name);

// The size every step batch's arrays of length kind `length` (RTP_LLM_LEN_S ... except EOS)
// are preallocated to, so a host can map them once; -1 for another kind.
int64_t rtp_llm_engine_array_capacity(RtpEngine* engine, int32_t length);

// NULL on a bad config, with the field at fault named in `err`.
RtpEngine* rtp_llm_engine_create(const RtpEngineConfig* config, char* err, int32_t err_len);
void rtp_llm_engine_destroy(RtpEngine* engine);

// Enqueues a serialized GenerateInputPB (token_ids + generate_config). Returns 0 and the
// stream id, or upstream's error code (e.g. 511 LONG_PROMPT_ERROR) with the reason in `err`
// and the request field it is about in `field` ("token_ids", a generate_config key, or "").
int32_t rtp_llm_engine_enqueue(RtpEngine* engine, const void* generate_input_pb, int32_t len, int64_t* stream_id,
                               char* err, int32_t err_len, char* field, int32_t field_len);

// The next step (num_streams == 0: nothing to run); the uncommitted one again while there is
// one. Not thread-safe with commit().
const RtpStepBatch* rtp_llm_engine_schedule(RtpEngine* engine);
// Overlap: the step after the uncommitted one, scheduled before its tokens are known; a token
// id -1 - r stands for row r of the tokens that step samples. Empty when two are uncommitted.
const RtpStepBatch* rtp_llm_engine_schedule_ahead(RtpEngine* engine);
// The sampled tokens of the oldest uncommitted batch's sampled rows in batch order: per
// do_sample stream its last 1 + draft_lens rows (n == num_sampled + num_draft_tokens; drafted
// tokens are verified against them, step_batch_fields.h); logprobs may be NULL. top_ids / top_logprobs: [n, top_k] row-major, the
// best top_k alternatives of each row, best first (top_k >= every row's top_logprobs; NULL
// when top_k is 0). The batch's prompt rows (tokens with prompt_targets >= 0, in token order;
// num_prompt == num_prompt_logprobs): prompt_logprobs [num_prompt], the target's log-prob under
// the raw model distribution, and prompt_top_ids / prompt_top_logprobs [num_prompt,
// prompt_top_k], its best alternatives (prompt_top_k >= every such stream's prompt_logprobs;
// NULL when 0). appended (NULL, or n entries written): 1 where the token was appended to
// its stream, 0 where dropped (the stream had ended or was cancelled: an ahead step's wasted
// row). Returns 0, or 605 (INVALID_PARAMS) with the reason in `err`.
int32_t rtp_llm_engine_commit(RtpEngine* engine, const int32_t* tokens, const float* logprobs, int32_t n,
                              const int32_t* top_ids, const float* top_logprobs, int32_t top_k,
                              const float* prompt_logprobs, int32_t num_prompt, const int32_t* prompt_top_ids,
                              const float* prompt_top_logprobs, int32_t prompt_top_k, int32_t* appended, char* err,
                              int32_t err_len);

// Grammars (the GenerateConfigPB fields json_schema, regex, ebnf, structural_tag): the host
// compiles them, off its stepping thread; a stream is not scheduled until its grammar is done.
// next_grammar: the next stream whose grammar is to be compiled: its id, the field's name
// (into `field`) and the grammar's text (into `spec`, not NUL-terminated). Returns the text's
// length; -1 when there is none. When it exceeds `spec_cap` nothing is taken: call again
// with a larger buffer.
int32_t rtp_llm_engine_next_grammar(RtpEngine* engine, int64_t* stream_id, char* field, int32_t field_len, char* spec,
                                    int32_t spec_cap);
// The stream's grammar compiled (error_code 0: it may be scheduled now) or failed: the stream
// ends with error_code (upstream's numbering), `message` and `field`. compile_us: the compile
// time when this stream's grammar was compiled for it (0: a cache hit, cache_hit = 1).
void rtp_llm_engine_grammar_done(RtpEngine* engine, int64_t stream_id, int32_t error_code, const char* message,
                                 const char* field, int64_t compile_us, int32_t cache_hit);
// Ids of streams with a grammar that ended since the last call, up to `cap` into `ids`.
// Returns how many were written (call until it returns less than cap).
int32_t rtp_llm_engine_take_ended_grammars(RtpEngine* engine, int64_t* ids, int32_t cap);

// Instead of commit() when the model runner failed: the streams of every uncommitted batch end
// with EXECUTION_EXCEPTION (606) and `message`; the others carry on. Returns 0 or 605.
int32_t rtp_llm_engine_fail_batch(RtpEngine* engine, const char* message, char* err, int32_t err_len);

// 1 when a stream waits or runs, 0 after timeout_ms or rtp_llm_engine_stop.
int32_t rtp_llm_engine_wait_for_work(RtpEngine* engine, int32_t timeout_ms);
void rtp_llm_engine_stop(RtpEngine* engine);

// 1 if the stream existed. Its blocks are freed now, or at the commit of its in-flight step.
int32_t rtp_llm_engine_abort(RtpEngine* engine, int64_t stream_id);
// Serializes a GenerateOutputsPB with the tokens generated from index `from` on into `out`,
// and the stream's error code (upstream's numbering, 0 if none) into `*error_code` (may be
// NULL). Returns the message size; -1 for an unknown stream; if the size exceeds `cap`,
// nothing is written and the needed size is returned (call again with a larger buffer; a
// running stream may have grown by then, so loop until the size fits).
int32_t rtp_llm_engine_poll(RtpEngine* engine, int64_t stream_id, int32_t from, void* out, int32_t cap,
                            int32_t* error_code);
// Copies a stream's tokens (prompt, then generated) into `out` (up to `cap`) and its prompt
// length into `*prompt_len`. Returns the total count (> cap: call again), -1 if unknown.
// (Inspection for tests and tools: the sampler's history travels in the step batch.)
int32_t rtp_llm_engine_stream_tokens(RtpEngine* engine, int64_t stream_id, int32_t* out, int32_t cap,
                                     int32_t* prompt_len);
// Forgets a stream (aborting it if unfinished). Call once its final output was read.
void rtp_llm_engine_release(RtpEngine* engine, int64_t stream_id);

void rtp_llm_engine_stats(RtpEngine* engine, RtpEngineStats* out);

// Prefill/decode disaggregation (rtp_llm/cpp/engine/kv_handoff.h). PREFILL: set_kv_source stores
// the transfer engine's description of this instance's KV pool (len bytes, sent with every
// export as KvExportPB.source); release_export frees export `id`'s blocks (a decode instance read
// them; unknown ids are ignored). DECODE: next_kv_import waits up to timeout_ms for a stream
// whose prompt's blocks are to be read and returns its id (-1: none came): the read is remote
// block remote[i] into local block local[i], i < *num_blocks, from the KvSourcePB in source
// (*source_len bytes); *waited_us: since the stream arrived. When *num_blocks exceeds cap or *source_len source_cap, nothing is taken
// and -2 is returned (that stream recomputes its prompt). kv_import_done ends the read (ok = 1:
// the blocks hold the KV; 0: they are freed) and lets the stream run; bytes and us (the read's
// size and time) go into the statistics.
void rtp_llm_engine_set_kv_source(RtpEngine* engine, const char* source, int32_t len);
void rtp_llm_engine_release_export(RtpEngine* engine, int64_t id);
int64_t rtp_llm_engine_next_kv_import(RtpEngine* engine, int32_t timeout_ms, int32_t* remote, int32_t* local,
                                      int32_t cap, int32_t* num_blocks, char* source, int32_t source_cap,
                                      int32_t* source_len, int64_t* waited_us);
void rtp_llm_engine_kv_import_done(RtpEngine* engine, int64_t stream_id, int32_t ok, int64_t bytes, int64_t us);

// Serves RpcService on `address` ("host:port", port 0 picks one). Returns the bound port,
// or -1 with the reason in `err`.
int32_t rtp_llm_engine_start_rpc_server(RtpEngine* engine, const char* address, char* err, int32_t err_len);
void rtp_llm_engine_stop_rpc_server(RtpEngine* engine);

// A thread for a grammar step's matcher work (rtp_llm/cpp/engine/fill_worker.h: its invariants).
// Not thread-safe: one host thread submits and waits.
typedef struct RtpFillWorker RtpFillWorker;
// tvm-ffi's TVMFFIFunctionCall convention: num_args 16-byte records, a 16-byte result.
typedef int (*RtpFillCall)(void* func, void* args, int32_t num_args, void* result);
// One call of a job: call(func, args, num_args, result); result must come back a plain value.
typedef struct RtpFillCallSpec {
  RtpFillCall call;
  void* func;
  void* args;
  int32_t num_args;
  int32_t reserved;  // 0
  void* result;
} RtpFillCallSpec;
RtpFillWorker* rtp_llm_fill_worker_create(void);
void rtp_llm_fill_worker_destroy(RtpFillWorker* worker);  // waits for a job in flight
// Starts the job specs[0, num_calls) on the worker, in order, stopping at the first call that
// fails; specs and all they point to stay the caller's until wait returns. gate: NULL, or a
// 64-bit host counter that receives `ticket` (a release store) once the job ended, however it
// ended. Returns 0, or -1 (nothing started) while a job is in flight or for num_calls < 1.
int32_t rtp_llm_fill_worker_submit(RtpFillWorker* worker, const RtpFillCallSpec* specs, int32_t num_calls,
                                   int64_t* gate, int64_t ticket);
// Blocks until the last job ended: 0, the failing call's code (-2: it gave back an object), 0
// when none was submitted; *failed_at (may be NULL): the failing call's index, or -1.
int32_t rtp_llm_fill_worker_wait(RtpFillWorker* worker, int32_t* failed_at);
// An RtpFillCall that calls a plain C function `int f(...)` of num_args (1 to 4) pointer-sized
// integer arguments, given as that many uint64 at args; the result gets f's return value.
int rtp_llm_fill_call_c_function(void* func, void* args, int32_t num_args, void* result);

#ifdef __cplusplus
}
#endif
