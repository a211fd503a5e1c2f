"""The capability report behind ``python -m eglcuda info``: what this machine's EGL and CUDA
offer, and which of eglcuda's interop paths work here and why not. Never raises."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import _cuda, _loader
from ._display import Display, client_extensions, devices
from ._errors import EglCudaError

EXTENSION_GROUPS = {
    "device": ("EGL_EXT_device", "EGL_EXT_platform", "EGL_MESA_platform", "EGL_NV_device_cuda", "EGL_MESA_device"),
    "stream": ("_stream",),
    "image": ("_image",),
    "sync": ("_sync", "_fence", "cuda_event", "cl_event"),
    "context": ("_context", "_config"),
}

CUDA_EGL_ENTRY_POINTS = (
    "cuEGLStreamProducerConnect",
    "cuEGLStreamConsumerConnectWithFlags",
    "cuGraphicsEGLRegisterImage",
    "cuGraphicsResourceGetMappedEglFrame",
    "cuEventCreateFromEGLSync",
    "cuGraphicsGLRegisterImage",
)


def group_extensions(names) -> dict[str, list[str]]:
    """Sort extension names into the groups eglcuda cares about (plus "other")."""
    groups: dict[str, list[str]] = {key: [] for key in [*EXTENSION_GROUPS, "other"]}
    for name in sorted(names):
        for group, needles in EXTENSION_GROUPS.items():
            if any(needle in name for needle in needles):
                groups[group].append(name)
                break
        else:
            groups["other"].append(name)
    return groups


def _describe_display(display: Display) -> dict[str, Any]:
    return {
        "version": f"{display.version[0]}.{display.version[1]}",
        "vendor": display.vendor,
        "client_apis": sorted(display.client_apis),
        "extensions": group_extensions(display.extensions),
    }


@dataclass
class _Facts:
    """What the interop paths are judged against."""

    cuda_display_extensions: frozenset[str] | None  # None: no EGL display for a CUDA device
    cuda_display_name: str
    cuda_loaded: bool
    cuda_why: str
    integrated: bool | None
    image_choice: Any = None  # eglcuda.PathChoice from the EGLImage self-test, when it could run
    gl_wait: tuple[str, str] | None = None  # (path, why) of GL server waits on CUDA syncs, when probed

    def need_stream_ext(self, ext: str) -> str | None:
        if self.cuda_display_extensions is None:
            return f"no EGL display for a CUDA device ({self.cuda_display_name})"
        if ext not in self.cuda_display_extensions:
            return f"{ext} missing on {self.cuda_display_name}"
        return None

    def need_cuda(self, *entries: str) -> str | None:
        if not self.cuda_loaded:
            return self.cuda_why
        missing = [e for e in entries if not _loader.is_bound(e)]
        return f"libcuda does not export {', '.join(missing)}" if missing else None


@dataclass(frozen=True)
class InteropPath:
    """One way eglcuda moves data or synchronization between APIs."""

    name: str
    implemented: bool
    check: Callable[[_Facts], str | None]  # None when the platform has what the path needs


def _native_eglimage(facts: _Facts) -> str | None:
    why = facts.need_stream_ext("EGL_KHR_gl_texture_2D_image") or facts.need_cuda("cuGraphicsEGLRegisterImage")
    if why:
        return why
    choice = facts.image_choice
    if choice is not None and not choice.native_coherent:
        return f"self-test: {choice.reason}"
    if choice is None and facts.integrated is False:
        return ("discrete GPU: cuGraphicsEGLRegisterImage registers a GL-texture EGLImage but the mapped "
                "array does not alias the texture (measured on H100, driver 580)")
    return None


def _semaphore_wait(facts: _Facts) -> str | None:
    if facts.gl_wait is None:
        return facts.need_stream_ext("EGL_KHR_reusable_sync") or "not probed (no GL context on a CUDA display)"
    path, why = facts.gl_wait
    if path == "semaphore":
        return None
    if path == "egl":
        return f"not needed: {why}"
    return why


INTEROP_PATHS: list[InteropPath] = [
    InteropPath("EGLStream CUDA -> CUDA", True, lambda f: f.need_stream_ext("EGL_KHR_stream")
                or f.need_cuda("cuEGLStreamProducerConnect", "cuEGLStreamConsumerConnectWithFlags")),
    InteropPath("EGLStream FIFO mode", True, lambda f: f.need_stream_ext("EGL_KHR_stream_fifo")),
    InteropPath("EGLStream last-frame reuse control", True, lambda f: f.need_stream_ext("EGL_NV_stream_reset")),
    InteropPath("EGLStream across processes (fd over a UNIX socket)", True,
                lambda f: f.need_stream_ext("EGL_KHR_stream_cross_process_fd")),
    InteropPath("EGLStream frames in pinned host memory", True, lambda f: f.need_stream_ext("EGL_KHR_stream")
                or f.need_cuda("cuMemHostAlloc", "cuMemHostGetDevicePointer")),
    InteropPath("EGLStream frames in managed memory", True,
                lambda f: "eglcuda refuses them: cuEGLStreamProducerPresentFrame crashed the process on a managed "
                          "frame (H100/H200, driver 580); not verified on Tegra"),
    InteropPath("EGLStream CUDA -> GL texture", True,
                lambda f: f.need_stream_ext("EGL_KHR_stream_consumer_gltexture")),
    InteropPath("EGLStream GL surface -> CUDA", True,
                lambda f: f.need_stream_ext("EGL_KHR_stream_producer_eglsurface")),
    InteropPath("EGLImage GL texture -> CUDA (native)", True, _native_eglimage),
    InteropPath("EGLImage GL texture -> CUDA (GL interop)", True,
                lambda f: f.need_stream_ext("EGL_KHR_gl_texture_2D_image") or f.need_cuda("cuGraphicsGLRegisterImage")),
    InteropPath("EGLSync fence / reusable / server wait", True,
                lambda f: f.need_stream_ext("EGL_KHR_fence_sync") or f.need_stream_ext("EGL_KHR_reusable_sync")),
    InteropPath("CUDA event -> EGLSync (native)", True, lambda f: f.need_stream_ext("EGL_NV_cuda_event")),
    InteropPath("CUDA stream -> EGLSync (emulated)", True, lambda f: f.need_stream_ext("EGL_KHR_reusable_sync")
                or f.need_cuda("cuLaunchHostFunc")),
    InteropPath("CUDA stream -> GL server wait (timeline semaphore)", True, _semaphore_wait),
    InteropPath("EGLSync -> CUDA event (native)", True, lambda f: f.need_cuda("cuEventCreateFromEGLSync")),
    InteropPath("EGLSync -> CUDA stream (emulated)", True,
                lambda f: f.need_cuda("cuStreamWaitValue32", "cuMemHostAlloc", "cuMemHostGetDevicePointer")),
]


def _path_status(path: InteropPath, facts: _Facts) -> dict[str, str]:
    why = path.check(facts)
    if why:
        return {"path": path.name, "status": "unsupported", "why": why}
    if not path.implemented:
        return {"path": path.name, "status": "planned", "why": "the platform has what it needs; not in this eglcuda version"}
    return {"path": path.name, "status": "available", "why": ""}


def collect() -> dict[str, Any]:
    """The whole report as plain data (what ``--json`` prints)."""
    from . import __version__

    report: dict[str, Any] = {"eglcuda": __version__}
    egl_ok, egl_why = _loader.egl_available()
    egl: dict[str, Any] = {"library": _loader.EGL_LIBRARY, "loaded": egl_ok, "error": egl_why, "devices": []}
    report["egl"] = egl
    cuda_display_extensions = None
    cuda_display_name = "no EGL device reports a CUDA ordinal"
    if egl_ok:
        try:
            egl["client_extensions"] = sorted(client_extensions())
            found = devices()
        except EglCudaError as exc:
            egl["error"] = str(exc)
            found = []
        for device in found:
            entry: dict[str, Any] = {
                "index": device.index,
                "vendor": device.vendor,
                "cuda_ordinal": device.cuda_ordinal,
                "drm_node": device.drm_node,
                "render_node": device.render_node,
                "software": device.is_software,
                "extensions": sorted(device.extensions),
            }
            try:
                with Display.for_device(device) as display:
                    entry["display"] = _describe_display(display)
                    entry["vendor"] = entry["vendor"] or display.vendor
                    if device.cuda_ordinal == 0 or (device.cuda_ordinal is not None and cuda_display_extensions is None):
                        cuda_display_extensions = display.extensions
                        cuda_display_name = f"EGL device {device.index} (CUDA {device.cuda_ordinal})"
            except EglCudaError as exc:
                entry["display"] = {"error": str(exc)}
            egl["devices"].append(entry)
        if "EGL_MESA_platform_surfaceless" in egl.get("client_extensions", ()):
            try:
                with Display.surfaceless() as display:
                    egl["surfaceless"] = _describe_display(display)
            except EglCudaError as exc:
                egl["surfaceless"] = {"error": str(exc)}

    cuda_ok, cuda_why = _loader.cuda_available()
    cuda: dict[str, Any] = {"library": _loader.CUDA_LIBRARY, "loaded": cuda_ok, "error": cuda_why, "devices": []}
    report["cuda"] = cuda
    integrated = None
    if cuda_ok:
        try:
            version = _cuda.driver_version()
            cuda["driver_version"] = f"{version // 1000}.{version % 1000 // 10}"
            for ordinal in range(_cuda.device_count()):
                info = _cuda.get_device(ordinal).info
                cuda["devices"].append({
                    "ordinal": info.ordinal,
                    "name": info.name,
                    "compute_capability": f"{info.compute_capability[0]}.{info.compute_capability[1]}",
                    "integrated": info.integrated,
                    "total_memory_mib": info.total_memory // (1 << 20),
                })
            if cuda["devices"]:
                integrated = cuda["devices"][0]["integrated"]
        except EglCudaError as exc:
            cuda["error"] = str(exc)
            cuda_ok, cuda_why = False, str(exc)
        cuda["egl_entry_points"] = {name: _loader.is_bound(name) for name in CUDA_EGL_ENTRY_POINTS}

    image_choice = None
    if cuda_ok and cuda_display_extensions is not None and "EGL_KHR_gl_texture_2D_image" in cuda_display_extensions:
        image_choice = _image_choice()
        if isinstance(image_choice, str):
            report["eglimage"] = {"path": None, "native_coherent": None, "reason": image_choice}
            image_choice = None
        else:
            report["eglimage"] = {"path": image_choice.path, "native_coherent": image_choice.native_coherent,
                                  "reason": image_choice.reason}
    gl_wait = None
    if cuda_ok and cuda_display_extensions is not None and "EGL_KHR_reusable_sync" in cuda_display_extensions:
        gl_wait = _gl_wait_choice()
        report["gl_server_wait"] = {"path": gl_wait[0], "reason": gl_wait[1]}
    facts = _Facts(cuda_display_extensions, cuda_display_name, cuda_ok, cuda_why, integrated, image_choice, gl_wait)
    report["paths"] = [_path_status(path, facts) for path in INTEROP_PATHS]
    return report


def _image_choice():
    """The EGLImage path decision on CUDA device 0 (runs the coherence self-test), or why not."""
    from ._image import image_path

    try:
        with Display.for_cuda_device(0) as display:
            return image_path(display)
    except Exception as exc:  # the report never raises
        return f"self-test failed to run: {type(exc).__name__}: {exc}"


def _gl_wait_choice() -> tuple[str, str]:
    """How GL server waits on CUDA syncs work on CUDA device 0, probed in a fresh GL context."""
    from ._sync import SERVER_WAIT_CLIENT, gl_server_wait_path

    try:
        with Display.for_cuda_device(0) as display, display.create_context() as context:
            context.make_current()
            return gl_server_wait_path(display)
    except Exception as exc:  # the report never raises
        return SERVER_WAIT_CLIENT, f"probe failed to run: {type(exc).__name__}: {exc}"


def format_report(report: dict[str, Any]) -> str:
    """The report as text for a terminal."""
    lines = [f"eglcuda {report['eglcuda']}", ""]
    egl = report["egl"]
    lines.append(f"EGL library ({egl['library']}): {'found' if egl['loaded'] else 'NOT FOUND'}")
    if egl.get("error"):
        lines.append(f"  {egl['error']}")
    if egl.get("client_extensions"):
        lines.append(f"  client extensions: {' '.join(egl['client_extensions'])}")
    for device in egl["devices"]:
        cuda = "none" if device["cuda_ordinal"] is None else device["cuda_ordinal"]
        node = device["drm_node"] or device["render_node"] or "-"
        kind = ", software" if device["software"] else ""
        lines.append(f"  device {device['index']}: vendor {device['vendor'] or '?'}, CUDA ordinal {cuda}, DRM {node}{kind}")
        lines.extend(_format_display(device.get("display", {}), "    "))
    if "surfaceless" in egl:
        lines.append("  surfaceless display:")
        lines.extend(_format_display(egl["surfaceless"], "    "))
    lines.append("")
    cuda = report["cuda"]
    lines.append(f"CUDA driver ({cuda['library']}): {'found' if cuda['loaded'] else 'NOT FOUND'}")
    if cuda.get("error"):
        lines.append(f"  {cuda['error']}")
    if cuda.get("driver_version"):
        lines.append(f"  driver API version {cuda['driver_version']}")
    for device in cuda["devices"]:
        kind = "integrated" if device["integrated"] else "discrete"
        lines.append(f"  device {device['ordinal']}: {device['name']}, sm_{device['compute_capability'].replace('.', '')}, "
                     f"{device['total_memory_mib']} MiB, {kind}")
    if cuda.get("egl_entry_points"):
        have = [n for n, ok in cuda["egl_entry_points"].items() if ok]
        lack = [n for n, ok in cuda["egl_entry_points"].items() if not ok]
        lines.append(f"  EGL interop entry points: {', '.join(have) or 'none'}")
        if lack:
            lines.append(f"  missing: {', '.join(lack)}")
    if report.get("eglimage"):
        choice = report["eglimage"]
        lines.append(f"  EGLImage -> CUDA path: {choice['path'] or 'none'} ({choice['reason']})")
    if report.get("gl_server_wait"):
        wait = report["gl_server_wait"]
        lines.append(f"  GL server wait on CUDA syncs: {wait['path']} ({wait['reason']})")
    lines.append("")
    lines.append("Interop paths:")
    width = max(len(p["path"]) for p in report["paths"])
    for path in report["paths"]:
        status = path["status"] + (f" ({path['why']})" if path["why"] else "")
        lines.append(f"  {path['path']:<{width}}  {status}")
    return "\n".join(lines)


def _format_display(display: dict[str, Any], indent: str) -> list[str]:
    if "error" in display:
        return [f"{indent}display: {display['error']}"]
    if not display:
        return []
    lines = [f"{indent}EGL {display['version']}, {display['vendor']}, APIs: {' '.join(display['client_apis'])}"]
    for group, names in display["extensions"].items():
        if names:
            lines.append(f"{indent}{group}: {' '.join(names)}")
    return lines
