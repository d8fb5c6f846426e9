"""model_loader.gguf_file against gguf-py's GGUFReader on a file gguf-py wrote: every value
type (scalars, strings, arrays of numbers and of strings), tensors of element and block types;
and files it must refuse."""

import os
import tempfile
import unittest

import gguf
import numpy as np

from rtp_llm.model_loader.gguf_file import GGUFFile


def _write(path: str):
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint8("t.u8", 7)
    w.add_int16("t.i16", -3)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int64("t.i64", -(2 ** 40))
    w.add_uint64("t.u64", 2 ** 63)
    w.add_float32("t.f32", 0.25)
    w.add_float64("t.f64", 1e-300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.5])
    w.add_token_list(["<s>", "a", "", "ü" * 40])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 64)).astype(np.float16))
    q = rng.standard_normal((4, 64)).astype(np.float32)
    w.add_tensor("q8_0", gguf.quants.quantize(q, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("i32", np.arange(6, dtype=np.int32).reshape(2, 3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


class GGUFFileTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        cls.path = os.path.join(cls.dir, "t.gguf")
        _write(cls.path)

    def test_fields_equal_gguf_py(self):
        ours, theirs = GGUFFile(self.path), gguf.GGUFReader(self.path)
        want = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
        self.assertEqual(set(ours.fields), set(want))
        for key, value in want.items():
            if isinstance(value, float):
                self.assertAlmostEqual(ours.fields[key], value, msg=key)
            else:
                self.assertEqual(ours.fields[key], value, key)
        self.assertEqual(ours.fields["tokenizer.ggml.tokens"], ["<s>", "a", "", "ü" * 40])
        self.assertEqual(ours.fields["t.u64"], 2 ** 63)

    def test_tensors_are_gguf_py_views(self):
        ours, theirs = GGUFFile(self.path), gguf.GGUFReader(self.path)
        self.assertEqual([t.name for t in ours.tensors], [t.name for t in theirs.tensors])
        for a, b in zip(ours.tensors, theirs.tensors):
            self.assertEqual(a.tensor_type, b.tensor_type, a.name)
            self.assertEqual(a.shape, tuple(int(d) for d in b.shape), a.name)
            self.assertEqual(a.n_bytes, int(b.n_bytes), a.name)
            self.assertEqual((a.data.dtype, a.data.shape), (b.data.dtype, b.data.shape), a.name)
            np.testing.assert_array_equal(a.data.view(np.uint8), b.data.view(np.uint8), a.name)
            self.assertFalse(a.data.flags.writeable, a.name)
        q8 = next(t for t in ours.tensors if t.name == "q8_0")
        self.assertEqual(gguf.quants.dequantize(q8.data, q8.tensor_type).shape, (4, 64))

    def test_refuses_what_is_not_gguf(self):
        with open(self.path, "rb") as f:
            good = f.read()
        cases = {"magic": b"GGUX" + good[4:], "version": good[:4] + (9).to_bytes(4, "little") + good[8:],
                 "truncated header": good[:200], "truncated data": good[:-40]}
        for what, data in cases.items():
            bad = os.path.join(self.dir, "bad.gguf")
            with open(bad, "wb") as f:
                f.write(data)
            with self.assertRaises(ValueError, msg=what):
                GGUFFile(bad)


if __name__ == "__main__":
    unittest.main()
