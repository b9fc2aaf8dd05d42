"""The docs site covers every public name, and its API tables say what the docstrings say.

The site is built once (strict, offline) into a temporary folder; the tests read its HTML.
"""

import ast
import html
import importlib
import inspect
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "hooks"))
from api import public_names, summary  # noqa: E402


def module_name(path: Path) -> str:
    """The import name of a source file under `packages/dew/src`."""
    parts = path.relative_to(ROOT / "packages/dew/src").with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# Every public core module, found on disk: a new one must declare `__all__` and be documented.
CORE = sorted(
    module_name(path)
    for path in (ROOT / "packages/dew/src/dew").rglob("*.py")
    if not path.name.startswith("_") or path.name == "__init__.py"
)
# The core page that renders each module, from the pages' API markers.
CORE_PAGES = {
    match[1]: f"api/core/{page.stem}/index.html"
    for page in sorted((ROOT / "docs/api/core").glob("*.md"))
    for match in re.finditer(r"<!-- api: ([\w.]+)", page.read_text())
}
# Each documented module and the page that renders it.
PAGES = {
    "dew.rl": "api/rl/index.html",
    "dew.objectives.rl": "api/objectives/index.html",
    **{module: CORE_PAGES.get(module, "(no page)") for module in CORE},
}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    mkdocs = shutil.which("mkdocs")
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (the docs dependency group)")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(mkdocs).parent)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out


class TableReader(HTMLParser):
    """The rows of the first table whose header is Name | Summary, as (name, href, summary)."""

    def __init__(self):
        super().__init__()
        self.tables: list[list[list[tuple[str, str]]]] = []
        self.cell: list[str] | None = None
        self.href = ""

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell, self.href = [], ""
        elif tag == "a" and self.cell is not None:
            self.href = self.href or dict(attrs).get("href", "")

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.tables[-1][-1].append(("".join(self.cell).strip(), self.href))
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)

    def summary_rows(self, module: str) -> list[tuple[str, str, str]]:
        """The rows of the Name | Summary table whose links point into `module`."""
        for table in self.tables:
            if not table or [text for text, _ in table[0]] != ["Name", "Summary"]:
                continue
            rows = [(name, href, text) for (name, href), (text, _) in table[1:]]
            if rows and rows[0][1].rpartition(".")[0] == f"#{module}":
                return rows
        raise AssertionError(f"no Name | Summary table of {module} on the page")


def plain(markdown: str) -> str:
    """A docstring summary as the browser shows it: code spans lose their backticks."""
    return re.sub(r"`([^`]*)`", r"\1", markdown)


@pytest.mark.parametrize("module", PAGES)
def test_the_summary_table_has_a_row_per_public_callable(site, module):
    reader = TableReader()
    reader.feed((site / PAGES[module]).read_text())
    rows = reader.summary_rows(module)
    callables, _ = public_names(module)
    assert [name for name, _, _ in rows] == callables
    imported = importlib.import_module(module)
    for name, href, text in rows:
        assert href == f"#{module}.{name}"
        assert html.unescape(text) == plain(summary(getattr(imported, name)))


# The reference page's (../shared/spec/dew-rl-reference.md) thirteen summaries, the
# specification's words: the dew.rl table must keep them as they are.
REFERENCE_SUMMARIES = {
    "behavior_importance_weights": "Detached token TIS weights from recorded raw and behavior "
    "policies.",
    "clipped_surrogate": "Token-mean reduction of the dual-clipped policy terms.",
    "clipped_value_loss_terms": "verl d040717 compute_value_loss, before its token-mask reduction.",
    "gae": "Generalized advantage estimation over [B, T] rewards and values.",
    "group_advantage": "Group-relative advantage of [B] rewards, group completions per prompt.",
    "k3_kl": "Schulman's k3 estimator of KL(pi || pi_ref), per token.",
    "masked_mean": "Mean of x over the positions mask keeps.",
    "masked_whiten": "x centred and scaled by its masked mean and unbiased deviation.",
    "preference_logsigmoid": "Pair-mean reduction of the DPO sigmoid loss.",
    "rloo_advantage": "Each completion against the mean of the rest of its group.",
    "sequence_log_ratio": "GSPO's sequence-level log ratio, carrying a per-token gradient.",
    "token_log_ratio": "Per-token log pi(a) - log pi_old(a), clamped to +-20.",
    "token_mean": "Sum over the unmasked positions of x, divided by how many there are.",
}


