"""Server flags as the launcher parses them: every flag and its upper-case environment twin,
the defaults, flags winning over the environment, bad values rejected naming the flag, and
the flags a child process is given. Through parse_server_config and ServerConfig only (not
through where the parallel settings live)."""

import contextlib
import io
import os
import tempfile
import typing
import unittest
from dataclasses import fields
from unittest import mock

from rtp_llm.config import server_config
from rtp_llm.config.server_config import ServerConfig, default_frontend_server_count, parse_server_config

NAMES = [f.name for f in fields(ServerConfig)]
# Values that validate only with another flag set too: field -> (value, the other flags).
NEEDS = {"world_rank": (1, {"tp_size": 2}), "reasoning_parser": ("qwen3", {}), "tool_call_parser": ("hermes", {}),
         "sp_type": ("ngram", {}), "quantization": ("int8", {}),
         "load_format": ("dummy", {}), "kv_cache_dtype": ("fp8", {"device": "cuda"}),
         "sp_checkpoint_path": (None, {"sp_type": "vanilla"}), "role_type": ("DECODE", {}),
         "remote_rpc_server_ip": ("10.0.0.2:30001", {"role_type": "PREFILL"})}  # (None: the checkpoint, a path that exists)


def _kind(name):
    """The type a flag's value has: the field's annotation, Optional[...] unwrapped."""
    hint = typing.get_type_hints(ServerConfig)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _other_value(name, checkpoint):
    """A valid value of the flag that is not its default."""
    if name in ("checkpoint_path", "sp_checkpoint_path"):
        return checkpoint
    if name in NEEDS:
        return NEEDS[name][0]
    default, kind = getattr(ServerConfig(), name), _kind(name)
    if kind is bool:
        return not default
    if kind is int:
        return (default or 0) + 1
    if kind is float:
        return default + 1.5
    return f"{default or name}-x"


@contextlib.contextmanager
def _environment(**values):
    """os.environ without any flag's twin, plus `values` (upper-cased names)."""
    with mock.patch.dict(os.environ):
        for name in NAMES:
            os.environ.pop(name.upper(), None)
        os.environ.update({k.upper(): str(v) for k, v in values.items()})
        yield


