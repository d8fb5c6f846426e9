"""The serving path's capacity without a GPU: starts the server on the benchmark-only paced
engine (--paced_engine_step_ms: no model runs, every step takes that long and yields one token
per stream), drives it with bench_serve at each --output_lens, and reports what the frontends
cost: their CPU per delivered token and the delivered tokens/s against the engine's.

Numbers from here measure the frontends, gRPC, detokenization and SSE, never a model.

    python -m rtp_llm.tools.bench_frontend --checkpoint_path=DIR [--output_lens 256,2048] \\
        [--concurrency 256] [--step_ms 10] [--frontends 1] [--json_out r.jsonl]
"""

import argparse
import json
import signal
import subprocess
import sys
import tempfile
from typing import Dict, List

from rtp_llm.utils.procs import children, cpu_seconds
from rtp_llm.utils.util import wait_sever_done

def frontend_pids(launcher: int) -> List[int]:
    def is_frontend(pid):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"rtp_llm.start_frontend_server" in f.read()
    return [p for p in children(launcher) if is_frontend(p)]


def start(args, max_out: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rtp_llm.start_server", f"--checkpoint_path={args.checkpoint_path}",
           f"--start_port={args.port}", f"--paced_engine_step_ms={args.step_ms}",
           f"--frontend_server_count={args.frontends}", f"--max_batch_size={args.concurrency}",
           f"--max_seq_len={args.input_len + max_out + 16}", f"--concurrency_limit={4 * args.concurrency}"]
    proc = subprocess.Popen(cmd)
    if not wait_sever_done(proc, args.port, timeout=300):
        proc.kill()
        raise SystemExit(f"bench_frontend: the server was not healthy within 300 s (exit code {proc.poll()})")
    return proc


def measure(args, proc: subprocess.Popen, output_len: int) -> Dict:
    fronts = frontend_pids(proc.pid)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        before = sum(cpu_seconds(p) for p in fronts)
        subprocess.run([sys.executable, "-m", "rtp_llm.tools.bench_serve", f"--base_url=http://127.0.0.1:{args.port}",
                        f"--num_prompts={args.num_prompts}", f"--concurrency={args.concurrency}",
                        f"--input_len={args.input_len}", f"--output_len={output_len}", f"--json_out={out.name}"],
                       check=True, stdout=subprocess.DEVNULL)
        used = sum(cpu_seconds(p) for p in fronts) - before
        report = json.load(open(out.name))
    tokens = max(report["output_tokens"], 1)
    return {"output_len": output_len, "concurrency": args.concurrency, "frontends": args.frontends,
            "step_ms": args.step_ms, "failed": report["failed"],
            "delivered_tok_s": report["output_token_throughput"],
            "engine_tok_s": report["server"].get("engine_output_tok_s"),
            "frontend_cpu_us_per_token": used / tokens * 1e6,
            "frontend_cores": used / report["duration_s"], "itl_ms": report["itl_ms"],
            "tokens_per_chunk": report["tokens_per_chunk"], "client_cores": report["client_cpu"]["cores_used"]}


def main(argv=None) -> List[Dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint_path", required=True, help="its config and tokenizer (no weights are loaded)")
    p.add_argument("--output_lens", default="256,2048")
    p.add_argument("--input_len", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--num_prompts", type=int, default=0, help="default: the concurrency")
    p.add_argument("--step_ms", type=float, default=10.0, help="the paced engine's step time")
    p.add_argument("--frontends", type=int, default=1)
    p.add_argument("--port", type=int, default=31800)
    p.add_argument("--json_out")
    args = p.parse_args(argv)
    args.num_prompts = args.num_prompts or args.concurrency
    lens = [int(x) for x in args.output_lens.split(",")]
    proc = start(args, max(lens))
    rows = []
    try:
        for n in lens:
            rows.append(measure(args, proc, n))
            r = rows[-1]
            print(f"out {n:5d}  c={args.concurrency}  delivered {r['delivered_tok_s']:9.1f} tok/s  engine "
                  f"{r['engine_tok_s'] or 0:9.1f} tok/s  frontend CPU {r['frontend_cpu_us_per_token']:6.1f} us/token "
                  f"({r['frontend_cores']:.2f} cores)  ITL p50 {r['itl_ms']['p50']:.1f} ms p99 {r['itl_ms']['p99']:.1f}"
                  f"  tokens/chunk {r['tokens_per_chunk']:.2f}  client {r['client_cores']:.2f} cores  failed {r['failed']}",
                  flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    if args.json_out:
        with open(args.json_out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return rows


if __name__ == "__main__":
    main()
