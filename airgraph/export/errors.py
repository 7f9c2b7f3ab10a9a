"""Errors of an export, importable without torch (the runner and the CLI's ``run`` use them)."""

from __future__ import annotations

__all__ = ["ExportError", "ExportPathError"]


class ExportError(RuntimeError):
    """The model cannot be exported as one ONNX graph.

    ``reason`` says why, one of:

    - ``"graph break"``: Dynamo could not capture the model as one graph (unsupported Python, an explicit
      ``torch._dynamo.graph_break()``, a call Dynamo cannot trace);
    - ``"data-dependent control flow"``: a Python branch on a tensor's value (``if x.sum() > 0:``);
    - ``"data-dependent shape"``: a shape or guard that depends on tensor values;
    - ``"unsupported op"``: the captured graph holds an op the ONNX exporter cannot lower (``op`` names it);
    - ``"capture failed"`` / ``"conversion failed"``: any other failure of ``torch.export`` / ``torch.onnx``;
    - ``"invalid argument"``: a bad argument of ``dynamo_export``.

    ``source`` is ``"file:line"`` of the user's code that caused it, when known. The message says all of
    this, and the torch exception is chained as ``__cause__``.
    """

    def __init__(self, reason: str, detail: str, *, source: str | None = None, op: str | None = None) -> None:
        self.reason = reason
        self.detail = detail
        self.source = source
        self.op = op
        where = f" at {source}" if source else ""
        what = f" {op}" if op else ""
        super().__init__(f"dynamo_export: {reason}{what}{where}: {detail}")


class ExportPathError(ExportError, ValueError):
    """An export path, target file or export name that is refused (a symbolic link, a path in a name, ...)."""

    def __init__(self, detail: str) -> None:
        super().__init__("refused path", detail)
