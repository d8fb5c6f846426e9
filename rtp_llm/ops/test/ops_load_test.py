import os
import subprocess
import sys
import tempfile
import unittest

import rtp_llm.ops as ops
from rtp_llm.cpp.model_rpc.proto import model_rpc_service_pb2, model_rpc_service_pb2_grpc


class EngineOpsLoadTest(unittest.TestCase):
    def test_loads_and_reports_abi_and_build_info(self):
        lib = ops.ensure_engine_ops_loaded()
        self.assertEqual(lib.rtp_llm_abi_version(), ops.ENGINE_ABI_VERSION)
        info = ops.engine_build_info()
        self.assertIn("service=RpcService", info)
        self.assertIs(ops.ensure_engine_ops_loaded(), lib)  # loaded once per process

    def test_missing_library_names_the_file_and_the_fix(self):
        # A fresh interpreter: the loaders cache per process.
        with tempfile.TemporaryDirectory() as empty:
            code = "from rtp_llm.ops import ensure_engine_ops_loaded; ensure_engine_ops_loaded()"
            env = dict(os.environ, RTP_LLM_LIBS_DIR=empty, PYTHONPATH=os.pathsep.join(sys.path))
            result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("NativeLibraryError: libth_transformer.so not found in " + empty, result.stderr)
        self.assertIn("RTP_LLM_LIBS_DIR", result.stderr)


class ModelRpcStubsTest(unittest.TestCase):
    def test_upstream_field_numbers(self):
        fields = model_rpc_service_pb2.GenerateInputPB.DESCRIPTOR.fields_by_name
        self.assertEqual(fields["request_id"].number, 1)
        self.assertEqual(fields["token_ids"].number, 2)
        self.assertEqual(fields["generate_config"].number, 4)
        config = model_rpc_service_pb2.GenerateConfigPB.DESCRIPTOR.fields_by_name
        self.assertEqual(config["max_new_tokens"].number, 1)
        self.assertEqual(config["stop_words_list"].number, 21)
        self.assertEqual(config["ignore_eos"].number, 43)
        aux = model_rpc_service_pb2.AuxInfoPB.DESCRIPTOR.fields_by_name
        self.assertEqual(aux["first_token_cost_time_us"].number, 12)
        self.assertEqual(aux["wait_time_us"].number, 14)

    def test_same_wire_bytes_as_the_cpp_stubs(self):
        # The bytes c_api_test.cc expects from the C++ stubs for the same message.
        msg = model_rpc_service_pb2.GenerateInputPB(request_id=7, token_ids=[5])
        msg.generate_config.max_new_tokens = 3
        self.assertEqual(msg.SerializeToString(), b"\x08\x07\x12\x01\x05\x22\x02\x08\x03")

    def test_grpc_stub_has_the_served_methods(self):
        stub_methods = [m for m in dir(model_rpc_service_pb2_grpc.RpcServiceServicer) if not m.startswith("_")]
        for method in ("GenerateStreamCall", "CheckHealth", "GetWorkerStatus", "GetCacheStatus"):
            self.assertIn(method, stub_methods)


if __name__ == "__main__":
    unittest.main()
