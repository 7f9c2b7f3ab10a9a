"""The compile cache of one backend: looks a Dynamo graph up, loads its entry, writes it (the design: the
package's docstring, airgraph/cache/__init__.py)."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import pickle
from typing import Any

import torch

import airgraph
from airgraph.cache.folder import CacheFolder
from airgraph.cache.graph import dump_graph, load_graph
from airgraph.cache.keys import entry_key, key_facts
from airgraph.config import CompilerConfig

__all__ = ["CompileCache", "Loaded", "Lookup"]

PAYLOAD_VERSION = 1


@dataclasses.dataclass
class Lookup:
    """One Dynamo graph asked of the cache: its key, and its entry when there is one."""

    key: str
    model: str
    found: tuple[dict[str, Any], bytes] | None


@dataclasses.dataclass
class Loaded:
    """An entry loaded: the inference graph (its values fake tensors of ``fake_mode``), its example inputs, and
    AOTAutograd's facts about it."""

    gm: torch.fx.GraphModule
    example_inputs: list[Any]
    facts: dict[str, Any]
    fake_mode: Any


class CompileCache:
    """One backend's compile cache (module docstring); ``counts`` says what happened, per outcome."""

    def __init__(self, config: CompilerConfig) -> None:
        root = config.resolved_cache_dir()
        if root is None:
            raise ValueError("the compile cache is off (config.compile_cache = False)")
        self.folder = CacheFolder(root, config.trusted_folders)
        self.root = self.folder.root
        self.config = config
        self.counts: collections.Counter[str] = collections.Counter()

    def __repr__(self) -> str:
        return f"CompileCache({str(self.root)!r})"

    def lookup(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Lookup | None:
        """The Dynamo graph's entry, or where it goes; None when the graph has none (module docstring)."""
        devices = {v.device for v in example_inputs if isinstance(v, torch.Tensor)}
        if len(devices) > 1 or self.config.tuning.mode is not None or torch._C._is_any_autocast_enabled():
            return self._skip("not_cacheable")  # autocast: AOTAutograd's wrapper turns it off around the graph
        if torch.is_grad_enabled() and any(getattr(v, "requires_grad", False) for v in example_inputs):
            return self._skip("training")
        device = next(iter(devices)) if devices else torch.device("cpu")
        facts = key_facts(gm, example_inputs, self.config, device)
        if facts is None:
            return self._skip("dynamic")
        key = entry_key(facts)
        return Lookup(key, _model_name(), self.folder.read(key))

    def _skip(self, why: str) -> None:
        self.counts[why] += 1
        return None

    def load(self, lookup: Lookup, example_inputs: list[Any]) -> Loaded | None:
        """``lookup``'s entry as a graph to compile, for this call's (real) inputs; None, with one warning, when it
        cannot be loaded (the caller compiles, and writes it again)."""
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        assert lookup.found is not None
        _, payload = lookup.found
        try:
            document = pickle.loads(payload)
            if document.get("payload_version") != PAYLOAD_VERSION:
                raise ValueError(f"payload version {document.get('payload_version')!r}")
            fake_mode = FakeTensorMode(shape_env=ShapeEnv())  # Inductor's FX graph cache wants one
            gm = load_graph(document["graph"], fake_mode)
            facts = document["aot"]
            placeholders = gm.graph.find_nodes(op="placeholder")
            if len(placeholders) != len(example_inputs) or facts["num_inputs"] != len(example_inputs):
                raise ValueError(f"{len(placeholders)} graph inputs for {len(example_inputs)} inputs")
        except Exception as exc:  # a payload that does not load is refused like a torn file
            self.folder.refuse(lookup.key, f"its graph does not load ({type(exc).__name__}: {exc})")
            self.counts["refused"] += 1
            return None
        with torch.no_grad():  # AOTAutograd's inference inputs: detached fakes of the call's tensors
            fakes = [fake_mode.from_tensor(v).detach() if isinstance(v, torch.Tensor) else v for v in example_inputs]
        self.counts["hit"] += 1
        return Loaded(gm, fakes, facts, fake_mode)

    def payload(self, gm: torch.fx.GraphModule, facts: dict[str, Any]) -> bytes:
        """An entry's payload: the inference graph as AOTAutograd and Inductor's passes left it, and ``facts``."""
        return pickle.dumps({"payload_version": PAYLOAD_VERSION, "graph": dump_graph(gm), "aot": facts}, protocol=5)

    def store(self, lookup: Lookup, payload: bytes, gm: torch.fx.GraphModule) -> bool:
        """Write ``lookup``'s entry; False when this process cannot write the folder (warned once)."""
        calls = [n for n in gm.graph.nodes if n.op == "call_function"]
        info = {
            "model": lookup.model,
            "mode": self.config.mode,
            "kernel_backend": self.config.kernel_backend,
            "device": _device_of(gm),
            "nodes": len(calls),
            "inputs": len(gm.graph.find_nodes(op="placeholder")),
            "torch": torch.__version__,
            "airgraph": airgraph.__version__,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        if not self.folder.store(lookup.key, payload, info):
            return False
        self.counts["stored"] += 1
        return True


def _device_of(gm: torch.fx.GraphModule) -> str:
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            return value.device.type
    return "cpu"


def _model_name() -> str:
    """What Dynamo is compiling, for listings: ``Class.method`` or the function's name ("?" when unknown)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        code = tx.f_code
        owner = tx.f_locals.get("self")
        prefix = f"{type(owner).__qualname__}." if owner is not None and hasattr(owner, code.co_name) else ""
        return f"{prefix}{code.co_name}"
    except Exception:
        return "?"
