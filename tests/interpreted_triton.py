"""The set-up the CUDA kernels' tests share (imported before anything imports triton): on a
machine without a GPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1), so their
indexing and masking are checked in CI too; on a GPU they run natively."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if INTERPRETED:
    # Triton 3.6's interpreter turns a loaded scalar (a 1-element array) into a loop bound with
    # int(array), which numpy >= 2.4 rejects; take the element instead.
    import triton.runtime.interpreter as _interp

    _patch_lang_tensor = _interp._patch_lang_tensor

    def _patch_with_scalar_index(tensor, scope):
        _patch_lang_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    if not getattr(_interp, "_rtp_llm_patched", False):
        _interp._patch_lang_tensor = _patch_with_scalar_index
        _interp._rtp_llm_patched = True

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16]


def skip_interpreted_bf16_dot(dtype):
    if INTERPRETED and dtype == torch.bfloat16:
        pytest.skip("Triton 3.6's interpreter computes bf16 tl.dot wrongly (off by ~1e10 on 16x16 "
                    "randn); bf16 products are checked on a GPU")
