"""Count what autograd keeps for the backward pass (gradient checkpointing tests)."""

import torch


class SavedBytes:
    """Bytes of the tensors autograd saves for backward inside this counter's `with` blocks, summed
    over the blocks (`total`)."""

    def __init__(self):
        self.total = 0
        self._hooks = None

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.total += t.numel() * t.element_size()
        return t

    def __enter__(self) -> "SavedBytes":
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
