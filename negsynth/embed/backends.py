"""An inference backend for a sentence-transformers encoder on CPU: OpenVINO.

Only the transformer backbone of ``model[0]`` is swapped for an exported ONNX graph that OpenVINO
runs; tokenisation, batching, pooling and normalisation stay sentence-transformers', so the vectors
differ from torch's by float rounding (``openvino``), or by more for ``openvino-bf16`` (bfloat16, on
CPUs with AVX512_BF16 or AMX). ``auto``: OpenVINO for a plain encoder on CPU when it is installed,
else torch. The backbone is exported with
``torch.onnx.export`` (sentence-transformers' own ``backend="onnx"`` needs optimum, which pins an
older transformers), once per weights and library versions, under ``$NEGSYNTH_CACHE_DIR/onnx``.
Only plain text encoders (MiniLM and models trained from it) are supported; anything else is a
one-line error.
"""

from __future__ import annotations

import hashlib
import logging
import os
import warnings
from pathlib import Path

from negsynth.errors import UserError

log = logging.getLogger(__name__)

BACKENDS = ("auto", "torch", "openvino", "openvino-bf16")
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def check_backend(backend: str) -> None:
    """Raise a one-line :class:`UserError` when ``backend`` is unknown or its runtime is missing."""
    if backend not in BACKENDS:
        raise UserError(f"backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if backend in ("torch", "auto"):
        return
    try:
        __import__("openvino")
        __import__("onnx")
    except ImportError:
        raise UserError(f"backend {backend!r} needs openvino and onnx; run: pip install 'negsynth[openvino]'") from None


def _fingerprint(hf_model) -> str:
    """Weights (a sample of each tensor, shapes) + torch/transformers versions: a retrained model
    or another exporter gets a fresh export."""
    import torch
    import transformers

    h = hashlib.sha256(f"{torch.__version__}|{transformers.__version__}|{type(hf_model).__name__}".encode())
    with torch.no_grad():
        for name, p in hf_model.state_dict().items():
            flat = p.detach().reshape(-1)
            h.update(f"{name}{tuple(p.shape)}".encode())
            h.update(flat[:: max(1, flat.numel() // 64)].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def export_onnx(st_model) -> Path:
    """The ONNX file of ``st_model[0]``'s backbone (exported once, then cached). Leaves the torch
    backbone in eval mode with eager attention."""
    import torch

    from negsynth.embed.hf import cache_dir

    class Backbone(torch.nn.Module):  # positional inputs -> last hidden state, as the exporter calls it
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *args):
            return self.m(**dict(zip(names, args))).last_hidden_state

    hf = _text_transformer(st_model).model
    names = [n for n in _INPUTS if n in st_model.preprocess(["a"])]
    folder = cache_dir() / "onnx" / _fingerprint(hf)
    fp32 = folder / "model.onnx"
    if not fp32.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        # eager attention exports to plain MatMul/Softmax ops every runtime fuses well (the torch
        # backbone is replaced by the exported graph afterwards: its settings need no restoring)
        if getattr(hf.config, "_attn_implementation", None) != "eager" and hasattr(hf, "set_attn_implementation"):
            hf.set_attn_implementation("eager")
        sample = st_model.preprocess(["a short text", "a somewhat longer text to pad the other one"])
        tmp = folder / f"model.{os.getpid()}.onnx.tmp"
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's warnings about shape-dependent branches (dynamic axes cover them)
            torch.onnx.export(
                Backbone(hf.eval()),
                tuple(sample[n].cpu() for n in names),
                str(tmp),
                input_names=names,
                output_names=["last_hidden_state"],
                dynamic_axes={n: {0: "batch", 1: "seq"} for n in [*names, "last_hidden_state"]},
                opset_version=17,
                dynamo=False,
            )
        os.replace(tmp, fp32)
        log.info("exported %s to %s", type(hf).__name__, fp32)
    return fp32


def _text_transformer(st_model):
    from sentence_transformers.base.modules.transformer import Transformer

    first = st_model[0]
    cfg = getattr(first, "modality_config", {}).get("text", {})
    if (
        not isinstance(first, Transformer)
        or cfg.get("method") != "forward"
        or cfg.get("method_output_name") not in ("last_hidden_state", ("last_hidden_state",), ["last_hidden_state"])
    ):
        raise UserError(
            f"backend openvino: the model's first module is {type(first).__name__} ({cfg}); only plain text encoders (e.g. MiniLM) are supported, use backend 'torch'"
        )
    if getattr(first.model.config, "is_decoder", False):
        raise UserError("backend openvino: decoder models are not supported; use backend 'torch'")
    # negsynth's own modules (ATA pooling, bidirectional attention) hook into the torch backbone
    own = [type(m).__name__ for m in list(st_model)[1:] if not type(m).__module__.startswith("sentence_transformers.")]
    if own:
        raise UserError(f"backend openvino: the model has module(s) {', '.join(own)} that need the torch backbone; use backend 'torch'")
    return first


def _runner(path: Path, backend: str, threads: int):
    """``feed dict -> last hidden state`` on OpenVINO."""
    import openvino as ov

    core = ov.Core()
    precision = "f32"
    if backend == "openvino-bf16":
        if "BF16" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
            raise UserError("backend 'openvino-bf16': this CPU has no bfloat16 instructions (AVX512_BF16 or AMX); use backend 'openvino'")
        precision = "bf16"
    compiled = core.compile_model(
        core.read_model(str(path)), "CPU", {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": precision}
    )
    return lambda feed: compiled(feed)[0]


def use_backend(st_model, backend: str, *, threads: int | None = None) -> str:
    """Swap ``st_model[0]``'s backbone for ``backend`` in place (``"torch"``: no change); returns the
    backend used. ``"auto"``: OpenVINO, when it is installed, for a plain encoder on CPU (the same
    nDCG@10 as torch to 4 decimals, faster: docs/benchmarks.md), else torch."""
    if backend == "auto":
        if str(st_model.device) != "cpu":
            return "torch"
        try:
            check_backend("openvino")  # installed
            _text_transformer(st_model)  # a plain encoder
        except UserError:
            return "torch"
        backend = "openvino"
    check_backend(backend)
    if backend == "torch":
        return backend
    import torch

    if str(st_model.device) != "cpu":
        raise UserError(f"backend {backend!r} runs on CPU; the model is on {st_model.device} (use backend 'torch' on a GPU)")
    tr = _text_transformer(st_model)
    path = export_onnx(st_model)
    run = _runner(path, backend, threads or torch.get_num_threads())
    names = tuple(n for n in _INPUTS if n in st_model.preprocess(["a"]))
    config = tr.model.config

    class OnnxBackbone(torch.nn.Module):
        """The backbone as an exported graph: same inputs, ``last_hidden_state`` out."""

        def __init__(self):
            super().__init__()
            self.config = config
            self.device = torch.device("cpu")

        def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, **_):
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
            out = run({n: given[n].cpu().numpy() for n in names})
            return {"last_hidden_state": torch.from_numpy(out)}

    tr.model = OnnxBackbone()
    log.info("encoder backbone on %s (%s)", backend, path)
    return backend
