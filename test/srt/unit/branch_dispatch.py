"""A bare instance of a fork model class whose two forward paths are recorded: upstream's
forward (returns "upstream-out") and the fused step (returns the hidden "h", handed to a
logits processor stub that returns ("logits", hidden, head)). Shared by the target's and the
draft's dispatch tests."""

import torch


def bare(cls):
    """An instance of the model class with none of its modules (no weights to build)."""
    model = cls.__new__(cls)
    torch.nn.Module.__init__(model)
    return model


def recorded_model(monkeypatch, fork_cls, upstream_cls):
    """(model, calls): calls gets ("upstream", args) or ("fused", mode) per forward."""
    calls = []
    monkeypatch.setattr(upstream_cls, "forward",
                        lambda self, *a: calls.append(("upstream", a)) or "upstream-out")
    monkeypatch.setattr(fork_cls, "_fused_forward",
                        lambda self, state, mode, *a: calls.append(("fused", mode)) or "h")
    model = bare(fork_cls)
    model.lm_head = "head"
    model.logits_processor = lambda ids, hidden, head, fb: ("logits", hidden, head)
    return model, calls