def _rejected(argv, **env):
    """argparse's message for argv under `env` (it exits with status 2)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), _environment(**env):
        with unittest.TestCase().assertRaises(SystemExit) as cm:
            parse_server_config(argv)
    assert cm.exception.code == 2, cm.exception.code
    return err.getvalue()


class ServerConfigTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.ckpt = self.tmp.name

    def parse(self, *flags, **env):
        with _environment(**env):
            return parse_server_config(list(flags))

    def test_kv_cache_dtype_is_refused_by_name_where_no_attention_reads_it(self):
        self.assertEqual(self.parse(f"--checkpoint_path={self.ckpt}").kv_cache_dtype, "auto")
        for flags, words in ((["--kv_cache_dtype=fp8"], "--kv_cache_dtype=fp8 runs on --device=cuda only"),
                             (["--kv_cache_dtype=int4", "--device=cuda"], "--kv_cache_dtype must be one of")):
            with self.assertRaises(ValueError) as e:
                self.parse(f"--checkpoint_path={self.ckpt}", *flags).validate()
            self.assertIn(words, str(e.exception))

    def test_defaults(self):
        config = self.parse(f"--checkpoint_path={self.ckpt}")
        # Unset parallel sizes follow tp_size, the rendezvous port start_port.
        self.assertEqual(config, ServerConfig(checkpoint_path=self.ckpt, world_size=1, local_world_size=1,
                                              master_port=8088 + 3))
        self.assertEqual((config.start_port, config.frontend_server_count, config.concurrency_limit,
                          config.max_batch_size, config.reuse_cache, config.act_type, config.device, config.host,
                          config.stream_interval, config.paced_engine_step_ms),
                         (8088, default_frontend_server_count(), 1024, 32, True, "bf16", "cpu", "0.0.0.0", 1, 0.0))
        self.assertIsNone(config.max_seq_len)
        self.assertIsNone(config.max_num_batched_tokens)  # the device's (DeviceBackend)
        self.assertIsNone(config.api_key)
        self.assertEqual(config.rpc_address, "127.0.0.1:8089")
        self.assertEqual(config.local_ranks, range(0, 1))

    def test_the_default_frontend_count_is_half_the_usable_cpus_within_1_to_16(self):
        no_quota = mock.patch.object(server_config, "CGROUP_CPU_MAX", os.path.join(self.ckpt, "no-cpu.max"))
        for cpus, frontends in [(1, 1), (2, 1), (3, 1), (4, 2), (9, 4), (32, 16), (128, 16)]:
            with self.subTest(cpus), no_quota, mock.patch.object(os, "sched_getaffinity", return_value=set(range(cpus))):
                self.assertEqual(default_frontend_server_count(), frontends)
                self.assertEqual(self.parse(f"--checkpoint_path={self.ckpt}").frontend_server_count, frontends)
                # An explicit value wins, from the flag or its environment twin.
                self.assertEqual(self.parse(f"--checkpoint_path={self.ckpt}", "--frontend_server_count=7")
                                 .frontend_server_count, 7)
                self.assertEqual(self.parse(f"--checkpoint_path={self.ckpt}", frontend_server_count=5)
                                 .frontend_server_count, 5)

    def test_a_cgroup_cpu_quota_lowers_the_usable_cpus(self):
        cpu_max = os.path.join(self.ckpt, "cpu.max")
        for text, usable in [("400000 100000\n", 4), ("150000 100000\n", 1), ("50000 100000\n", 1),
                             ("max 100000\n", 32), ("garbage\n", 32)]:
            with open(cpu_max, "w") as f:
                f.write(text)
            with self.subTest(text), mock.patch.object(server_config, "CGROUP_CPU_MAX", cpu_max), \
                    mock.patch.object(os, "sched_getaffinity", return_value=set(range(32))):
                self.assertEqual(server_config.usable_cpus(), usable)
                self.assertEqual(default_frontend_server_count(), max(1, usable // 2))

    def test_pd_roles_are_checked_by_flag_name(self):
        c = self.parse(f"--checkpoint_path={self.ckpt}", "--role_type=PREFILL", "--remote_rpc_server_ip=10.0.0.2",
                       "--start_port=30000")
        self.assertEqual(c.pd().decode_address, "10.0.0.2:30001")  # upstream: "ip" takes the default port
        self.assertEqual(c.rpc_bind_address, "127.0.0.1:30001")
        c = self.parse(f"--checkpoint_path={self.ckpt}", "--role_type=PREFILL", "--remote_rpc_server_ip=host:7001")
        self.assertEqual(c.pd().decode_address, "host:7001")
        c = self.parse(f"--checkpoint_path={self.ckpt}", "--role_type=DECODE", "--start_port=30000")
        self.assertEqual(c.rpc_bind_address, "0.0.0.0:30001")  # its PREFILL instances call it
        self.assertEqual(c.pd().kv_transfer_port, 30005)
        for flags, error in [(["--role_type=BOTH"], "--role_type must be one of PDFUSION, PREFILL, DECODE"),
                             (["--role_type=PREFILL"], "--role_type=PREFILL needs --remote_rpc_server_ip"),
                             (["--remote_rpc_server_ip=h:1"], "--remote_rpc_server_ip is the PREFILL instance's flag"),
                             (["--role_type=PREFILL", "--remote_rpc_server_ip=h:x"],
                              "--remote_rpc_server_ip must be host:port or host"),
                             (["--role_type=DECODE", "--tp_size=2"], "--role_type=DECODE runs on one rank"),
                             (["--role_type=DECODE", "--reuse_cache=0"], "--role_type=DECODE needs --reuse_cache=1"),
                             (["--role_type=DECODE", "--sp_type=ngram"], "does not combine with speculative")]:
            with self.subTest(flags), self.assertRaisesRegex(ValueError, error):
                self.parse(f"--checkpoint_path={self.ckpt}", *flags)

    def test_an_upstream_flag_not_implemented_is_refused_by_name_with_what_instead(self):
        with self.assertRaisesRegex(ValueError, r"--decode_entrance is an upstream RTP-LLM flag \(pd_separation\) not "
                                                r"implemented.*--role_type"):
            self.parse(f"--checkpoint_path={self.ckpt}", "--decode_entrance=1")
        with self.assertRaisesRegex(ValueError, r"--sp_type=eagle \(an EAGLE-1/2 head\) is not implemented "
                                                r"yet; supported: ngram .*deterministic"):
            self.parse(f"--checkpoint_path={self.ckpt}", "--sp_type", "eagle")
        with self.assertRaisesRegex(ValueError, "--sp_checkpoint_path is the checkpoint of --sp_type=vanilla, "
                                                "eagle3 or mtp, not of --sp_type=ngram"):
            self.parse(f"--checkpoint_path={self.ckpt}", "--sp_type=ngram", f"--sp_checkpoint_path={self.ckpt}")
        with self.assertRaisesRegex(ValueError, "--sp_type=vanilla needs the draft model's checkpoint: "
                                                "--sp_checkpoint_path"):
            self.parse(f"--checkpoint_path={self.ckpt}", "--sp_type=vanilla")
        with self.assertRaisesRegex(ValueError, "--sp_checkpoint_path /no/such/dir does not exist"):
            self.parse(f"--checkpoint_path={self.ckpt}", "--sp_type=vanilla", "--sp_checkpoint_path=/no/such/dir")
        with self.assertRaisesRegex(ValueError, r"--sp_type=vanilla \(the draft model\) runs on one rank: it needs "
                                                r"--tp_size=1, got 2"):
            self.parse(f"--checkpoint_path={self.ckpt}", "--sp_type=vanilla", f"--sp_checkpoint_path={self.ckpt}",
                       "--tp_size=2")
        with self.assertRaisesRegex(ValueError, "--sp_type=eagle3 needs the EAGLE-3 head's checkpoint: "
                                                "--sp_checkpoint_path"):
            self.parse(f"--checkpoint_path={self.ckpt}", "--sp_type=eagle3")
        self.assertTrue(self.parse(f"--checkpoint_path={self.ckpt}", "--sp_type=mtp").speculative().core_config()[
            "draft_model"])  # (its layer is in the target's checkpoint)
        with self.assertRaisesRegex(ValueError, "--sp_act_type is an upstream RTP-LLM flag"):
            self.parse(f"--checkpoint_path={self.ckpt}", "--sp_act_type=bf16")
        with self.assertRaisesRegex(ValueError, r"--sp_type must be one of .* got 'medusa'"):
            self.parse(f"--checkpoint_path={self.ckpt}", "--sp_type=medusa")
        with self.assertRaisesRegex(ValueError, r"--sp_min_token_match \(4\) must be in \[1, --sp_max_token_match=3\]"):
            self.parse(f"--checkpoint_path={self.ckpt}", "--sp_type=ngram", "--sp_min_token_match=4")
        c = self.parse(f"--checkpoint_path={self.ckpt}", "--sp_type=deterministic", "--gen_num_per_cycle=7")
        self.assertEqual(c.speculative().core_config(),
                         {"gen_num_per_cycle": 7, "sp_min_token_match": 2, "sp_max_token_match": 3,
                          "draft_model": False, "sp_fixed_drafts": False})
        c = self.parse(f"--checkpoint_path={self.ckpt}", "--sp_type=ngram", "--sp_draft_pace=fixed")
        self.assertTrue(c.speculative().core_config()["sp_fixed_drafts"])
        with self.assertRaisesRegex(ValueError, r"--sp_draft_pace must be one of adaptive, fixed, got 'slow'"):
            self.parse(f"--checkpoint_path={self.ckpt}", "--sp_type=ngram", "--sp_draft_pace=slow")
        c = self.parse(f"--checkpoint_path={self.ckpt}", "--sp_type=vanilla", f"--sp_checkpoint_path={self.ckpt}",
                       "--sp_model_type=qwen_3")
        self.assertEqual((c.speculative().sp_checkpoint_path, c.speculative().sp_model_type), (self.ckpt, "qwen_3"))
        self.assertTrue(c.speculative().core_config()["draft_model"])
        with self.assertRaisesRegex(ValueError, "use --max_num_batched_tokens"):
            self.parse(f"--checkpoint_path={self.ckpt}", "--max_batch_tokens_size=4096")
        with self.assertRaises(SystemExit), mock.patch("sys.stderr"):  # a flag upstream does not have either
            self.parse(f"--checkpoint_path={self.ckpt}", "--no_such_flag=1")

    def test_no_flag_of_ours_is_in_the_upstream_refusals(self):
        from rtp_llm.config.upstream_flags import UPSTREAM_GROUPS

        refused = {n for _, names in UPSTREAM_GROUPS.values() for n in names}
        self.assertEqual(refused & set(NAMES), set())

    def test_an_unknown_reasoning_parser_is_refused_by_name(self):
        with self.assertRaisesRegex(ValueError, "--reasoning_parser must be one of deepseek_r1, qwen3"):
            self.parse(f"--checkpoint_path={self.ckpt}", "--reasoning_parser=qwen9")

    def test_every_flag_is_read_from_its_upper_case_environment_twin(self):
        for name in NAMES:
            with self.subTest(name):
                value = _other_value(name, self.ckpt)
                extra = NEEDS.get(name, (None, {}))[1]
                config = self.parse(**{"checkpoint_path": self.ckpt, **extra, name: value})
                self.assertEqual(getattr(config, name), value)
                self.assertEqual(type(getattr(config, name)), _kind(name))

    def test_every_flag_is_read_from_the_command_line(self):
        for name in NAMES:
            with self.subTest(name):
                value = _other_value(name, self.ckpt)
                extra = NEEDS.get(name, (None, {}))[1]
                flags = [f"--{k}={v}" for k, v in {"checkpoint_path": self.ckpt, **extra, name: value}.items()]
                self.assertEqual(getattr(self.parse(*flags), name), value)

    def test_a_flag_wins_over_its_environment_twin(self):
        other = tempfile.TemporaryDirectory()
        self.addCleanup(other.cleanup)
        config = self.parse(f"--checkpoint_path={self.ckpt}", "--start_port=9000", "--reuse_cache=1",
                            "--act_type=fp32", "--max_seq_len=128", checkpoint_path=other.name, start_port=7000,
                            reuse_cache="0", act_type="fp16", max_seq_len=64)
        self.assertEqual((config.checkpoint_path, config.start_port, config.reuse_cache, config.act_type,
                          config.max_seq_len), (self.ckpt, 9000, True, "fp32", 128))
        # Without the flags the environment applies.
        config = self.parse(checkpoint_path=other.name, start_port=7000, reuse_cache="0", max_seq_len=64)
        self.assertEqual((config.checkpoint_path, config.start_port, config.reuse_cache, config.max_seq_len),
                         (other.name, 7000, False, 64))

    def test_the_last_flag_wins(self):
        config = self.parse(f"--checkpoint_path={self.ckpt}", "--max_batch_size=4", "--max_batch_size=8")
        self.assertEqual(config.max_batch_size, 8)

    def test_booleans(self):
        for text, value in [("1", True), ("true", True), ("Yes", True), ("ON", True), ("0", False),
                            ("false", False), ("No", False), ("off", False)]:
            with self.subTest(text):
                self.assertIs(self.parse(f"--checkpoint_path={self.ckpt}", f"--cuda_graph={text}").cuda_graph, value)
                self.assertIs(self.parse(f"--checkpoint_path={self.ckpt}", cuda_graph=text).cuda_graph, value)

    def test_malformed_values_are_rejected_naming_the_flag(self):
        for flag, text in [("start_port", "abc"), ("max_seq_len", "1.5"), ("reuse_cache", "maybe"),
                           ("tp_size", ""), ("stream_interval", "2.5"), ("paced_engine_step_ms", "fast")]:
            with self.subTest(flag):
                message = _rejected([f"--checkpoint_path={self.ckpt}", f"--{flag}={text}"])
                self.assertIn(f"--{flag}", message)
                self.assertIn(repr(text), message)
        self.assertIn("--no_such_flag", _rejected([f"--checkpoint_path={self.ckpt}", "--no_such_flag=1"]))

    def test_malformed_environment_values_are_rejected_naming_the_flag(self):
        for name, text in [("START_PORT", "abc"), ("REUSE_CACHE", "maybe")]:
            with self.subTest(name):
                message = _rejected([f"--checkpoint_path={self.ckpt}"], **{name: text})
                self.assertIn(f"--{name.lower()}", message)
                self.assertIn(text, message)

    def test_out_of_range_values_are_rejected_naming_the_flag(self):
        ckpt = f"--checkpoint_path={self.ckpt}"
        cases = [
            ([], "--checkpoint_path"),
            ([f"--checkpoint_path={self.ckpt}/missing"], "--checkpoint_path"),
            ([ckpt, "--start_port=0"], "--start_port"),
            ([ckpt, "--start_port=65535"], "--start_port"),
            ([ckpt, "--frontend_server_count=0"], "--frontend_server_count"),
            ([ckpt, "--concurrency_limit=0"], "--concurrency_limit"),
            ([ckpt, "--max_body_size=0"], "--max_body_size"),
            ([ckpt, "--max_queue_size=-1"], "--max_queue_size"),
            ([ckpt, "--default_timeout_ms=-1"], "--default_timeout_ms"),
            ([ckpt, "--engine_stall_timeout_s=-1"], "--engine_stall_timeout_s"),
            ([ckpt, "--stream_interval=0"], "--stream_interval"),
            ([ckpt, "--max_num_batched_tokens=0"], "--max_num_batched_tokens"),
            ([ckpt, "--paced_engine_step_ms=-1"], "--paced_engine_step_ms"),
            ([ckpt, "--paced_engine_step_ms=nan"], "--paced_engine_step_ms"),
            ([ckpt, "--paced_engine_step_ms=inf"], "--paced_engine_step_ms"),
            ([ckpt, "--paced_engine_step_ms=2", "--tp_size=2"], "--paced_engine_step_ms"),
            ([ckpt, "--tp_size=0", "--world_size=1"], "--tp_size"),
            ([ckpt, "--tp_size=2", "--world_size=4"], "--world_size"),
            ([ckpt, "--tp_size=2", "--local_world_size=3"], "--local_world_size"),
            ([ckpt, "--tp_size=2", "--world_rank=2"], "--world_rank"),
        ]
        for flags, named in cases:
            with self.subTest(flags), self.assertRaises(ValueError) as cm:
                self.parse(*flags)
            self.assertIn(named, str(cm.exception))
        # The boundaries themselves are valid.
        self.assertEqual(self.parse(ckpt, "--start_port=65534").start_port, 65534)
        self.assertEqual(self.parse(ckpt, "--start_port=1", "--max_queue_size=0").start_port, 1)
        self.assertEqual(self.parse(ckpt, "--stream_interval=1", "--paced_engine_step_ms=0").stream_interval, 1)
        self.assertEqual(self.parse(ckpt, "--paced_engine_step_ms=0.25").paced_engine_step_ms, 0.25)
        self.assertEqual(self.parse(ckpt, "--max_num_batched_tokens=1").max_num_batched_tokens, 1)

    def test_a_node_starts_at_a_multiple_of_its_rank_count(self):
        flags = [f"--checkpoint_path={self.ckpt}", "--tp_size=4", "--world_size=4", "--local_world_size=2"]
        self.assertEqual(self.parse(*flags, "--world_rank=2").local_ranks, range(2, 4))
        config = self.parse(*flags, "--world_rank=1")
        with self.assertRaises(ValueError) as cm:
            config.local_ranks
        self.assertIn("--world_rank", str(cm.exception))

    def test_a_child_gets_the_same_config_from_its_flags_and_the_api_key_from_the_environment(self):
        config = self.parse(f"--checkpoint_path={self.ckpt}", "--tp_size=2", "--max_seq_len=512",
                            "--cuda_graph=0", api_key="s3cret")
        self.assertEqual(config.api_key, "s3cret")
        args = config.to_args()
        self.assertFalse([a for a in args if "s3cret" in a or a.startswith("--api_key")], args)
        self.assertIn("--cuda_graph=0", args)
        self.assertNotIn("--tokenizer_path", " ".join(args))  # unset (None) flags are left out
        self.assertEqual(self.parse(*args, api_key="s3cret"), config)


if __name__ == "__main__":
    unittest.main()
