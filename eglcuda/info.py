"""The capability report behind ``python -m eglcuda info``: what this machine's EGL and CUDA
offer, and which of eglcuda's interop paths work here and why not. Never raises."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from . import mps as _mps
from . import cuda_device as _cuda
from ._bind import cuda as _driver
from ._bind import cuda_ipc
from ._bind import loader as _loader
from ._version import __version__
from .availability import available
from .display import Display, client_extensions, devices
from .errors import EglCudaError
from .images.paths import image_path
from .streams.probe import cross_gpu_stream
from .syncs.paths import ServerWaitPath, gl_server_wait_path

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


def group_extensions(names: Iterable[str]) -> dict[str, list[str]]:
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
    egl_displays: dict[str, frozenset[str]] = field(default_factory=dict)  # every display that opened
    gl_why: str | None = None  # why GL calls cannot run here (available("gl")), None when they can

    def need_gl(self) -> str | None:
        """None when eglcuda's GL steps can run (the same answer as ``available("gl")``)."""
        return self.gl_why

    def need_any_display(self, *extensions: str) -> str | None:
        """For paths without CUDA: None when one EGL display (any vendor) has all ``extensions``."""
        if not self.egl_displays:
            return "no EGL display opens"
        for names in self.egl_displays.values():
            if all(e in names for e in extensions):
                return None
        return f"no EGL display has {' + '.join(extensions)}"

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
    check: Callable[[_Facts], str | None]  # None when the platform has what the path needs
    cuda: bool = True  # False: EGL and GL alone (works on Mesa)


def _eglimage_registration(facts: _Facts) -> str | None:
    why = (facts.need_stream_ext("EGL_KHR_gl_texture_2D_image") or facts.need_cuda("cuGraphicsEGLRegisterImage")
           or facts.need_gl())
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


def _topic_cuda_ipc(facts: _Facts) -> str | None:
    why = facts.need_cuda("cuIpcGetMemHandle", "cuIpcOpenMemHandle", "cuIpcGetEventHandle", "cuIpcOpenEventHandle")
    if why:
        return why
    if facts.integrated:
        return "integrated GPU (Tegra): no CUDA IPC there; topics use EGLStream"
    return None


CROSS_PROCESS_PATH = "EGLStream across processes (fd over a UNIX socket)"

INTEROP_PATHS: list[InteropPath] = [
    InteropPath("GL contexts (headless)", lambda f: f.need_any_display() or f.need_gl(), cuda=False),
    InteropPath("EGLImage GL texture -> GL texture",
                lambda f: f.need_any_display("EGL_KHR_image_base", "EGL_KHR_gl_texture_2D_image") or f.need_gl(),
                cuda=False),
    InteropPath("EGLStream CUDA -> CUDA", lambda f: f.need_stream_ext("EGL_KHR_stream")
                or f.need_cuda("cuEGLStreamProducerConnect", "cuEGLStreamConsumerConnectWithFlags")),
    InteropPath("EGLStream FIFO mode", lambda f: f.need_stream_ext("EGL_KHR_stream_fifo")),
    InteropPath("EGLStream last-frame reuse control", lambda f: f.need_stream_ext("EGL_NV_stream_reset")),
    InteropPath(CROSS_PROCESS_PATH,
                lambda f: f.need_stream_ext("EGL_KHR_stream_cross_process_fd")),
    InteropPath("EGLStream frames in pinned host memory", lambda f: f.need_stream_ext("EGL_KHR_stream")
                or f.need_cuda("cuMemHostAlloc", "cuMemHostGetDevicePointer")),
    InteropPath("EGLStream frames in managed memory",
                lambda f: "eglcuda refuses them: cuEGLStreamProducerPresentFrame crashed the process on a managed "
                          "frame (H100/H200, driver 580); not verified on Tegra"),
    InteropPath("EGLStream CUDA -> GL texture",
                lambda f: f.need_stream_ext("EGL_KHR_stream_consumer_gltexture") or f.need_gl()),
    InteropPath("EGLStream GL surface -> CUDA",
                lambda f: f.need_stream_ext("EGL_KHR_stream_producer_eglsurface") or f.need_gl()),
    InteropPath("EGLImage GL texture -> CUDA (native)", _eglimage_registration),
    InteropPath("EGLImage GL texture -> CUDA (GL interop)",
                lambda f: f.need_stream_ext("EGL_KHR_gl_texture_2D_image") or f.need_cuda("cuGraphicsGLRegisterImage")
                or f.need_gl()),
    InteropPath("EGLSync fence / reusable / server wait",
                lambda f: f.need_any_display("EGL_KHR_fence_sync", "EGL_KHR_reusable_sync", "EGL_KHR_wait_sync"),
                cuda=False),
    InteropPath("CUDA event -> EGLSync (native)", lambda f: f.need_stream_ext("EGL_NV_cuda_event")),
    InteropPath("CUDA stream -> EGLSync (emulated)", lambda f: f.need_stream_ext("EGL_KHR_reusable_sync")
                or f.need_cuda("cuLaunchHostFunc")),
    InteropPath("CUDA stream -> GL server wait (timeline semaphore)", _semaphore_wait),
    InteropPath("EGLSync -> CUDA event (native)", lambda f: f.need_cuda("cuEventCreateFromEGLSync")),
    InteropPath("EGLSync -> CUDA stream (emulated)",
                lambda f: f.need_cuda("cuStreamWaitValue32", "cuMemHostAlloc", "cuMemHostGetDevicePointer")),
    InteropPath("Topics (Publisher/Subscriber) through CUDA IPC", _topic_cuda_ipc),
    InteropPath("Topics (Publisher/Subscriber) through EGLStreams",
                lambda f: f.need_stream_ext("EGL_KHR_stream_cross_process_fd")
                or f.need_cuda("cuEGLStreamProducerConnect", "cuEGLStreamConsumerConnectWithFlags")),
]


