"""Checks the built wheel: valid RECORD, pinned metadata, libraries with $ORIGIN rpaths."""

import base64
import csv
import hashlib
import io
import re
import subprocess
import sys
import tempfile
import unittest
import zipfile

WHEEL = None


def _sha256(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


class WheelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.zf = zipfile.ZipFile(WHEEL)
        cls.names = cls.zf.namelist()
        cls.dist_info = next(n.split("/")[0] for n in cls.names if n.endswith(".dist-info/WHEEL"))

    def read(self, name):
        return self.zf.read(name)

    def test_record_lists_every_file_with_its_hash(self):
        rows = list(csv.reader(io.StringIO(self.read(self.dist_info + "/RECORD").decode())))
        recorded = {row[0]: row for row in rows}
        self.assertEqual(set(recorded), set(self.names))
        for name, digest, size in rows:
            if name.endswith("/RECORD"):
                self.assertEqual((digest, size), ("", ""))
                continue
            data = self.read(name)
            self.assertEqual(digest, _sha256(data), name)
            self.assertEqual(int(size), len(data), name)

    def test_metadata_pins_torch_and_codegen_ranges(self):
        meta = self.read(self.dist_info + "/METADATA").decode()
        requires = re.findall(r"^Requires-Dist: (.*)$", meta, re.M)
        self.assertTrue(any(re.fullmatch(r"torch==\d+\.\d+\.\d+\S*", r) for r in requires), requires)
        self.assertTrue(any(r.startswith("grpcio>=") for r in requires), requires)
        self.assertTrue(any(r.startswith("protobuf>=") for r in requires), requires)
        wheel = self.read(self.dist_info + "/WHEEL").decode()
        self.assertIn("Root-Is-Purelib: false", wheel)

    def test_ships_package_stubs_and_libraries(self):
        for name in [
            "rtp_llm/__init__.py",
            "rtp_llm/ops/__init__.py",
            "rtp_llm/cpp/__init__.py",
            "rtp_llm/cpp/model_rpc/proto/__init__.py",
            "rtp_llm/cpp/model_rpc/proto/model_rpc_service_pb2.py",
            "rtp_llm/cpp/model_rpc/proto/model_rpc_service_pb2_grpc.py",
            "rtp_llm/libs/libth_transformer.so",
            "rtp_llm/libs/librtp_compute_ops.so",
        ]:
            self.assertIn(name, self.names)
        bundled = [n for n in self.names if re.search(r"rtp_llm/libs/libgrpc\+\+\.so", n)]
        self.assertTrue(bundled, "libgrpc++ is not bundled")

    def test_every_library_finds_its_neighbours_through_origin(self):
        libs = [n for n in self.names if n.startswith("rtp_llm/libs/") and ".so" in n]
        with tempfile.TemporaryDirectory() as tmp:
            for name in libs:
                path = self.zf.extract(name, tmp)
                dyn = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
                paths = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library (?:runpath|rpath): \[(.*)\]", dyn)
                self.assertTrue(paths and any(p.startswith("$ORIGIN") for p in paths[0].split(":")), "%s: %s" % (name, paths))
                self.assertNotIn("_solib", paths[0], name)  # no build-tree paths leak into the wheel


if __name__ == "__main__":
    WHEEL = sys.argv.pop(1)
    unittest.main()
