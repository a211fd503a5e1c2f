# Type stub of the cffi module eglcuda._bind._native (built from build_ffi.py): cffi's FFI object
# and the compiled library of wrappers. Their members are the C declarations in csrc/, which
# mypy cannot see, hence Any.
from typing import Any

ffi: Any
lib: Any