def test_the_rl_page_lists_the_reference_pages_thirteen_and_more():
    callables, constants = public_names("dew.rl")
    assert set(REFERENCE_SUMMARIES) <= set(callables)
    assert constants == ["GROUP_EPS"]


def test_the_rl_table_keeps_the_reference_pages_thirteen_summaries(site):
    reader = TableReader()
    reader.feed((site / PAGES["dew.rl"]).read_text())
    shown = {name: html.unescape(text) for name, _, text in reader.summary_rows("dew.rl")}
    assert {name: shown[name] for name in REFERENCE_SUMMARIES} == REFERENCE_SUMMARIES


def test_the_reference_summaries_are_the_reference_pages_own():
    spec = ROOT.parent / "shared" / "spec" / "dew-rl-reference.md"
    if not spec.is_file():
        pytest.skip("../shared/spec is not beside this checkout")
    table = spec.read_text().split("Name\tSummary\n", 1)[1].split("\n\n", 1)[0]
    rows = dict(line.split("\t") for line in table.splitlines())
    assert {name: text.replace("\u2019", "'") for name, text in rows.items()} == REFERENCE_SUMMARIES


# A signature's parameter lines (those directly inside its outermost brackets) each start with a
# parameter; one that starts otherwise is a wrapped annotation (`| None = None,`), which reads as
# a parameter without a name. Lines inside a nested bracket (a wrapped default) may start anyhow.
PARAMETER_LINE = re.compile(r"\s*(\*{0,2}\w+\s*([:=,]|$)|\*,?$|/,?$|\))")


def nameless_parameter_lines(signature: str) -> list[str]:
    """The lines of a rendered signature that sit where a parameter is due but name none.

    Only a callable's signature (`name(` on its first line) has parameters: a constant's value
    (`AXIS = "data"`, a dict over several lines) has none.
    """
    lines = signature.strip().splitlines()
    if not re.match(r"\w+\($", lines[0]):
        return []
    depth, wrong = 0, []
    for line in lines:
        if depth == 1 and not PARAMETER_LINE.match(line):
            wrong.append(line)
        code = re.sub(r"\"[^\"]*\"|'[^']*'", "", line)
        depth += len(re.findall(r"[(\[{]", code)) - len(re.findall(r"[)\]}]", code))
    return wrong


@pytest.mark.parametrize("module", PAGES)
def test_every_signature_line_names_its_parameter(site, module):
    page = (site / PAGES[module]).read_text()
    signatures = re.findall(r'<div class="doc-signature highlight"><pre>(.*?)</pre>', page, re.S)
    assert signatures
    for signature in signatures:
        text = html.unescape(re.sub(r"<[^>]+>", "", signature))
        assert nameless_parameter_lines(text) == [], f"{module}:\n{text}"


def test_the_signature_check_finds_a_wrapped_union():
    wrapped = "train(\n    config: C,\n    *,\n    hook: Callable[[int]]\n    | None = None,\n)"
    assert nameless_parameter_lines(wrapped) == ["    | None = None,"]
    default = 'DPO(\n    loss_type: str = option(\n        "sigmoid", flag="loss"\n    ),\n)'
    assert nameless_parameter_lines(default) == []
    assert nameless_parameter_lines('AXIS = {\n    "a": 1,\n}') == []


def test_the_hooks_are_not_published(site):
    assert not (site / "hooks").exists()
    assert not list(site.rglob("*.py"))


