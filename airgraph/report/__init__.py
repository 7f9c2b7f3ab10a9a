"""What a compilation did, as data and as tables (``airgraph.explain`` and ``airgraph inspect``).

- schema.py: the report dataclasses every stage fills (graphs, passes, segments with their kernel backend and
  who chose it, nodes with stream and placement); plain data, re-exported here;
- explain.py: ``airgraph.explain`` and ``airgraph.plan`` (compile, run once, return the report);
- fake.py: faking real inputs and module state onto a device you do not have (planning);
- render.py: rich tables for ``airgraph inspect``.

(A package named ``explain`` would shadow the function ``airgraph.explain`` once imported.)
"""

from airgraph.report.schema import ExplainReport, GraphReport, NodeReport, PassReport, SegmentReport

__all__ = ["ExplainReport", "GraphReport", "NodeReport", "PassReport", "SegmentReport"]