def _path_status(path: InteropPath, facts: _Facts) -> dict[str, str]:
    why = path.check(facts)
    if why:
        return {"path": path.name, "status": "unsupported", "why": why}
    return {"path": path.name, "status": "available", "why": ""}


def collect() -> dict[str, Any]:
    """The whole report as plain data (what ``--json`` prints)."""
    report: dict[str, Any] = {"eglcuda": __version__}
    egl_ok, egl_why = _loader.egl_available()
    egl: dict[str, Any] = {"library": _loader.EGL_LIBRARY, "loaded": egl_ok, "error": egl_why, "devices": []}
    report["egl"] = egl
    cuda_display_extensions = None
    cuda_display_name = "no EGL device reports a CUDA ordinal"
    egl_displays: dict[str, frozenset[str]] = {}
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
                    egl_displays[display.description] = display.extensions
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
                    egl_displays[display.description] = display.extensions
            except EglCudaError as exc:
                egl["surfaceless"] = {"error": str(exc)}

    cuda_ok, cuda_why = _loader.cuda_available()
    cuda: dict[str, Any] = {"library": _loader.CUDA_LIBRARY, "loaded": cuda_ok, "error": cuda_why, "devices": []}
    report["cuda"] = cuda
    integrated = None
    if cuda_ok:
        try:
            version = _driver.driver_version()
            cuda["driver_version"] = f"{version // 1000}.{version % 1000 // 10}"
            for ordinal in range(_driver.device_count()):
                info = _cuda.device_info(ordinal)
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
    gl_ok, gl_why = available("gl", reason=True)
    report["gl"] = {"available": gl_ok, "reason": gl_why}
    facts = _Facts(cuda_display_extensions, cuda_display_name, cuda_ok, cuda_why, integrated, image_choice, gl_wait,
                   egl_displays, None if gl_ok else gl_why)
    report["paths"] = [_path_status(path, facts) for path in INTEROP_PATHS]
    report["gpu_pairs"] = _gpu_pairs(cuda["devices"] if cuda_ok else [])
    report["mps"] = _mps_report(cuda_ok and bool(cuda["devices"]),
                                "no CUDA driver" if not cuda_ok else "no CUDA device")
    _note_mps(report["paths"], report["mps"])
    report["summary"] = summarize(report, facts)
    return report


# Pairs whose streams are tried for real: a few hundred milliseconds each, so not on every large host.
_PAIRS_TRIED = 12


