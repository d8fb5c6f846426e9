"""The ctypes mirror of the C ABI's structs against the C compiler's layout: each struct is
built in Python from the library's description (names and types only, ctypes choosing the
offsets) and compared with the sizes and offsetof values the library reports."""

import ctypes
import unittest

import numpy as np

import rtp_llm.ops as ops
from rtp_llm.cpp.model_rpc.proto import model_rpc_service_pb2 as pb
from rtp_llm.ops import engine_core
from rtp_llm.ops.engine_core import EngineCore, EngineError, NativeLibraryError

STRUCTS = ("RtpEngineConfig", "RtpStepBatch", "RtpEngineStats")


class LayoutTest(unittest.TestCase):
    def setUp(self):
        self.lib = ops.ensure_engine_ops_loaded()

    def test_ctypes_sizes_and_offsets_equal_the_c_compilers(self):
        for name in STRUCTS:
            size, fields = engine_core.describe(self.lib, name)
            struct, _ = engine_core.mirror(self.lib, name)
            self.assertEqual(ctypes.sizeof(struct), size, name)
            self.assertGreater(len(fields), 5, name)
            for f in fields:
                self.assertEqual(getattr(struct, f.name).offset, f.offset, f"{name}.{f.name}")

    def test_a_mirror_that_disagrees_is_refused(self):
        real = engine_core.describe

        def describe_wrong_type(lib, name):
            size, fs = real(lib, name)
            f = fs[0]  # an int32 counter taken for an int64: the fields after it move
            return size, [engine_core.Field(f.name, ctypes.c_int64, f.length, f.group, f.offset, f.default, f.lo,
                                            f.lo_open, f.hi)] + fs[1:]

        engine_core.describe = describe_wrong_type
        try:
            with self.assertRaises(NativeLibraryError):
                engine_core.mirror(self.lib, "RtpEngineStats")
        finally:
            engine_core.describe = real

    def test_sampling_parameters_carry_default_and_range(self):
        params = {f.name: f for f in engine_core.step_batch_fields() if f.group == engine_core.GROUP_PARAM}
        self.assertEqual(params["top_p"].default, 1.0)
        self.assertEqual((params["top_p"].lo, params["top_p"].lo_open, params["top_p"].hi), (0.0, True, 1.0))
        self.assertEqual(params["random_seed"].default, -1)
        self.assertTrue(all(f.length == engine_core.LEN_S for f in params.values()))


class StepBatchViewTest(unittest.TestCase):
    def test_rows_select_every_sampling_array_and_the_penalty_history(self):
        core = EngineCore(64, 4, 4, 64, 32, eos_token_ids=[])
        try:
            plain = core.enqueue([1, 2, 3], pb.GenerateConfigPB(max_new_tokens=4))
            pen = core.enqueue([4, 5, 6, 7], pb.GenerateConfigPB(max_new_tokens=4, temperature=0.5,
                                                                 repetition_penalty=1.5))
            b = core.schedule()
            self.assertEqual(list(b.stream_ids), [plain, pen])
            rows = b.rows(b.do_sample == 1)
            self.assertEqual(rows.repetition_penalty.tolist(), [1.0, 1.5])
            self.assertEqual(rows.temperature.tolist(), [0.0, 0.5])
            self.assertEqual(rows.history_lens.tolist(), [0, 4])
            start = rows.history_starts[1]
            self.assertEqual(rows.history_tokens[start:start + 4].tolist(), [4, 5, 6, 7])
            names = {f.name for f in engine_core.step_batch_fields()
                     if f.group in (engine_core.GROUP_SAMPLE, engine_core.GROUP_PARAM)}
            self.assertEqual(set(vars(rows)), names)
            core.commit(np.array([9, 9], np.int32))
        finally:
            core.close()

    def test_prompt_rows_cross_the_abi_and_come_back_once(self):
        core = EngineCore(64, 4, 4, 64, 32, eos_token_ids=[])
        try:
            config = pb.GenerateConfigPB(max_new_tokens=2)
            config.prompt_logprobs.value = 2
            sid = core.enqueue([4, 5, 6, 7], config)
            b = core.schedule()
            self.assertEqual(b.prompt_targets.tolist(), [5, 6, 7, -1])  # the last one's next is sampled
            self.assertEqual(b.num_prompt_logprobs, 3)
            with self.assertRaises(EngineError):  # its prompt rows are missing
                core.commit(np.array([9], np.int32))
            lps = np.array([-1.5, -0.25, -3.0], np.float32)
            top_ids = np.array([[5, 1], [2, 6], [7, 3]], np.int32)
            top_lps = np.array([[-1.5, -2.0], [-0.1, -0.25], [-3.0, -4.0]], np.float32)
            core.commit(np.array([9], np.int32), prompt=engine_core.PromptRows(lps, top_ids, top_lps))
            b = core.schedule()
            self.assertEqual((b.num_prompt_logprobs, b.prompt_targets.tolist()), (0, [-1]))
            core.commit(np.array([8], np.int32))
            first = engine_core.decode_output(core.poll(sid, 0)[0])
            self.assertEqual(first.prompt_logprobs, lps.tolist())
            self.assertEqual(first.prompt_top_logprobs, [[(5, -1.5), (1, -2.0)], [(2, -0.10000000149011612), (6, -0.25)],
                                                         [(7, -3.0), (3, -4.0)]])
            later = engine_core.decode_output(core.poll(sid, 1)[0])
            self.assertIsNone(later.prompt_logprobs)
        finally:
            core.close()

    def test_enqueue_errors_name_their_field(self):
        core = EngineCore(64, 4, 4, 64, 32, vocab_size=100)
        try:
            with self.assertRaises(EngineError) as e:
                core.enqueue([1] * 40, pb.GenerateConfigPB(max_new_tokens=4))
            self.assertEqual((e.exception.code, e.exception.field), (511, "token_ids"))
            for bad in (100, -1):  # outside the model's vocabulary: refused, never run
                with self.assertRaises(EngineError) as e:
                    core.enqueue([1, bad], pb.GenerateConfigPB(max_new_tokens=4))
                self.assertEqual((e.exception.code, e.exception.field), (605, "token_ids"))
                self.assertIn("vocabulary [0, 100)", e.exception.message)
            core.enqueue([0, 99], pb.GenerateConfigPB(max_new_tokens=4))
        finally:
            core.close()


class DecodeOutputTest(unittest.TestCase):
    def test_alternatives_the_distribution_ruled_out_are_left_out(self):
        # Two tokens, k = 3; the second was forced (or a grammar allowed only it): its other
        # alternatives read -inf, which JSON cannot carry and which could not be sampled.
        a = pb.AuxInfoPB()
        a.top_token_ids.shape.extend([2, 3])
        a.top_token_ids.int32_data = np.array([5, 6, 7, 9, 1, 2], np.int32).tobytes()
        a.top_logprobs.shape.extend([2, 3])
        a.top_logprobs.fp32_data = np.array([-0.1, -2.5, -3.0, 0.0, -np.inf, -np.inf], np.float32).tobytes()
        top = engine_core._alternatives(a.top_token_ids, a.top_logprobs)
        self.assertEqual([[t for t, _ in row] for row in top], [[5, 6, 7], [9]])
        self.assertAlmostEqual(top[0][1][1], -2.5)


if __name__ == "__main__":
    unittest.main()
