""".ci/system-deps, the step `make test` and .ci/run take first: it finds which of the Debian packages the tests run are
missing and installs them, or says how to. Run for real in bash, with a PATH of its own: stand-ins for apt-get (it
records its arguments, and "installs" a package by putting its command on that PATH or its library in ldconfig's
list), ldconfig, id and sudo, since packages cannot be uninstalled here nor installed in a test; grep and env are
the real ones."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / ".ci" / "system-deps"
EVERY = ["prometheus", "wrk", "redis-server", "chromium", "libb64-0d"]
LIBB64 = "\tlibb64.so.0d (libc6,x86-64) => /lib/x86_64-linux-gnu/libb64.so.0d\n"

APT_GET = """#!/bin/bash
echo "$0 $*" >> "$FAKE_LOG"
[ "$1" = install ] || exit 0
for p in "$@"; do
  case "$p" in
    -*|install) ;;
    libb64-0d) printf '\\tlibb64.so.0d (libc6,x86-64) => /x/libb64.so.0d\\n' >> "$FAKE_LIBS" ;;
    *) [ -n "${FAKE_BROKEN:-}" ] || { printf '#!/bin/bash\\n' > "$FAKE_BIN/$p"; CHMOD +x "$FAKE_BIN/$p"; } ;;
  esac
done
"""


@dataclass
class Machine:
    bin: Path
    log: Path
    libs: Path

    def command(self, name: str, body: str = "exit 0") -> None:
        path = self.bin / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(0o755)

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        variables = {"PATH": str(self.bin), "FAKE_LOG": str(self.log), "FAKE_LIBS": str(self.libs)}
        variables |= {"FAKE_BIN": str(self.bin), **env}
        command = ["/bin/bash", str(SCRIPT), *args]
        return subprocess.run(command, env=variables, capture_output=True, text=True, timeout=30)

    def apt_calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [line.split()[1:] for line in self.log.read_text().splitlines()]


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    """A PATH with none of the packages: grep and env (real), ldconfig listing FAKE_LIBS, id saying root, apt-get."""
    m = Machine(tmp_path / "bin", tmp_path / "apt.log", tmp_path / "libs")
    m.bin.mkdir()
    m.libs.write_text("\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6\n")
    for real in ("grep", "env"):
        (m.bin / real).symlink_to(str(shutil.which(real)))
    # the stand-ins call what they need by its full path: the PATH has only what the script may find
    m.command("ldconfig", f'[ "$1" = -p ] && {shutil.which("cat")} "{m.libs}"')
    m.command("id", 'echo "${FAKE_UID:-0}"')
    m.command("apt-get", APT_GET.removeprefix("#!/bin/bash\n").replace("CHMOD", str(shutil.which("chmod"))))
    return m


def test_nothing_missing_is_silent_and_calls_no_apt(machine: Machine) -> None:
    for name in ("prometheus", "wrk", "redis-server", "chromium"):
        machine.command(name)
    machine.libs.write_text(machine.libs.read_text() + LIBB64)
    done = machine.run()
    assert (done.returncode, done.stdout, done.stderr, machine.apt_calls()) == (0, "", "", [])


def test_as_root_apt_get_installs_every_missing_package(machine: Machine) -> None:
    done = machine.run()
    assert done.returncode == 0, done.stderr
    assert machine.apt_calls() == [["update", "-q"], ["install", "-y", "-q", *EVERY]]
    assert "installing" in done.stderr and "prometheus wrk redis-server chromium libb64-0d" in done.stderr


def test_only_what_is_missing(machine: Machine) -> None:
    machine.command("wrk")
    machine.command("chromium-browser")  # Ubuntu's name for the browser, which tests/test_openapi_live.py takes too
    machine.libs.write_text(machine.libs.read_text() + LIBB64)
    assert machine.run().returncode == 0
    assert machine.apt_calls()[-1] == ["install", "-y", "-q", "prometheus", "redis-server"]


def test_passwordless_sudo_is_used(machine: Machine) -> None:
    machine.command("sudo", '[ "$1" = -n ] && shift && echo "sudo $1" >> "$FAKE_LOG.sudo" && "$@"')
    done = machine.run(FAKE_UID="1000")
    assert done.returncode == 0, done.stderr
    assert machine.apt_calls()[-1] == ["install", "-y", "-q", *EVERY]
    assert Path(f"{machine.log}.sudo").read_text().split() == ["sudo", "true", "sudo", "env", "sudo", "env"]


@pytest.mark.parametrize("sudo", [None, "exit 1"], ids=["no-sudo", "sudo-wants-a-password"])
def test_without_privilege_one_line_names_the_packages_and_the_command(machine: Machine, sudo: str | None) -> None:
    if sudo:
        machine.command("sudo", sudo)
    machine.command("redis-server")
    done = machine.run(FAKE_UID="1000")
    assert done.returncode == 1 and machine.apt_calls() == []
    (line,) = done.stderr.splitlines()
    assert "missing: prometheus wrk chromium libb64-0d" in line
    assert line.endswith("apt-get install -y prometheus wrk chromium libb64-0d")


def test_check_only_names_what_is_missing_and_never_installs(machine: Machine) -> None:
    machine.command("wrk")
    done = machine.run("--check")  # as root, where the script would otherwise install
    assert done.returncode == 1 and machine.apt_calls() == []
    (line,) = done.stderr.splitlines()
    assert line.endswith("apt-get update && apt-get install -y prometheus redis-server chromium libb64-0d")


def test_a_package_still_missing_after_apt_get_fails(machine: Machine) -> None:
    machine.libs.write_text(machine.libs.read_text() + LIBB64)
    done = machine.run(FAKE_BROKEN="1")  # apt-get succeeds but puts no command on the PATH
    assert done.returncode == 1 and "still missing after apt-get: prometheus wrk redis-server chromium" in done.stderr


def test_no_apt_get_says_so(machine: Machine) -> None:
    (machine.bin / "apt-get").unlink()
    done = machine.run()
    assert done.returncode == 1 and "no apt-get here" in done.stderr and "prometheus" in done.stderr


def test_this_machine_has_them_all() -> None:
    """The real check on this machine's own PATH (`--check`: never installs, so a unit test cannot run apt-get): make
    test's prerequisite installed them, so nothing is missing."""
    env = {**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"}
    done = subprocess.run(["/bin/bash", str(SCRIPT), "--check"], env=env, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stderr) == (0, "")
