# The shim tests' session build (shim, fake driver, test programs; under a file lock):
# a test that needs the shim takes ``built``, and a build that fails fails it.
from tests.shim.conftest import built  # noqa: F401 (fixture)
