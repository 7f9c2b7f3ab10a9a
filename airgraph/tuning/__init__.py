"""Operator and subgraph tuning with a persistent bank (seed 002: AOE's OPAT, SGAT and knowledge bank).

    report = airgraph.tune(model, *example_inputs, mode="op")      # or mode="subgraph"
    print(report)                                                   # what changed; report.path: the seed's JSON

Later compiles, in any process, take the bank's choices through the seam (``chosen_by "tuning"``) without
measuring anything. Or, as TorchAir does it: ``config.tuning.mode = "op"`` and the first run of each compiled
graph tunes it, then it runs tuned.

The package reads in the order the data flows:

- candidates.py   what is tried (versioned sets), operators.py the tunable nodes and how a choice rewrites them,
                  linear.py the ``airgraph::tuned_linear`` op (prepacked weights, Inductor's GEMM template);
- measure.py      checking against the default's outputs, timing side by side through the device runtime;
                  turns.py: one measurement at a time per device, across processes (a file lock per device);
- tuner.py        a graph's first run: look up, build, measure (units.py: a segment, or its operators), choose,
                  re-lower, commit;
                  lowering.py applies the bank's choices when a segment is lowered;
- keys.py, env.py, bank.py   what an entry is keyed by, for which device and versions, and the locked bank files;
- source.py       the seam's tuning step (bank lookups); report.py the seed-format result files;
- api.py          ``airgraph.tune``.

``airgraph.tune`` (a function, lazily imported by ``airgraph/__init__.py``) is :func:`airgraph.tuning.api.tune`.
Importing this package imports no torch.
"""