def _gpu_pairs(cuda_devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each ordered pair of GPUs: peer access, the link between them (``nvidia-smi topo``), and
    whether a frame crosses between them through an EGLStream (tried). Never raises."""
    ordinals = [d["ordinal"] for d in cuda_devices]
    if len(ordinals) < 2:
        return []
    links = _nvidia_smi_links()
    pairs: list[dict[str, Any]] = []
    for producer in ordinals:
        for consumer in ordinals:
            if producer == consumer:
                continue
            entry: dict[str, Any] = {"producer": producer, "consumer": consumer,
                                     "link": links.get((producer, consumer))}
            try:
                entry["peer_access"] = cuda_ipc.can_access_peer(_driver.device_get(producer),
                                                                _driver.device_get(consumer))
            except EglCudaError as exc:
                entry["peer_access"] = None
                entry["peer_access_error"] = str(exc)
            if len(pairs) < _PAIRS_TRIED:
                entry["stream"], entry["stream_why"] = cross_gpu_stream(producer, consumer)
            else:
                entry["stream"], entry["stream_why"] = None, "not tried (python -m eglcuda check tries a pair)"
            pairs.append(entry)
    return pairs


def _nvidia_smi_links() -> dict[tuple[int, int], str]:
    """The link between each pair of GPUs as ``nvidia-smi topo -m`` names it (NV4: four NVLinks;
    PIX/PXB/PHB/NODE/SYS: PCIe paths), by CUDA ordinal; empty where nvidia-smi is missing."""
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = [line.split() for line in out.splitlines() if line.startswith("GPU")]
    links = {}
    for row in rows:
        if not row[0][3:].isdigit():
            continue
        here = int(row[0][3:])
        for there, word in enumerate(row[1:1 + len(rows)]):
            if there != here and word != "X":
                links[(here, there)] = word
    return links


def _note_mps(paths: list[dict[str, str]], mps: dict[str, Any]) -> None:
    """The availability table's word on MPS: the cross-process path, available, without it."""
    for path in paths:
        if path["path"] == CROSS_PROCESS_PATH and path["status"] == "available" and mps["active"] is False:
            path["note"] = "between processes on one GPU about 5x faster under CUDA MPS (see CUDA MPS above)"


def _mps_report(cuda_usable: bool, why_not: str) -> dict[str, Any]:
    """Whether this process runs under CUDA MPS, and the advice when it does not. Reads one device
    attribute, one pid file and /proc: fast, and never raises."""
    entry: dict[str, Any] = {"active": None, "reason": "", "advice": None, "pipe_directory": None, "daemons": []}
    try:
        if not cuda_usable:
            entry["reason"] = f"not applicable: {why_not}"
            return entry
        active, reason = _mps.under_mps(0)
        entry.update(active=active, reason=reason, pipe_directory=_mps.pipe_directory_in_effect())
        if active is False:
            entry["advice"] = _mps.advice(active)
        entry["daemons"] = [{"pid": d.pid, "uid": d.uid, "pipe_directory": d.pipe_directory, "eglcuda": d.eglcuda,
                             "system": d.system} for d in _mps.running_daemons()]
    except Exception as exc:  # the report never raises
        entry["reason"] = f"detection failed: {type(exc).__name__}: {exc}"
    return entry


# ---- the summary: what this machine can do, and the root cause of what it cannot ------------------

def root_cause() -> tuple[str, str] | None:
    """(capability, why) of the first missing basic: EGL, then CUDA, then an EGL display for CUDA
    device 0. Everything that needs it fails for that one reason."""
    for name in ("egl", "cuda", "cuda-egl"):
        ok, why = available(name, reason=True)
        if not ok:
            return name, why
    return None


def _caused_by_root(row: dict[str, str], path: InteropPath, facts: _Facts, cause: str) -> bool:
    why = row["why"]
    if row["status"] != "unsupported":
        return False
    if cause == "egl":
        return True
    return path.cuda and (why == facts.cuda_why or why.startswith("no EGL display for a CUDA device"))


def summarize(report: dict[str, Any], facts: _Facts) -> dict[str, Any]:
    """The report's first line as data: which paths work, and the one reason most others do not.
    Marks each row the root cause explains (``root_cause``)."""
    cause = root_cause()
    rows = report["paths"]
    for row, path in zip(rows, INTEROP_PATHS):
        row["root_cause"] = cause is not None and _caused_by_root(row, path, facts, cause[0])
    working = [row["path"] for row in rows if row["status"] == "available"]
    explained = [row["path"] for row in rows if row["root_cause"]]
    others = [row["path"] for row in rows if row["status"] != "available" and not row["root_cause"]]
    line = f"{len(working)} of {len(rows)} interop paths work here"
    if working and len(working) <= 4:
        line += f" ({'; '.join(working)})"
    needs = None
    if cause:
        needs = {"egl": "EGL", "cuda": "CUDA", "cuda-egl": "NVIDIA's EGL"}[cause[0]]
        line += f"; {len(explained)} need {needs}, root cause: {cause[1]}"
    if others:
        line += f"; {len(others)} more not available here (see the table)"
    gl = report.get("gl")
    if gl and not gl["available"] and (cause is None or cause[0] != "egl"):
        line += f"; GL calls: {gl['reason']}"
    return {"line": line, "available": working, "root_cause": cause[1] if cause else None,
            "root_cause_needs": needs,
            "root_cause_explains": explained, "other_unavailable": others}


def _image_choice() -> Any:
    """The EGLImage path decision on CUDA device 0 (runs the coherence self-test), or why not."""
    try:
        with Display.for_cuda_device(0) as display:
            return image_path(display)
    except Exception as exc:  # the report never raises
        return f"self-test failed to run: {type(exc).__name__}: {exc}"


def _gl_wait_choice() -> tuple[str, str]:
    """How GL server waits on CUDA syncs work on CUDA device 0, probed in a fresh GL context."""
    try:
        with Display.for_cuda_device(0) as display, display.create_context() as context:
            context.make_current()
            return gl_server_wait_path(display)
    except Exception as exc:  # the report never raises
        return ServerWaitPath.CLIENT_WAIT, f"probe failed to run: {type(exc).__name__}: {exc}"


def format_report(report: dict[str, Any]) -> str:
    """The report as text for a terminal: the summary first, then the details."""
    lines = [f"eglcuda {report['eglcuda']}"]
    if report.get("summary"):
        lines.append(f"Summary: {report['summary']['line']}")
    lines.append("")
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
    if report.get("gl"):
        gl = report["gl"]
        lines.append(f"GL calls (PyOpenGL in EGL contexts): {'yes' if gl['available'] else 'NO'}, {gl['reason']}")
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
    lines.extend(_format_pairs(report.get("gpu_pairs") or []))
    lines.extend(_format_mps(report.get("mps")))
    lines.append("")
    lines.append("Interop paths:")
    width = max(len(p["path"]) for p in report["paths"])
    for path in report["paths"]:
        if path.get("root_cause"):
            status = f"unsupported (needs {report['summary']['root_cause_needs']}: see the summary)"
        else:
            status = path["status"] + (f" ({path['why']})" if path["why"] else "") + (
                f"; {path['note']}" if path.get("note") else "")
        lines.append(f"  {path['path']:<{width}}  {status}")
    return "\n".join(lines)


def _format_pairs(pairs: list[dict[str, Any]]) -> list[str]:
    if not pairs:
        return []
    lines = ["GPU pairs (producer -> consumer):"]
    for pair in pairs:
        peer = {True: "peer access", False: "no peer access", None: "peer access unknown"}[pair["peer_access"]]
        link = f", link {pair['link']}" if pair.get("link") else ""
        stream = {True: "EGLStream works", False: "EGLStream FAILS", None: "EGLStream not tried"}[pair["stream"]]
        lines.append(f"  GPU {pair['producer']} -> GPU {pair['consumer']}: {peer}{link}; {stream} ({pair['stream_why']})")
    return lines


def _format_mps(mps: dict[str, Any] | None) -> list[str]:
    if not mps:
        return []
    if mps["active"]:
        line = f"CUDA MPS: active (pipe dir {mps['pipe_directory']})"
    elif mps["active"] is False:
        line = f"CUDA MPS: {mps['advice']}"
    elif mps["reason"].startswith("not applicable"):
        return [f"CUDA MPS: {mps['reason']}"]
    else:
        return [f"CUDA MPS: cannot tell: {mps['reason']}"]
    lines = [line, f"  {mps['reason']}"]
    others = [d for d in mps.get("daemons", []) if d["pipe_directory"] != mps["pipe_directory"]]
    for daemon in others:
        where = daemon["pipe_directory"] or "unreadable"
        lines.append(f"  another MPS daemon runs: pid {daemon['pid']}, pipe dir {where}")
    return lines


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
