"""The compile cache's key digests the decomposition tables: the same in every process (no object addresses, no
hash-seeded set order, whatever else the process imported), or no second process ever hits."""

from __future__ import annotations

import os
import subprocess
import sys

DIGEST = "from airgraph.cache.keys import decomposition_digest; print(decomposition_digest())"


def digest_in_a_fresh_process(seed: str, first: str = "") -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", f"{first}\n{DIGEST}"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_digest_is_the_same_in_processes_with_other_hash_seeds_and_imports():
    digests = {
        digest_in_a_fresh_process("1"),
        digest_in_a_fresh_process("2", "import torch._inductor.compile_fx"),
        digest_in_a_fresh_process("3", "import torch._dynamo, airgraph.backend"),
    }
    assert len(digests) == 1, digests
