"""Prometheus histograms: bucket lines are cumulative with +Inf last, _count is the values seen,
and the engine's KV read histograms (bounds and counts from WorkerStatusPB) render by the same
rule."""

import unittest

from rtp_llm.cpp.model_rpc.proto import model_rpc_service_pb2 as pb
from rtp_llm.frontend.metrics import Histogram, histogram_lines
from rtp_llm.frontend.status import kv_transfer_metrics


class HistogramTest(unittest.TestCase):
    def test_observed_values_land_in_their_le_bucket(self):
        h = Histogram("x_seconds", "x", buckets=(0.1, 1.0))
        for v in (0.05, 0.1, 0.5, 7.0):
            h.observe(v)
        self.assertEqual(h.render()[2:], ['x_seconds_bucket{le="0.1"} 2', 'x_seconds_bucket{le="1.0"} 3',
                                          'x_seconds_bucket{le="+Inf"} 4', "x_seconds_sum 7.65", "x_seconds_count 4"])

    def test_counts_must_be_one_more_than_bounds(self):
        with self.assertRaisesRegex(ValueError, "y: 2 bucket counts for 2 bounds"):
            histogram_lines("y", "y", [1, 2], [0, 1], 0)

    def test_kv_reads_render_from_the_engines_buckets(self):
        w = pb.WorkerStatusPB(kv_imports=4, kv_import_failures=1, kv_import_us=1500, kv_import_bytes=3 << 20,
                              kv_read_seconds_bounds=[0.001, 0.01], kv_read_seconds_counts=[2, 1, 0],
                              kv_read_bytes_bounds=[1 << 20], kv_read_bytes_counts=[1, 2])
        lines = kv_transfer_metrics(w)
        for want in ['rtp_llm_kv_transfer_seconds_bucket{le="0.01"} 3', "rtp_llm_kv_transfer_seconds_count 3",
                     "rtp_llm_kv_transfer_seconds_sum 0.0015", 'rtp_llm_kv_transfer_bytes_bucket{le="1048576.0"} 1',
                     "rtp_llm_kv_transfer_bytes_sum 3145728", "rtp_llm_kv_transfer_failures_total 1"]:
            self.assertIn(want, lines)


if __name__ == "__main__":
    unittest.main()
