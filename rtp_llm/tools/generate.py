"""Generates text offline from the command line (the offline API in one call).

    python -m rtp_llm.tools.generate --checkpoint_path PATH --prompt "The capital of France is"
        [--model_type llama] [--max_new_tokens 32] [--temperature 0] [--act_type bf16]
"""

import argparse
import json
import sys


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint_path", required=True, help="HF checkpoint directory or .gguf file")
    p.add_argument("--model_type", default=None, help="qwen_3, qwen_2 or llama (default: from the checkpoint)")
    p.add_argument("--tokenizer_path", default=None)
    p.add_argument("--prompt", action="append", required=True, help="may be repeated: one batch")
    p.add_argument("--max_new_tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--act_type", default="bf16", choices=["bf16", "fp32", "fp16"])
    p.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    args = p.parse_args(argv)
    from rtp_llm.llm import LLM

    llm = LLM(args.checkpoint_path, model_type=args.model_type, tokenizer_path=args.tokenizer_path,
              act_type=args.act_type, max_seq_len=2048, kv_cache_mem_mb=512)
    outs = llm.generate(args.prompt, {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature})
    for out in outs:
        seq = out.outputs[0]
        if args.json:
            print(json.dumps({"prompt": out.prompt, "response": seq.text, "finish_reason": seq.finish_reason,
                              "aux_info": out.aux_info}))
        else:
            print(f"{out.prompt}{seq.text}")
    llm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
