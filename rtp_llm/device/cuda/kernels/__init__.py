"""Triton kernels of the CUDA backend, one module per family: attention over the paged KV cache
(attention), small-batch projections (gemv), FP8 projections (fp8), GPTQ / AWQ integer weights
(wint; at 4 bits on the tensor cores, repacked: wint_mma), MoE's routing and routed
experts (moe), DeepSeek's latent attention (mla), row-wise ops (row_ops: RMSNorm, rotary, the
fused q/k norm + rotary + KV write, SiLU-and-mul, the KV write, overlap placeholders, grammar
bitmasks), and the launch helpers they share (launch: programmatic dependent launch). This
package is their one namespace (`from rtp_llm.device.cuda import kernels as K`)."""

from rtp_llm.device.cuda.kernels.attention import (  # noqa: F401
    EXTEND_BLOCK_M,
    DecodeWorkspace,
    decode_attention,
    decode_splits,
    extend_attention,
    extend_tiles,
)
from rtp_llm.device.cuda.kernels.fp8 import Fp8Linear, fp8_gate_up_silu, fp8_linear  # noqa: F401
from rtp_llm.device.cuda.kernels.fp8 import supports as fp8_supports  # noqa: F401
from rtp_llm.device.cuda.kernels.gemv import GEMV_MAX_ROWS, gemv, gemv_config, use_gemv  # noqa: F401
from rtp_llm.device.cuda.kernels.launch import launch_options, num_sms, pdl, pdl_enter  # noqa: F401
from rtp_llm.device.cuda.kernels.mla import (  # noqa: F401
    context_slots,
    decode_splits as mla_decode_splits,
    expands as mla_expands,
    mla_attention,
    mla_prefill,
    store_latent,
)
from rtp_llm.device.cuda.kernels.moe import moe  # noqa: F401
from rtp_llm.device.cuda.kernels.moe import route as moe_route  # noqa: F401
from rtp_llm.device.cuda.kernels.wint import IntLinear, wint_gate_up_silu, wint_linear  # noqa: F401
from rtp_llm.device.cuda.kernels.wint import supports as wint_supports  # noqa: F401
from rtp_llm.device.cuda.kernels.wint_mma import Int4Mma  # noqa: F401
from rtp_llm.device.cuda.kernels.wint_mma import gate_up_silu as int4_mma_gate_up_silu  # noqa: F401
from rtp_llm.device.cuda.kernels.wint_mma import linear as int4_mma_linear  # noqa: F401
from rtp_llm.device.cuda.kernels.wint_mma import pack as int4_mma_pack  # noqa: F401
from rtp_llm.device.cuda.kernels.wint_mma import supports as int4_mma_supports  # noqa: F401
from rtp_llm.device.cuda.kernels.row_ops import (  # noqa: F401
    apply_token_bitmask,
    qkv_to_cache,
    resolve_placeholders,
    rms_norm,
    rotary,
    silu_and_mul,
    store_kv,
    weighted_rms_norm,
)
