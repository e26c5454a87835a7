"""What the tests of trainkit's C++ kernels share: a skip mark where no compiler builds them (the cache folder of
the test's own is tests/conftest.py's ``own_cache``, the process's ``shared_cache``)."""
import os
import shutil

import pytest

needs_compiler = pytest.mark.skipif(shutil.which(os.environ.get("CXX") or "g++") is None,
                                    reason="no C++ compiler: the fused path cannot be built here")

