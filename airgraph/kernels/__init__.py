"""Static kernels (TorchAir's ``_aclnn_static_shape_kernel``): record the shapes a model really runs, build
a shape-specialized kernel for each, ship them as a package, install it into a kernel library, run them.

The flow, in the order the data goes:

- ``static.py``: ``StaticKernels``, made by the backend when ``config.static_kernels.enabled``: the seam's
  static_kernels step, a shape observer per compiled graph, the builder and the loader;
- ``records.py``: every operator at each new shape key, as JSON in TorchAir's layout (``static_kernel_outputs/``);
- ``shapes.py``: the concrete sizes of a dynamic-shape graph for one call (symbols bound from its arguments);
- ``build.py``: one segment compiled for one shape key by Inductor, as an AOTInductor package;
- ``package.py``: a package, one zip file of kernels with its manifest (keys, digests, versions, device) last;
- ``library.py``: installing (staged, renamed, indexed under a lock), listing, removing; one builder per kernel;
- ``machine.py``: what a kernel was built for, and whether this machine can run it;
- ``probe.py``: loading a package, first in a child process per environment (a crash kills only the child);
- ``dispatch.py``: the callable of a covered segment: per shape key a static kernel, else the dynamic kernel,
  compiled only when a key needs it;
- ``warm.py``: a Dynamo graph whose kernels are all installed runs them without AOTAutograd (warm start);
- ``node.py``: several processes on a node (``LOCAL_WORLD_SIZE``).

``package.py`` and ``library.py`` import no torch (``airgraph kernels install/list/remove`` run without it).
"""
