"""Upstream SGLang's calls into the fork (placed by the patch series).

``handle_fused_decode_backend`` runs in upstream's argument-resolution pipeline, before any
weight loads: it refuses an unserved setup with one error naming every reason, or, under
``auto``, logs the reasons and resolves the flag to ``off``. ``install_fused_decode`` runs in
``ModelRunner.initialize`` after the weights load and before the KV cache is sized, so the
fused path's derived weights and buffers are counted before KV sizing; it runs on the target
and on the MTP draft's runner alike. Where ``spec.draft_reasons`` names reasons, the draft
alone runs upstream's forward: they are logged at resolution and again at the draft's install.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

from sglang.srt.layers.fused_decode import spec

logger = logging.getLogger(__name__)

FLAG = "--fused-decode-backend"
_OTHER_KERNEL_FLAGS = {
    "enable_nvidia_megakernel": "--enable-nvidia-megakernel",
    "enable_amd_monokernel": "--enable-amd-monokernel",
}


def handle_fused_decode_backend(server_args: Any) -> None:
    from sglang.srt.arg_groups.model_override_base import model_config_of, resolving_view
    from sglang.srt.arg_groups.overrides import declare_resolution

    cfg = resolving_view(server_args)
    backend = cfg.fused_decode_backend
    if backend == spec.OFF:
        return
    setup = read_setup(cfg, model_config_of(server_args).hf_config)
    reasons = spec.refusal_reasons(backend, setup)
    if not reasons:
        logger.info("%s %s: serving %s", FLAG, backend, list(setup.architectures))
        if spec.unverified(backend):
            logger.warning("%s %s: this implementation has not run end to end through a server "
                           "yet (%s=1): validate its output (test/srt/e2e) before relying on it",
                           FLAG, backend, spec.UNVERIFIED_ENV)
        for reason in spec.draft_reasons(setup):
            logger.warning("%s %s: %s; the MTP draft runs upstream's forward", FLAG, backend,
                           reason)
        return
    if backend == spec.AUTO:
        for reason in reasons:
            logger.warning("%s auto: %s; decode runs upstream's path", FLAG, reason)
        declare_resolution(
            server_args, "handle_fused_decode_backend", fused_decode_backend=spec.OFF
        )
        return
    raise ValueError(f"{FLAG} {backend} cannot run this setup:\n  - " + "\n  - ".join(reasons))


def read_setup(cfg: Any, hf_config: Any) -> spec.Setup:
    """The plain facts spec judges, from upstream's resolving view and the HF config."""
    args = {name: getattr(cfg, name) for name in spec.SERVER_ARG_FIELDS}
    graphs = getattr(cfg.cuda_graph_config, "decode", None)
    if cfg.disable_cuda_graph:
        args["cuda_graph_backend_decode"] = "disabled"
    elif args.get("cuda_graph_backend_decode") is None and graphs is not None:
        args["cuda_graph_backend_decode"] = str(getattr(graphs, "backend", "full"))
    to_dict = getattr(hf_config, "to_dict", None)
    return spec.Setup(
        architectures=tuple(getattr(hf_config, "architectures", None) or ()),
        other_kernel_flags=tuple(
            flag for field, flag in _OTHER_KERNEL_FLAGS.items() if getattr(cfg, field)
        ),
        server_args=args,
        hf_config=to_dict() if to_dict else dict(vars(hf_config)),
        env={k: v for k, v in os.environ.items()
             if k in (spec.RAGGED_VERIFY_ENV, spec.CHECK_ENV, spec.UNVERIFIED_ENV)},
    )


def fused_decode_backend() -> str:
    """The resolved flag of this server; off where no server config is published (tools)."""
    from sglang.srt.runtime_context import get_context, get_exec

    if not get_context().is_config_namespace_published("exec"):
        return spec.OFF
    return get_exec().kernel.fused_decode_backend


