"""python -m eglcuda: help, --version, and output into a pipe that closes early."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import eglcuda


def run(*args: str, **options) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eglcuda", *args], capture_output=True, text=True, timeout=120,
                          **options)


def test_bare_command_prints_help():
    result = run()
    assert result.returncode == 0, result.stderr
    assert "usage: python -m eglcuda" in result.stdout
    assert "info" in result.stdout and "check" in result.stdout


def test_help_is_plain_text_and_lists_each_command_once():
    result = run("--help")
    assert result.returncode == 0, result.stderr
    assert "``" not in result.stdout and ":func:" not in result.stdout, result.stdout
    for command in ("info", "check", "mps", "topics", "relay"):
        listed = [line for line in result.stdout.splitlines() if line.split()[:1] == [command]]
        assert len(listed) == 1, (command, result.stdout)


@pytest.mark.parametrize("command", [("info",), ("check",), ("topics",), ("relay",), ("mps",), ("mps", "start"),
                                     ("mps", "stop"), ("mps", "status")])
def test_every_command_help_describes_the_command(command):
    result = run(*command, "--help")
    assert result.returncode == 0, result.stderr
    paragraphs = result.stdout.split("\n\n")
    assert paragraphs[0].startswith("usage: python -m eglcuda " + " ".join(command))
    description = paragraphs[1]
    assert not description.startswith(("options:", "positional arguments:")), result.stdout
    assert len(description.split()) >= 10, description


def test_topics_in_a_folder_that_does_not_exist_is_an_error(tmp_path):
    missing = tmp_path / "no-such-folder"
    result = run("topics", "--dir", str(missing))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"python -m eglcuda topics: --dir {missing}: no such folder (without --dir, this user's topic directory is used)"]
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    result = run("topics", "--dir", str(empty))
    assert result.returncode == 0, result.stderr
    assert "(none)" in result.stdout


def test_version():
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"eglcuda {eglcuda.__version__}"


def test_info_json_into_a_pipe_that_closes_early_is_no_traceback():
    # The reader goes away before the report is written: no BrokenPipeError traceback.
    process = subprocess.Popen([sys.executable, "-m", "eglcuda", "info", "--json"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    assert process.stdout is not None
    process.stdout.close()
    _, err = process.communicate(timeout=120)
    assert b"Traceback" not in err, err.decode()


def test_info_json_has_the_summary_first_and_each_row_a_cause_flag():
    result = run("info", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    summary = report["summary"]
    assert "interop paths work here" in summary["line"]
    assert all("root_cause" in row for row in report["paths"])
    explained = [row["path"] for row in report["paths"] if row["root_cause"]]
    assert explained == summary["root_cause_explains"]
    assert bool(summary["root_cause"]) == bool(explained)


def test_info_text_starts_with_the_summary():
    result = run("info")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"eglcuda {eglcuda.__version__}"
    assert lines[1].startswith("Summary: ")


def test_check_rejects_unknown_names():
    result = run("check", "--only", "no-such-check", "--json", "-")
    assert result.returncode == 2
    assert "no-such-check" in result.stderr and "Traceback" not in result.stderr
    for empty in ("", " , "):  # (naming no check is not a run of all of them)
        result = run("check", "--only", empty, "--json", "-")
        assert result.returncode == 2 and result.stderr.strip() == "python -m eglcuda check: --only names no check"


def test_the_command_reference_names_every_command_sample_and_benchmark():
    root = pathlib.Path(__file__).resolve().parents[2]
    page = root / "docs" / "cli.md"
    if not page.exists():
        pytest.skip("docs/cli.md is not in this tree")
    text = page.read_text()
    for command in ("info", "check", "topics", "relay", "mps", "keygen"):
        assert f"| `python -m eglcuda {command}" in text, f"the command table of docs/cli.md lacks {command}"
    scripts = [p for folder in ("samples", "bench", "scripts") for p in sorted((root / folder).glob("*.py"))
               if not p.name.startswith("_")]
    assert scripts
    for script in scripts:
        assert f"python {script.relative_to(root)}" in text, f"docs/cli.md does not mention {script.name}"
    rows = [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| `python -m eglcuda ")]
    assert len(rows) == len(set(rows)), f"a command is in the table of docs/cli.md twice: {rows}"


@pytest.mark.parametrize("case", ["missing-folder", "a-folder", "unwritable-folder", "cwd-unwritable"])
def test_check_refuses_a_results_path_it_cannot_write_before_any_check_runs(case, tmp_path):
    # One line, exit 2, and no check has run (nothing on stdout). /proc takes no new file, not even
    # from root, for whom a folder's mode is no obstacle.
    cwd = tmp_path
    if case == "missing-folder":
        args, said = ["--json", str(tmp_path / "no-such-folder" / "x.json")], "no such folder"
    elif case == "a-folder":
        args, said = ["--json", str(tmp_path)], "is a folder"
    elif case == "unwritable-folder":
        args, said = ["--json", "/proc/eglcuda-check.json"], "cannot be written"
    else:
        args, said, cwd = [], "cannot be written", pathlib.Path("/proc")
    result = run("check", *args, cwd=cwd)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m eglcuda check: --json ") and said in lines[0], lines
    assert not (tmp_path / "eglcuda-check.json").exists()


def test_check_in_a_folder_this_user_may_not_write(tmp_path):
    import os

    if os.geteuid() == 0:
        pytest.skip("needs a user other than root (root may write any folder)")
    folder = tmp_path / "locked"
    folder.mkdir(mode=0o500)
    result = run("check", cwd=folder)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == "" and "Permission denied" in result.stderr and len(result.stderr.splitlines()) == 1



def test_mps_stop_of_an_unknown_instance_speaks_as_the_other_commands(tmp_path):
    result = run("mps", "stop", "--dir", str(tmp_path / "no-such-instance"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("python -m eglcuda mps stop: ") and "UsageError" not in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_relay_without_a_key_names_the_command_line_option(tmp_path):
    # Checked before the relay is made (and before ucxx is needed): a missing key is the user's to
    # give, as --key-file or in the environment; a Python argument (key=) means nothing here.
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("EGLCUDA_REMOTE_KEY", "EGLCUDA_REMOTE_KEY_FILE")}
    result = subprocess.run([sys.executable, "-m", "eglcuda", "relay", "camera"], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m eglcuda relay: "), lines
    if "ucxx" in lines[0]:
        pytest.skip("needs ucxx (pip install -e '.[remote-cu12]'): without it the relay stops at that first")
    assert "--key-file" in lines[0] and "key=" not in lines[0], lines[0]


def test_keygen_onto_a_folder_says_it_is_a_folder(tmp_path):
    # (not "exists: keygen never overwrites a key (remove it first ...)": it is no key)
    folder = tmp_path / "keys"
    folder.mkdir(mode=0o700)
    result = run("keygen", str(folder))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m eglcuda keygen: "), lines
    assert "is a folder" in lines[0] and "remove it" not in lines[0], lines[0]
    assert str(folder / "") in lines[0], lines[0]  # (it says which file to name instead)
    assert list(folder.iterdir()) == []


def test_keygen_that_cannot_write_the_whole_key_says_so_and_leaves_no_file(tmp_path):
    # A file size limit of 16 bytes: the first write of the 32-byte key takes 16, the next fails
    # (EFBIG), as a disk filling up would. It said "wrote a 32-byte key" over a 16-byte file.
    path = tmp_path / "camera.key"
    limited = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (16, 16)); "
               "sys.argv = ['eglcuda', 'keygen', sys.argv[1]]; runpy.run_module('eglcuda', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", limited, str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"python -m eglcuda keygen: writing {path} failed: "), lines
    assert result.stdout == "" and not path.exists()


@pytest.mark.parametrize("given", [("--key", "00112233445566778899aabbccddeeff"),
                                   ("--key=00112233445566778899aabbccddeeff",), ("--key",)])
def test_relay_refuses_a_key_on_the_command_line_without_repeating_it(given):
    # '--key HEX' was taken as an abbreviation of --key-file: 'key file HEX: No such file or
    # directory', the key repeated on stderr and no word that a key never goes there (ps shows it).
    result = run("relay", "camera", *given, env={**os.environ, "EGLCUDA_REMOTE_KEY_FILE": "", "EGLCUDA_REMOTE_KEY": ""})
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "python -m eglcuda relay: --key: a key never goes on the command line (every user of this host can read it "
        "there); pass --key-file FILE, or set EGLCUDA_REMOTE_KEY_FILE (such a file) or EGLCUDA_REMOTE_KEY (hex)"], \
        result.stderr
    assert "0011" not in result.stdout + result.stderr


@pytest.mark.parametrize("args", [("relay", "camera", "--ke", "k"), ("relay", "camera", "--every", "3"),
                                  ("topics", "--no"), ("topics", "--time", "1"), ("mps", "start", "--print"),
                                  ("check", "--on", "x"), ("--vers",)])
def test_an_abbreviated_option_is_refused_not_taken_for_the_one_it_begins(args):
    # argparse takes a prefix of an option for the option: '--ke FILE' read a key file, '--every 3'
    # set --every-timeout, '--vers' printed the version. Every command refuses them.
    result = run(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    abbreviation = [arg for arg in args if arg.startswith("--")][0]
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and f"unrecognized arguments: {abbreviation}" in lines[0], lines


@pytest.mark.parametrize("command", [("info",), ("topics",), ("mps", "status")])
def test_output_that_cannot_be_written_is_one_line_not_a_traceback(command, tmp_path):
    """Standard output on a full disk (/dev/full) or closed: one line on standard error, status 1."""
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "eglcuda", *command], stdout=full, stderr=subprocess.PIPE,
                                text=True, timeout=120)
    lines = result.stderr.splitlines()
    assert result.returncode == 1 and len(lines) == 1 and "writing its output failed" in lines[0], lines
    result = subprocess.run([sys.executable, "-c", "import os, runpy, sys; os.close(1); sys.stdout = None; "
                             "sys.argv = ['eglcuda', *sys.argv[1:]]; runpy.run_module('eglcuda', run_name='__main__')",
                             *command], stderr=subprocess.PIPE, text=True, timeout=120)
    lines = result.stderr.splitlines()
    assert result.returncode == 1 and len(lines) == 1 and "standard output is closed" in lines[0], lines


def test_check_refuses_a_pipe_nobody_reads_at_once(tmp_path):
    fifo = tmp_path / "results.fifo"
    os.mkfifo(fifo)
    result = run("check", "--only", "fence-sync", "--json", str(fifo))
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "a pipe that nobody reads" in lines[0], lines


def test_an_unknown_option_of_an_mps_action_points_at_that_actions_help():
    result = run("mps", "start", "--bogus")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "python -m eglcuda mps start: unrecognized arguments: --bogus ('python -m eglcuda mps start --help' lists "
        "the options)"]


def test_topics_skips_a_relay_status_whose_name_is_not_text(tmp_path):
    folder = tmp_path / "topics"
    folder.mkdir(mode=0o700)
    (folder / "cam.topic.1.relay").write_text(json.dumps({"pid": os.getpid(), "remotes": [], "name": ["a"]}))
    for args in ((), ("--json",)):
        result = run("topics", "--dir", str(folder), *args)
        assert result.returncode == 0 and result.stderr == "", result.stderr


def test_a_source_tree_without_compiled_modules_says_so_in_one_line(tmp_path):
    """``python -m eglcuda`` in a checkout that was never built (the installed package elsewhere):
    the tree's eglcuda shadows it; one line says so and how to get past it."""
    source = pathlib.Path(eglcuda.__file__).resolve().parent
    copy = tmp_path / "checkout" / "eglcuda"
    import shutil

    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    # (the folder first on sys.path as `python -m` puts it, also where PYTHONSAFEPATH keeps it off)
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONSAFEPATH"}
    environment["PYTHONPATH"] = str(copy.parent)
    result = run("info", cwd=copy.parent, env=environment)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "has no compiled modules" in lines[0] and "pip install -e ." in lines[0], lines
