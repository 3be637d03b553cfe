import sys

import pytest

from adapters.runtime import tune_allocator


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")
def test_glibc_accepts_the_allocator_settings():
    assert tune_allocator() is True
