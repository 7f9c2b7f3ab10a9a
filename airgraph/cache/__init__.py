"""The compile cache: what a process compiled, for the next process with the same model, config and software.

One entry per Dynamo graph (cache/keys.py says what its key digests), holding what AOTAutograd made of it: the
inference graph after Inductor's graph passes (cache/graph.py) and AOTAutograd's facts about it
(lowering/aot.py ``snapshot``). A later process whose Dynamo graph has an entry skips AOTAutograd and Inductor's
graph passes; airgraph's passes, plan and partition run again on the stored graph (milliseconds; the tuning bank
and the kernel library are asked afresh), and each segment's kernels load from Inductor's FX graph cache, torch's
own layer. Inductor's CPU instruction-set checks are answered from a record too (cache/isa.py).

Covered: inference graphs (no autograd) with static shapes whose AOTAutograd runtime wrappers have nothing to do
(no input mutation left outside the graph, no aliased output: what most models' forward is); not with tuning
on (its first run re-lowers), nor when planning. Anything else compiles as before. Guards stay Dynamo's: a call
with other shapes or dtypes makes Dynamo trace again, and that graph has a key of its own. The design and
what each layer saves: docs/design/warm-start.md; the user's view: docs/compile-cache.md.

Modules: compile_cache.py (the backend's CompileCache), keys.py, graph.py, folder.py (the files; no torch),
isa.py; aot_package.py (``airgraph.cache_compile``: an AOTInductor package per input signature, loaded in later
processes without Dynamo) and aot_build.py (its export and compile). Importing the package imports nothing
(``airgraph cache`` lists without torch).
"""
