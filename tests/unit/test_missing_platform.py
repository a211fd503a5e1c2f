"""A machine without EGL, without a desktop GL library, or a Python without PyOpenGL: ``info``,
``check``, ``available`` and ``require`` give one answer, in one line that names what to install.

Each case runs in a child interpreter. The libraries are taken away through the loader's test hooks
(``EGLCUDA_LIBEGL``, ``EGLCUDA_LIBOPENGL``, ``EGLCUDA_LIBCUDA`` naming a file that does not exist),
PyOpenGL through ``sys.modules["OpenGL"] = None`` (Python's own way to make an import fail). CI
also runs the whole suite with the libraries hidden for real (tests/without_libs.sh, .ci/run).
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import eglcuda
from eglcuda._bind import loader

from ..egl.test_readme import first_look

ROOT = pathlib.Path(__file__).resolve().parents[2]

NO_EGL = {"EGLCUDA_LIBEGL": "/nonexistent/libEGL.so.1"}
NO_OPENGL = {"EGLCUDA_LIBOPENGL": "/nonexistent/libOpenGL.so.0"}
NO_PYOPENGL = "import sys; sys.modules['OpenGL'] = None\n"
GL_ROWS = ("GL contexts (headless)", "EGLImage GL texture -> GL texture")
GL_CHECKS = ("gl-context", "eglimage-siblings", "fence-sync")


def python(code: str, env: dict[str, str] | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def command(*args: str, env: dict[str, str] | None = None, prelude: str = "", cwd=None) -> subprocess.CompletedProcess:
    """``python -m eglcuda ARGS``, after ``prelude`` (Python run first in the same interpreter)."""
    code = (f"{prelude}import runpy, sys\nsys.argv = ['python -m eglcuda', *{list(args)!r}]\n"
            "runpy.run_module('eglcuda', run_name='__main__')\n")
    return python(code, env, cwd)


def gl_answer(env: dict[str, str] | None = None, prelude: str = "") -> tuple[bool, str]:
    result = python(f"{prelude}import json, eglcuda\nprint(json.dumps(eglcuda.available('gl', reason=True)))", env)
    assert result.returncode == 0, result.stderr
    ok, why = json.loads(result.stdout)
    return ok, why


def info_and_check(tmp_path, env=None, prelude=""):
    info = command("info", "--json", env=env, prelude=prelude)
    assert info.returncode == 0 and "Traceback" not in info.stderr, info.stderr
    check = command("check", "--json", str(tmp_path / "check.json"), env=env, prelude=prelude, cwd=tmp_path)
    assert "Traceback" not in check.stderr, check.stderr
    report = json.loads(info.stdout)
    checks = json.loads((tmp_path / "check.json").read_text())
    return report, check, checks


@pytest.mark.parametrize("case", ["no-egl", "no-libopengl", "no-pyopengl"])
def test_info_check_and_available_give_one_answer_for_gl(case, tmp_path):
    env = {"no-egl": NO_EGL, "no-libopengl": NO_OPENGL, "no-pyopengl": None}[case]
    prelude = NO_PYOPENGL if case == "no-pyopengl" else ""
    ok, why = gl_answer(env, prelude)
    assert not ok and why and "\n" not in why
    expected = {"no-egl": ["libEGL.so.1", "apt-get install", "libopengl0"],
                "no-libopengl": ["libOpenGL.so.0", "apt-get install libopengl0"],
                "no-pyopengl": ["PyOpenGL", "pip install PyOpenGL"]}[case]
    # What this machine itself lacks comes first: EGL, then the GL library, then PyOpenGL.
    if case != "no-egl" and not eglcuda.available("egl"):
        expected = ["libEGL.so.1"]
    elif case == "no-pyopengl" and not loader.opengl_available()[0]:
        expected = ["libOpenGL.so.0"]
    for words in expected:
        assert words in why, why
    report, check, checks = info_and_check(tmp_path, env, prelude)
    assert report["gl"] == {"available": False, "reason": why}
    rows = {row["path"]: row for row in report["paths"]}
    for name in GL_ROWS:
        assert rows[name]["status"] == "unsupported", rows[name]
        assert rows[name]["root_cause"] or rows[name]["why"] == why, rows[name]
    outcomes = {c["name"]: c for c in checks["checks"]}
    for name in GL_CHECKS:
        assert outcomes[name]["status"] == "n/a", outcomes[name]
        assert why in outcomes[name]["detail"], outcomes[name]
    assert checks["failed"] == 0 and check.returncode == 0, check.stdout


def test_the_mesa_hint_names_every_package_the_readme_lists():
    result = python("import eglcuda\nprint(eglcuda.available('egl', reason=True)[1])\n"
                    "try:\n    eglcuda.devices()\nexcept eglcuda.Unsupported as exc:\n    print(exc)\n", NO_EGL)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2, lines
    for line in lines:
        assert "libEGL.so.1" in line and "apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0" in line
    info = command("info", env=NO_EGL)
    assert info.returncode == 0, info.stderr
    summary = info.stdout.splitlines()[1]
    assert summary.startswith("Summary: ") and "libopengl0" in summary, summary


@pytest.mark.parametrize("env, words", [(NO_EGL, "libegl1"), (NO_OPENGL, "libopengl0")])
def test_require_is_one_line_and_status_2(env, words):
    if env is NO_OPENGL and not eglcuda.available("egl"):
        words = "libegl1"
    result = python("import eglcuda\neglcuda.require('gl')\nprint('not reached')", env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("eglcuda: needs "), result.stderr
    assert words in lines[0]


def test_require_returns_quietly_when_everything_is_here():
    result = python("import eglcuda\neglcuda.require()\nprint('went on')")
    assert (result.returncode, result.stdout, result.stderr) == (0, "went on\n", "")


def test_require_of_an_unknown_name_is_a_usage_error():
    with pytest.raises(eglcuda.UsageError, match="known: egl"):
        eglcuda.require("opengl")


def test_a_cuda_display_without_libcuda_names_libcuda():
    result = python("import eglcuda\ntry:\n    eglcuda.Display.for_cuda_device(0)\n"
                    "except eglcuda.Unsupported as exc:\n    print(exc)\n",
                    {"EGLCUDA_LIBCUDA": "/nonexistent/libcuda.so.1"})
    assert result.returncode == 0, result.stderr
    assert "libcuda.so.1 is not available" in result.stdout and "NVIDIA driver" in result.stdout, result.stdout
    assert "NVIDIA's EGL" not in result.stdout


@pytest.mark.parametrize("document", ["README.md", "docs/index.md"])
@pytest.mark.parametrize("case", ["as-is", "no-egl", "no-libopengl", "no-pyopengl"])
def test_the_first_look_runs_or_fails_in_one_eglcuda_line(document, case, tmp_path):
    """The README's first look, as written: it runs where EGL, GL and PyOpenGL are (the EGL tier
    checks its output), and elsewhere ends in one line from eglcuda with status 2, no traceback."""
    path = ROOT / document
    if not path.exists():
        pytest.skip(f"{document} is not in this tree")
    code = first_look(path)
    env = {"no-egl": NO_EGL, "no-libopengl": NO_OPENGL}.get(case)
    prelude = NO_PYOPENGL if case == "no-pyopengl" else ""
    result = python(prelude + code, env, cwd=tmp_path)
    if case == "as-is" and eglcuda.available("gl") and eglcuda.available("sync"):
        assert result.returncode == 0, result.stderr
        assert "fence signaled: True" in result.stdout
        return
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("eglcuda: needs "), result.stderr
    assert "install" in lines[0], lines[0]
