"""What the tests of trainkit's C++ kernels share: a skip mark where no compiler builds them (the cache folder of
the test's own is tests/conftest.py's ``own_cache``, the process's ``shared_cache``)."""
import os
import shutil
from pathlib import Path

import pytest

needs_compiler = pytest.mark.skipif(shutil.which(os.environ.get("CXX") or "g++") is None,
                                    reason="no C++ compiler: the fused path cannot be built here")


def seeded_cache(folder: Path) -> Path:
    """`folder` as a new TRAINKIT_CACHE_DIR that already holds the kernels this test process built (copied, in a
    private folder as trainkit requires): a command run there loads them instead of building them again (3 s)."""
    from trainkit import kernels

    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path, _ = kernels.library()
    if path is not None:
        (folder / "kernels").mkdir(mode=0o700, exist_ok=True)
        for built in (Path(path), Path(path + ".sha256")):
            shutil.copy2(built, folder / "kernels" / built.name)
    return folder
