"""FX helpers shared by every stage: node metadata (meta.py), analysis of aliasing and mutation (analysis.py),
the lowered program's vocabulary (program.py: segments, host work) and generated Python (codegen.py)."""
