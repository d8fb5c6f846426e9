"""Prefill/decode disaggregation: moving KV cache blocks between engine processes."""
