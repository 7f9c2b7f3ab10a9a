"""Writes one compile-cache entry over and over (tests/cache/test_folder.py: two of these at once).

    python tests/cache/writer.py ROOT KEY TAG TIMES SIZE

Each write's payload is SIZE bytes of the byte TAG (an int), through CacheFolder.write (airgraph/cache/folder.py).
"""

from __future__ import annotations

import sys

from airgraph.cache.folder import CacheFolder

if __name__ == "__main__":
    root, key, tag, times, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    folder = CacheFolder(root)
    for i in range(times):
        folder.write(key, bytes([tag]) * size, {"model": f"writer {tag}", "round": i})
    print("done", flush=True)
