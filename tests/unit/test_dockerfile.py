"""The container image: the Dockerfile's shape, its pinned dependencies, and its entrypoint.

The Dockerfile is parsed and the entrypoint command itself (`gpusizer`, installed by the same
pyproject.toml the image installs) is run; e2e/tests/test_image.py builds and runs the image.

Run as a script, this prints requirements.lock from the venv (`make lock` does, after taking
the newest releases).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
LOCK = REPO / "requirements.lock"


def runtime_pins() -> list[str]:
    """name==version for the closure of pyproject.toml's [project.dependencies] (no extras),
    at the versions installed in the venv."""
    seen: dict[str, str] = {}

    def walk(name: str, extras: tuple[str, ...]) -> None:
        key = canonicalize_name(name)
        if key in seen:
            return
        dist = md.distribution(name)
        seen[key] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
                continue
            walk(req.name, tuple(req.extras))

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"]:
        req = Requirement(text)
        try:
            walk(req.name, tuple(req.extras))
        except md.PackageNotFoundError:
            raise AssertionError(f"{req.name} is not installed in the venv: make venv") from None
        assert req.specifier.contains(seen[canonicalize_name(req.name)], prereleases=True), (
            f"installed {req.name} {seen[canonicalize_name(req.name)]} does not satisfy {text}"
        )
    return [f"{name}=={version}" for name, version in sorted(seen.items())]


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def final_stage() -> list[tuple[str, str]]:
    ins = instructions()
    last_from = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    return ins[last_from:]


def gpusizer(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("gpusizer", path=str(Path(sys.executable).parent)) or "gpusizer"
    return subprocess.run([exe, *args], text=True, capture_output=True, timeout=60, check=False)


def lock_pins() -> list[str]:
    """requirements.lock's name==version lines."""
    return [
        line.strip()
        for line in LOCK.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def test_multi_stage_from_a_pinned_small_base_argument() -> None:
    ins = instructions()
    froms = [rest for word, rest in ins if word == "FROM"]
    assert len(froms) >= 2, "build and runtime stages"
    # the base is a build argument (make image passes a local one), declared before any FROM
    base_args = [rest for word, rest in ins[: ins.index(("FROM", froms[0]))] if word == "ARG"]
    defaults = dict(arg.partition("=")[::2] for arg in base_args)
    base = defaults.get("BASE", "")
    assert ":" in base and not base.endswith(":latest"), f"unpinned default base {base!r}"
    assert "slim" in base or "distroless" in base or "alpine" in base, f"not small: {base}"
    assert "python:3.11" in base, "the Python the package is typed and tested for"
    for image in froms:
        assert image.split()[0] == "${BASE}", f"FROM {image}: every stage starts from BASE"


def test_entrypoint_is_gpusizer_run() -> None:
    stage = dict(final_stage())
    assert json.loads(stage["ENTRYPOINT"]) == ["gpusizer"]
    assert json.loads(stage["CMD"]) == ["run"]


def test_runs_as_a_numeric_non_root_user() -> None:
    users = [rest for word, rest in final_stage() if word == "USER"]
    assert users, "the runtime stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric and non-root, so runAsNonRoot can check it"
    values = (REPO / "charts" / "gpusizer" / "values.yaml").read_text()
    assert f"runAsUser: {uid}" in values, "the chart runs as the image's user"


def test_installs_exactly_the_lock_then_the_package_without_deps() -> None:
    runs = [rest for word, rest in instructions() if word == "RUN"]
    copies = [rest for word, rest in instructions() if word == "COPY"]
    assert any(c.startswith("requirements.lock") for c in copies)
    lock_install = [r for r in runs if "-r requirements.lock" in r]
    assert lock_install and "--no-deps" in lock_install[0], "every dependency from the lock"
    package_install = [r for r in runs if "install --no-deps ." in r]
    assert package_install and "pip check" in package_install[0], "pip check proves the lock"
    assert runs.index(lock_install[0]) < runs.index(package_install[0])


def test_lock_pins_every_runtime_dependency_at_the_venvs_version() -> None:
    pinned = lock_pins()
    assert all("==" in p for p in pinned), "every line is name==version"
    assert pinned == runtime_pins(), (
        "requirements.lock and the venv disagree: `make venv` installs the lock's versions; "
        "after changing pyproject.toml's dependencies, `make lock`"
    )
    assert not any(p.startswith(("pytest", "mypy", "ruff")) for p in pinned), "no dev tools"


def test_dockerignore_keeps_the_context_small() -> None:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    assert "*" in lines, "everything is excluded unless listed"
    for needed in ("!pyproject.toml", "!requirements.lock", "!operator/"):
        assert needed in lines
    copied = {
        rest.split()[0] for word, rest in instructions() if word == "COPY" and "--from" not in rest
    }
    for source in copied:
        assert (REPO / source).exists(), f"COPY {source}: missing from the repository"


def test_entrypoint_help() -> None:
    result = gpusizer("--help")
    assert result.returncode == 0, result.stderr
    for command in ("run", "simulate", "crds"):
        assert command in result.stdout


def test_run_help_lists_every_flag() -> None:
    from gpusizer.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    run = sub.choices["run"]
    flags = [s for a in run._actions for s in a.option_strings if s.startswith("--")]
    result = gpusizer("run", "--help")
    assert result.returncode == 0, result.stderr
    missing = [f for f in flags if f not in result.stdout]
    assert not missing, missing
    for flag in ("--prometheus-url", "--prometheus-bearer-token-file", "--prometheus-ca-file"):
        assert flag in result.stdout


def test_run_without_prometheus_url_fails_clearly() -> None:
    result = subprocess.run(
        [shutil.which("gpusizer", path=str(Path(sys.executable).parent)) or "gpusizer", "run"],
        text=True,
        capture_output=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "--prometheus-url" in result.stderr


def test_crds_command_prints_the_crd() -> None:
    result = gpusizer("crds")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (REPO / "crds" / "gpusizer.io_workloadsizings.yaml").read_text()


if __name__ == "__main__":
    header = [line for line in LOCK.read_text().splitlines() if line.startswith("#")]
    print("\n".join([*header, *runtime_pins()]))