def install_fused_decode(
    *, model: Any, hf_config: Any, capture_tail_hooks: list[Callable[..., None]], is_draft: bool
) -> None:
    """Build the fused path for this model before the KV cache is sized (no-op when off)."""
    backend = fused_decode_backend()
    if backend == spec.OFF:
        return
    if not spec.usable(backend, os.environ):
        # Resolution refuses every backend without kernels, so reaching here means a
        # resolution bypass: stop rather than serve a half-built path.
        raise RuntimeError(
            f"{FLAG} {backend}: no fused decode plan exists in this build for "
            f"{type(model).__name__} (draft={is_draft}); run with {FLAG} off"
        )
    from .glm5 import GlmMoeDsaForCausalLM, GlmMoeDsaForCausalLMNextN

    served = GlmMoeDsaForCausalLMNextN if is_draft else GlmMoeDsaForCausalLM
    if not isinstance(model, served):
        logger.info("%s: %s runs upstream's forward (no fused plan for it)", FLAG,
                    type(model).__name__)
        return
    from sglang.srt.arg_groups.model_override_base import resolved_view
    from sglang.srt.distributed import tensor_model_parallel_all_reduce
    from sglang.srt.distributed.parallel_state import (
        get_tensor_model_parallel_rank,
        get_tp_group,
    )
    from sglang.srt.model_executor.runner import get_is_capture_mode
    from sglang.srt.runtime_context import get_context

    args = resolved_view(get_context().server_args)
    rank = get_tensor_model_parallel_rank()
    if is_draft:
        # the same facts on every rank, so every rank skips or builds
        skip = spec.draft_reasons(read_setup(args, hf_config))
        if skip:
            if rank == 0:
                for reason in skip:
                    logger.warning("%s: %s; the MTP draft runs upstream's forward", FLAG, reason)
            return
    common = dict(context_len=args.context_length or hf_config.max_position_embeddings,
                  rank=rank, reduce=tensor_model_parallel_all_reduce,
                  is_capturing=lambda: bool(get_is_capture_mode()))
    reasons: list[str] = []
    try:
        if is_draft:
            build_draft_state(model, hf_config, **common)
        else:
            build_fused_state(model, hf_config, speculative_algorithm=args.speculative_algorithm,
                              draft_tokens=args.speculative_num_draft_tokens, **common)
    except (RuntimeError, ValueError) as e:
        reasons.append(f"rank {rank}: {e}")
    # every rank stops, naming every rank's reasons, or none does (no rank left waiting)
    every = gather_reasons(reasons, get_tp_group().cpu_group)
    if every:
        raise RuntimeError(f"{FLAG} {backend}: the fused path cannot be built:\n  - "
                           + "\n  - ".join(every))
    max_running = getattr(args, "max_running_requests", None)
    if rank == 0 and not is_draft and (max_running is None or max_running > spec.MAX_ROWS):
        logger.warning("%s: steps wider than %d rows run upstream's path while the fused "
                       "path's buffers keep their memory (--max-running-requests %s)",
                       FLAG, spec.MAX_ROWS, max_running)


def gather_reasons(reasons: list[str], group: Any) -> list[str]:
    """Every rank's reasons, on every rank (the TP group's CPU group)."""
    import torch.distributed as dist

    if group is None or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return list(reasons)
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, list(reasons), group=group)
    return [r for rank_reasons in gathered for r in rank_reasons]


def build_fused_state(model: Any, hf_config: Any, *, speculative_algorithm: Any,
                      draft_tokens: Any, context_len: int, rank: int,
                      reduce: Callable[[Any], Any], is_capturing: Callable[[], bool],
                      layer_cls: Any = None) -> Any:
    """Views of the loaded weights, the plan of every covered width, left on the model."""
    from sglang.srt.layers.fused_decode import plan as fused_plan
    from sglang.srt.layers.fused_decode.reference.config import Glm5Config

    from .adapt import model_weights
    from .glm5 import STATE_KEY, FusedState

    cfg = Glm5Config.from_dict(hf_config.to_dict())
    weights, reasons = model_weights(model, cfg)
    if getattr(model, "capture_aux_hidden_states", False):
        reasons.append("the model captures aux hidden states (EAGLE3): not served")
    if reasons:
        raise RuntimeError(f"{FLAG}: cannot build the fused path from the loaded weights:"
                           "\n  - " + "\n  - ".join(reasons))
    algo = getattr(speculative_algorithm, "name", speculative_algorithm)
    widths = spec.covered_widths(algo, draft_tokens)
    plan = fused_plan.build_plan(cfg, weights, widths, int(context_len) + spec.MAX_ROWS,
                                 layer_cls=layer_cls, rank=rank)
    state = FusedState(plan, weights, int(draft_tokens or 1), reduce, is_capturing, rank)
    model.__dict__[STATE_KEY] = state
    return state


def build_draft_state(model: Any, hf_config: Any, *, context_len: int, rank: int,
                      reduce: Callable[[Any], Any], is_capturing: Callable[[], bool],
                      layer_cls: Any = None) -> Any:
    """The MTP draft's fused state: views of its loaded weights and the plan of its one decoder
    layer for its draft-decode widths, left on the model. The draft's pool holds that layer at
    the decoder's own layer id (0); the plan keys it by the reference's ``num_hidden_layers``."""
    from sglang.srt.layers.fused_decode import plan as fused_plan
    from sglang.srt.layers.fused_decode.reference.config import Glm5Config

    from .adapt import draft_weights
    from .glm5 import STATE_KEY, FusedState

    cfg = Glm5Config.from_dict(hf_config.to_dict())
    mtp, reasons = draft_weights(model, cfg)
    if reasons:
        raise RuntimeError(f"{FLAG}: cannot build the fused MTP draft from the loaded weights:"
                           "\n  - " + "\n  - ".join(reasons))
    plan = fused_plan.build_plan(cfg, [mtp.layer], spec.draft_widths(),
                                 int(context_len) + spec.MAX_ROWS, layer_cls=layer_cls,
                                 rank=rank, role="MTP draft")
    layer = plan.layers[0]
    carry = None
    if getattr(layer, "buf", None) is not None:  # the top-k carried across draft iterations
        from sglang.srt.layers.fused_decode.carry import TopkCarry

        carry = TopkCarry(layer.buf["topk"], plan.max_context)
    state = FusedState(plan, [mtp.layer], 1, reduce, is_capturing, rank,
                       pool_ids={mtp.layer.layer_id: int(model.model.decoder.layer_id)},
                       draft=mtp, carry=carry)
    model.__dict__[STATE_KEY] = state
    return state
