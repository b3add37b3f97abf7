"""The docs site builds with `mkdocs build --strict` (a broken link, a missing page, an anchor that is gone, a
Python name the API reference cannot find: each fails it), the CLI reference it generates is the parser's help,
and the README's set-up commands are the ones CI runs.

    PYTHONPATH=src python -m pytest tests/test_docs.py -q
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for this file (about 5 s) from this checkout's docs/ and src/."""
    try:
        import mkdocs  # noqa: F401 - only to say what to install
        import mkdocstrings  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"{exc.name} is missing: the docs build is part of the tests; install with pip install -e '.[dev]'")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-6000:]}"
    return out


def test_the_site_builds_strictly_with_every_page(site):
    for page in ("index", "training", "hardware", "data-and-rewards", "control-plane", "evaluation", "tool-use", "ray",
                 "security", "tinker", "architecture", "contributing", "results", "reference/cli", "reference/python"):
        assert (site / page / "index.html").is_file() or (page == "index" and (site / "index.html").is_file()), page


def test_the_cli_reference_is_the_parsers_help(site):
    """Every command of the parser has its section, and its text is what `strop runs start --help` prints."""
    html = (site / "reference" / "cli" / "index.html").read_text()
    done = subprocess.run([sys.executable, "-m", "strop.cli.main", "runs", "start", "--help"], cwd=ROOT,
                          env={**os.environ, "COLUMNS": "86", "NO_COLOR": "1", "PYTHONPATH": str(ROOT / "src")},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for line in done.stdout.splitlines()[:6]:
        escaped = line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
        assert escaped.strip() in html, line
    for command in ("strop quickstart", "strop serve-tinker", "strop registry datasets register", "strop envs demos"):
        assert f"<code>{command}</code>" in html, command


def test_the_python_reference_documents_the_api(site):
    html = (site / "reference" / "python" / "index.html").read_text()
    for name in ("strop.client.ServiceClient", "strop.client.TrainingClient.forward_backward", "strop.types.Datum",
                 "strop.rl.config.GRPOConfig", "strop.sft.loop.run_sft", "strop.scoring.bundles.load_grader"):
        assert f'id="{name}"' in html, name


def test_the_readme_set_up_commands_are_the_ones_ci_runs():
    """CI's .ci/run runs the README's install and test commands: the two must stay in step."""
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    for command in ('python3 -m venv .venv && .venv/bin/pip install -e ".[dev]"', ".venv/bin/python -m pytest"):
        assert f"```bash\n{command}\n```" in README, f"the README no longer shows {command!r} as its own block"
        assert command in ci_lines, f".ci/run no longer runs {command!r} as a line of its own"


def test_the_readmes_links_lead_somewhere():
    """mkdocs checks the site's links; the README is outside the site, so its relative links are checked here."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    relative = [link for link in links if "://" not in link]
    assert relative, "the README links to no docs page"
    missing = [link for link in relative if not (ROOT / link).exists()]
    assert not missing, f"README links to files that are not there: {missing}"


def _prose() -> dict[str, str]:
    """The hand-written docs: every page under docs/ (the generated CLI page is a stub), the README, CONTRIBUTING."""
    pages = {str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "docs").rglob("*.md")}
    return {**pages, "README.md": README, "CONTRIBUTING.md": (ROOT / "CONTRIBUTING.md").read_text()}


def test_every_page_says_how_we_know():
    """Each subject page ends with the tests and results behind it."""
    exempt = {"docs/index.md", "docs/results.md", "docs/contributing.md", "docs/reference/cli.md",
              "docs/reference/python.md"}
    missing = [name for name, text in _prose().items()
               if name.startswith("docs/") and name not in exempt and "**How we know.**" not in text]
    assert not missing, f"pages without a 'How we know' footer: {missing}"


def test_the_tests_the_docs_name_exist():
    """A footer that names a test file (or file::test) that is gone would claim evidence that is not there."""
    gone = []
    for name, text in _prose().items():
        for path, test in set(re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", text)):
            if not (ROOT / path).is_file():
                gone.append(f"{name}: {path}")
            elif test and f"def {test}(" not in (ROOT / path).read_text():
                gone.append(f"{name}: {path}::{test}")
        for short in re.findall(r"`(test_fault_\w+\.py)`", text):
            if not (ROOT / "tests" / "faults" / short).is_file():
                gone.append(f"{name}: tests/faults/{short}")
    assert not gone, "docs name tests that do not exist:\n" + "\n".join(sorted(gone))