@pytest.mark.parametrize("page", ["index.html", "training/index.html"])
def test_the_wide_tables_stack_on_a_phone(site, page):
    """The home page's distributions and the training page's flags: div.narrow-stack."""
    text = (site / page).read_text()
    assert re.search(r'<div class="narrow-stack">\s*<table>', text), page
    css = (ROOT / "docs" / "assets" / "math.css").read_text()
    assert ":is(.api-summary, .narrow-stack) table:not([class]) td {" in css


@pytest.mark.parametrize("module", PAGES)
def test_every_public_name_has_its_anchor_in_the_site(site, module):
    page = (site / PAGES[module]).read_text()
    for name in importlib.import_module(module).__all__:
        assert f'id="{module}.{name}"' in page, name


@pytest.mark.parametrize("module", PAGES)
def test_long_names_break_between_words_and_summary_tables_can_stack(site, module):
    """Headings and contents entries break a name only after `_`; the table stacks on a phone."""
    page = (site / PAGES[module]).read_text()
    names = re.findall(
        r'<span class="(?:doc doc-object-name[^"]*|md-ellipsis)">(.*?)</span>', page, re.S
    )
    assert names
    for name in names:
        assert "_" not in name.replace("_<wbr>", ""), name
    assert page.count('<div class="api-summary">') == page.count("<th>Summary</th>")


def test_a_flag_in_inline_code_is_never_split_at_its_hyphens(site):
    page = (site / "objectives/index.html").read_text()
    assert '<code>dew train <span class="nowrap">--objective</span> NAME</code>' in page
    assert not re.search(r"(?<!<span></span>)<code>[^<]*--", page)


@pytest.mark.parametrize("module", PAGES)
def test_every_public_callable_has_a_docstring_with_a_summary_and_an_example(module):
    imported = importlib.import_module(module)
    for name in public_names(module)[0]:
        obj = getattr(imported, name)
        doc = inspect.getdoc(obj) or ""
        assert summary(obj).endswith("."), f"{module}.{name}: summary line {summary(obj)!r}"
        if inspect.isfunction(obj):
            assert ">>> " in doc, f"{module}.{name} has no example"
        if module == "dew.rl":
            assert "\nReference: " in doc, f"{module}.{name} has no Reference: line"


def test_the_site_fetches_nothing_from_the_network(site):
    for page in site.rglob("*.html"):
        text = page.read_text()
        assert "fonts.googleapis.com" not in text, page
        assert not re.search(r'<script[^>]+src="https?://', text), page
        assert not re.search(r'<link[^>]+href="https?://[^"]+\.css', text), page


def test_the_benchmarks_page_shows_every_measured_function(site):
    page = (site / "benchmarks/index.html").read_text()
    text = html.unescape(re.sub(r"<[^>]+>", " ", page))
    callables, _ = public_names("dew.rl")
    for b, t in ((64, 512), (256, 4096), (1024, 8192)):
        assert f"{b} x {t}" in text
    for name in callables:
        # one row per size, forward at least
        assert text.count(f" {name} ") >= 3, name
    assert "where_scan_whitened_time_major" in text and "time to mean reward 0.95" in text


def _reliability_section() -> str:
    """The Reliability section of the training page, up to the next `## ` heading."""
    page = (ROOT / "docs" / "training.md").read_text()
    return page.split("\n## Reliability\n", 1)[1].split("\n## ", 1)[0]


def _defined_tests(path: Path) -> set[str]:
    """The test functions `path` defines at its top level."""
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_every_test_the_reliability_table_names_exists():
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", _reliability_section())
    assert len(named) >= 20, "the table lost its rows, or the pattern no longer reads them"
    missing = [
        f"{path}::{test}"
        for path, test in named
        if not (ROOT / path).is_file() or test not in _defined_tests(ROOT / path)
    ]
    assert missing == []


def test_every_row_of_the_reliability_tables_names_a_test():
    rows = [
        line
        for line in _reliability_section().splitlines()
        if line.startswith("| ") and not line.startswith("| ---")
    ]
    headers = {row for row in rows if "held by |" in row}
    unheld = [row for row in rows if row not in headers and "::test_" not in row.split("|")[-2]]
    assert len(headers) == 3 and unheld == []
