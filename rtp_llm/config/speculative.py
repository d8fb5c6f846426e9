"""Speculative decoding's flags (upstream's names), declared once: ServerConfig carries them as
flags, EngineArgs as this object, the engine core gets gen_num_per_cycle and the n-gram sizes
(RTP_LLM_ENGINE_CONFIG). Built, for rows sampled from the logits alone, greedy or by rejection
sampling (rtp_llm/cpp/engine/scheduler.h, rtp_llm/models_py/rejection_sampler.py): prompt lookup
(`ngram`, upstream's `deterministic`), a separate draft model (`vanilla`:
async_decoder_engine/draft_model.py) and an EAGLE-3 head over the target's hidden states (`eagle3`:
async_decoder_engine/eagle_drafter.py), or DeepSeek-V3's multi-token-prediction layer driven the same
way (`mtp`: models_py/mtp.py); EAGLE-1/2 heads are refused by name at start-up."""

from dataclasses import dataclass

# sp_type -> what it is (the ones built)
SP_TYPES = {"ngram": "prompt lookup (n-grams of the stream's own tokens)",
            "deterministic": "upstream's name for prompt lookup",
            "vanilla": "a separate draft model of the same tokenizer (--sp_checkpoint_path)",
            "eagle3": "an EAGLE-3 head trained for the target (--sp_checkpoint_path)",
            "mtp": "the checkpoint's multi-token-prediction layer (DeepSeek-V3's)"}
# sp_type -> what it would need (upstream's and vLLM's kinds not built yet)
NOT_BUILT = {"eagle": "an EAGLE-1/2 head"}
SP_DRAFT_PACES = ("adaptive", "fixed")
# The kinds whose drafts come from a model run by the model runner (the core reserves their
# positions and the runner fills them): sp_type -> what --sp_checkpoint_path holds, and whether it
# is required (mtp's layer is in the target's checkpoint unless the flag names another).
CHECKPOINT_DRAFTERS = {"vanilla": ("the draft model", True), "eagle3": ("the EAGLE-3 head", True),
                       "mtp": ("the multi-token-prediction layer", False)}


@dataclass
class SpeculativeConfig:
    sp_type: str = ""              # "" (or "none"): off
    # Drafted tokens per stream per step. Upstream's default is 1 (for its model drafters); prompt
    # lookup's drafts cost one forward position each and are often right on repetitive text: 5
    # as vLLM's num_speculative_tokens examples.
    gen_num_per_cycle: int = 5
    # n-gram sizes looked up, longest first (upstream's flags; its defaults are 2 and 2: a 3-gram
    # match is tried first here, being the more specific context).
    sp_min_token_match: int = 2
    sp_max_token_match: int = 3
    # The draft model (sp_type vanilla): its checkpoint, and its model_type where config.json's
    # does not say (as --model_type for the target). Loaded as the target is (dtype, format, device).
    sp_checkpoint_path: str = ""
    sp_model_type: str = ""
    # How many a stream drafts each round (SP_DRAFT_PACES): "adaptive" follows its last rounds
    # (rtp_llm/cpp/engine/drafter.h, DraftPace: fewer rejected rows where a step is compute-bound);
    # "fixed" always gen_num_per_cycle (vLLM's and SGLang's way: where a step is bound by reading
    # the weights, batch 1 on a GPU, rejected rows cost little and longer rounds keep more).
    sp_draft_pace: str = "adaptive"

    @property
    def enabled(self) -> bool:
        return self.sp_type not in ("", "none")

    @property
    def draft_model(self) -> bool:
        """The drafts come from a separate model (loaded from sp_checkpoint_path)."""
        return self.sp_type == "vanilla"

    @property
    def eagle3(self) -> bool:
        """The drafts come from an EAGLE-3 head (loaded from sp_checkpoint_path) fed the target's
        hidden states."""
        return self.sp_type == "eagle3"

    @property
    def head(self) -> bool:
        """The drafts come from a head fed the target's hidden states (eagle_drafter.py): EAGLE-3 or MTP."""
        return self.sp_type in ("eagle3", "mtp")

    @property
    def runner_drafts(self) -> bool:
        """The model runner fills the drafted positions (a checkpoint drafter), not the core."""
        return self.sp_type in CHECKPOINT_DRAFTERS

    def validate(self) -> None:
        if not self.enabled:
            return
        built = ", ".join(f"{k} ({v})" for k, v in SP_TYPES.items())
        if self.sp_type in NOT_BUILT:
            raise ValueError(f"--sp_type={self.sp_type} ({NOT_BUILT[self.sp_type]}) is not implemented yet; "
                             f"supported: {built}")
        if self.sp_type not in SP_TYPES:
            raise ValueError(f"--sp_type must be one of {built} (or empty: off), got {self.sp_type!r}")
        what, required = CHECKPOINT_DRAFTERS.get(self.sp_type, ("", False))
        if required and not self.sp_checkpoint_path:
            raise ValueError(f"--sp_type={self.sp_type} needs {what}'s checkpoint: --sp_checkpoint_path")
        if self.sp_checkpoint_path and not self.runner_drafts:
            raise ValueError(f"--sp_checkpoint_path is the checkpoint of --sp_type=vanilla, eagle3 or mtp, not of "
                             f"--sp_type={self.sp_type}")
        if self.sp_draft_pace not in SP_DRAFT_PACES:
            raise ValueError(f"--sp_draft_pace must be one of {', '.join(SP_DRAFT_PACES)}, got {self.sp_draft_pace!r}")
        if self.gen_num_per_cycle < 1:
            raise ValueError(f"--gen_num_per_cycle must be >= 1, got {self.gen_num_per_cycle}")
        if not 1 <= self.sp_min_token_match <= self.sp_max_token_match:
            raise ValueError(f"--sp_min_token_match ({self.sp_min_token_match}) must be in [1, --sp_max_token_match="
                             f"{self.sp_max_token_match}]")

    def check_ranks(self, tp_size: int) -> None:
        """A checkpoint drafter runs on one rank (no tensor-parallel shards of it yet)."""
        if self.runner_drafts and tp_size != 1:
            raise ValueError(f"--sp_type={self.sp_type} ({CHECKPOINT_DRAFTERS[self.sp_type][0]}) runs on one rank: "
                             f"it needs --tp_size=1, got {tp_size}")

    def core_config(self) -> dict:
        """The engine core's fields (RTP_LLM_ENGINE_CONFIG): gen_num_per_cycle 0 turns drafting off."""
        return {"gen_num_per_cycle": self.gen_num_per_cycle if self.enabled else 0,
                "sp_min_token_match": self.sp_min_token_match, "sp_max_token_match": self.sp_max_token_match,
                "draft_model": self.runner_drafts, "sp_fixed_drafts": self.sp_draft_pace == "fixed"}
