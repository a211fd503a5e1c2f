# Research record (see research/README.md): runs against the current package (import path updated to eglcuda._bind).
echo "== vulkan libs"; ls /usr/lib/x86_64-linux-gnu/ 2>/dev/null | grep -i -E "vulkan|GLX_nvidia|nvidia-glcore|EGL_nvidia" ; ls /usr/local/nvidia/lib64 2>/dev/null | grep -i -E "vulkan|GLX|EGL" ; find / -name "nvidia_icd*.json" -o -name "libvulkan*" 2>/dev/null | grep -v proc | head
python3 - <<'PY'
import os
os.environ.setdefault("PYOPENGL_PLATFORM","egl")
import eglcuda
from eglcuda._bind.gl import current_extensions
d=eglcuda.Display.for_cuda_device(0)
c=d.create_context(); c.make_current()
ext=current_extensions()
print("GL ext:", sorted(e for e in ext if "semaphore" in e.lower() or "memory_object" in e.lower() or "sync" in e.lower()))
import ctypes
for name in ("libvulkan.so.1","libGLX_nvidia.so.0","libEGL_nvidia.so.0"):
    try:
        l=ctypes.CDLL(name)
        for sym in ("vk_icdGetInstanceProcAddr","vkGetInstanceProcAddr","vk_icdNegotiateLoaderICDInterfaceVersion"):
            print(name, sym, hasattr(l, sym))
    except OSError as e: print(name, "not loadable", e)
PY
