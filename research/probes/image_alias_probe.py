# Research record (see research/README.md): runs against the current package (import paths updated to eglcuda._bind and eglcuda.frames).
"""Which EGLImage siblings share storage on this driver, and after which writes.

For a source texture made with glTexImage2D (mutable) or glTexStorage2D (immutable), an EGLImage
of it and a second texture bound to the image (glEGLImageTargetTexture2DOES), checks with random
texels: a GL write to the source seen by the alias, a GL write to the alias seen by the source,
and CUDA writes through CUDA-GL interop on either texture seen by the other. Prints one line per
case.

    python research/probes/image_alias_probe.py
"""
from __future__ import annotations

import os

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

import _needs  # noqa: E402  (research/probes/_needs.py: a missing need is one line and status 2)

_needs.answer_help(__doc__)
_needs.needs_cuda(__file__, "cuda", "cuda-egl", "gl")

import numpy as np  # noqa: E402
from OpenGL import GL  # noqa: E402

import eglcuda  # noqa: E402
from eglcuda.frames.frame import _copy_2d  # noqa: E402
from eglcuda._bind.gl import current_extensions  # noqa: E402
from eglcuda._bind._native import ffi, lib  # noqa: E402

W, H = 37, 11


def texture(immutable: bool, texels) -> int:
    name = int(GL.glGenTextures(1))
    GL.glBindTexture(GL.GL_TEXTURE_2D, name)
    GL.glTexParameteri(GL.GL_TEXTURE_2D, GL.GL_TEXTURE_MIN_FILTER, GL.GL_NEAREST)
    GL.glTexParameteri(GL.GL_TEXTURE_2D, GL.GL_TEXTURE_MAG_FILTER, GL.GL_NEAREST)
    GL.glPixelStorei(GL.GL_UNPACK_ALIGNMENT, 1)
    if immutable:
        GL.glTexStorage2D(GL.GL_TEXTURE_2D, 1, GL.GL_RGBA8, W, H)
        GL.glTexSubImage2D(GL.GL_TEXTURE_2D, 0, 0, 0, W, H, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, texels)
    else:
        GL.glTexImage2D(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA8, W, H, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, texels)
    return name


def write(name: int, texels) -> None:
    GL.glBindTexture(GL.GL_TEXTURE_2D, name)
    GL.glPixelStorei(GL.GL_UNPACK_ALIGNMENT, 1)
    GL.glTexSubImage2D(GL.GL_TEXTURE_2D, 0, 0, 0, W, H, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, texels)
    GL.glFinish()


def read(name: int) -> np.ndarray:
    out = np.empty((H, W, 4), np.uint8)
    GL.glBindTexture(GL.GL_TEXTURE_2D, name)
    GL.glPixelStorei(GL.GL_PACK_ALIGNMENT, 1)
    GL.glGetTexImage(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, out)
    return out


def cuda_write(device, name: int, texels) -> None:
    resource = ffi.new("CUgraphicsResource *")
    assert lib.cuGraphicsGLRegisterImage(resource, name, lib.GL_TEXTURE_2D, 0) == 0
    assert lib.cuGraphicsMapResources(1, resource, ffi.NULL) == 0
    array = ffi.new("CUarray *")
    assert lib.cuGraphicsSubResourceGetMappedArray(array, resource[0], 0, 0) == 0
    _copy_2d(device, 0, src=("host", texels, W * 4), dst=("array", int(ffi.cast("uintptr_t", array[0])), 0),
             width_bytes=W * 4, height=H)
    assert lib.cuGraphicsUnmapResources(1, resource, ffi.NULL) == 0
    lib.cuGraphicsUnregisterResource(resource[0])
    GL.glFinish()


def main() -> None:
    rng = np.random.default_rng()
    device = eglcuda.get_device(0)
    with eglcuda.Display.for_cuda_device(0) as display, display.create_context() as context:
        ext = sorted(e for e in current_extensions() if "EGL_image" in e or "EGL_image" in e.upper())
        print("GL extensions naming EGL_image:", ext)
        for immutable in (False, True):
            kind = "glTexStorage2D" if immutable else "glTexImage2D"
            first = rng.integers(0, 256, (H, W, 4), dtype=np.uint8)
            source = texture(immutable, first)
            image = eglcuda.Image(context, source)
            alias = image.bind_texture()
            print(f"[{kind}] alias sees source texels at bind: {np.array_equal(read(alias), first)}")
            for label, dst, check in (("GL write to source seen by alias", source, alias),
                                      ("GL write to alias seen by source", alias, source)):
                data = rng.integers(0, 256, (H, W, 4), dtype=np.uint8)
                write(dst, data)
                print(f"[{kind}] {label}: {np.array_equal(read(check), data)}")
            for label, dst, check in (("CUDA write to alias seen by source", alias, source),
                                      ("CUDA write to source seen by alias", source, alias),
                                      ("CUDA write to source seen by source", source, source)):
                data = rng.integers(0, 256, (H, W, 4), dtype=np.uint8)
                device.make_current()
                cuda_write(device, dst, data)
                print(f"[{kind}] {label}: {np.array_equal(read(check), data)}")
            image.close()
            GL.glDeleteTextures([alias, source])


if __name__ == "__main__":
    main()
