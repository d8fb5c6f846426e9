"""bench_serve's pieces without a model server: the workload, its split over client
processes, the percentiles, the client CPU summary and the /worker_status sampler (against a
local HTTP stub that counts tokens, and one without the route, as vLLM's server)."""

import http.server
import json
import os
import threading
import unittest
from argparse import Namespace

from rtp_llm.tools import bench_report, bench_serve
from rtp_llm.tools.bench_client import ShardReport
from rtp_llm.tools.bench_sampler import ServerSampler


def _args(**kw) -> Namespace:
    base = dict(base_url="http://x", endpoint="completions", model="m", num_prompts=10, input_len=7, output_len=5,
                range_ratio=0.0, concurrency=5, request_rate=3.0, timeout=60, seed=1, json_schema=None)
    return Namespace(**dict(base, **kw))


class _Status(http.server.BaseHTTPRequestHandler):
    generated = 0

    def do_GET(self):
        if self.path != "/worker_status":
            self.send_error(404)
            return
        _Status.generated += 10  # the engine generates between any two samples
        body = json.dumps({"running_query_len": 3, "waiting_query_len": 1, "generated_tokens": _Status.generated})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


class _Stub:
    def __enter__(self):
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Status)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class BenchServeTest(unittest.TestCase):
    def test_workload_is_exact_and_seeded(self):
        w = bench_serve.workload(_args())
        self.assertEqual(len(w), 10)
        self.assertTrue(all(len(p) == 7 and n == 5 for p, n in w))
        self.assertEqual(w, bench_serve.workload(_args()))
        self.assertEqual(len({tuple(p) for p, _ in w}), 10)  # distinct: no prefix-cache hits between them

    def test_shards_split_prompts_concurrency_and_rate(self):
        args = _args()
        requests = bench_serve.workload(args)
        shards = bench_serve.shards(args, requests, 3)
        self.assertEqual([s.concurrency for s in shards], [2, 2, 1])
        self.assertEqual(sorted(map(tuple, (p for s in shards for p, _ in s.requests))),
                         sorted(map(tuple, (p for p, _ in requests))))
        self.assertAlmostEqual(sum(s.request_rate for s in shards), 3.0)
        self.assertTrue(all(s.json_schema is None for s in shards))

    def test_json_schema_goes_to_every_shard(self):
        shards = bench_serve.shards(_args(json_schema="long"), bench_serve.workload(_args()), 2)
        self.assertTrue(all(s.json_schema == bench_serve.LONG_SCHEMA for s in shards))

    def test_default_client_procs(self):
        self.assertEqual(bench_serve.default_client_procs(1), 1)
        self.assertLessEqual(bench_serve.default_client_procs(100000), len(os.sched_getaffinity(0)))

    def test_percentiles_interpolate(self):
        p = bench_report.percentiles([0.001, 0.002, 0.003, 0.004, 0.005])
        self.assertAlmostEqual(p["p50"], 3.0)
        self.assertAlmostEqual(p["p90"], 4.6)
        self.assertEqual(bench_report.percentiles([]), {})

    def test_client_cpu_flags_a_saturated_process(self):
        calm = ShardReport(results=[], start=0.0, end=10.0, cpu_s=2.0)
        busy = ShardReport(results=[], start=0.0, end=10.0, cpu_s=9.0)
        c = bench_report.client_cpu([calm, busy], 10.0)
        self.assertAlmostEqual(c["cores_used"], 1.1)
        self.assertAlmostEqual(c["max_process_core_fraction"], 0.9)
        self.assertTrue(c["saturated"])
        self.assertFalse(bench_report.client_cpu([calm], 10.0)["saturated"])

    def test_sampler_reports_the_engine_tokens_over_the_window(self):
        with _Stub() as url:
            s = ServerSampler(url, interval=0.05)
            s.start()
            threading.Event().wait(0.3)
            s.stop()
        summary = s.summary()
        self.assertTrue(summary["available"])
        self.assertEqual(summary["generated_tokens_delta"], 10 * (summary["samples"] - 1))
        self.assertEqual(summary["running_streams_median"], 3)
        self.assertEqual(summary["in_engine_max"], 4)
        self.assertGreater(summary["engine_output_tok_s"], 0)

    def test_sampler_without_the_route_is_unavailable(self):
        with _Stub() as url:
            s = ServerSampler(url + "/v2")  # /v2/worker_status: 404, as a server without the route
            s.start()
            s.stop()
        summary = s.summary()
        self.assertFalse(summary["available"])
        self.assertIn("404", summary["reason"])


if __name__ == "__main__":
    unittest.main()
