"""GPU usage people can see: the admin's page /hub/gpulab/usage (by user, project and
GPU, over a chosen window, with a CSV export) and each user's own line on the home page
("GPU this week: 4.5 h of 20 h"). Figures from records appended to the real hub's
usage ledger; the words with budgets and holdings under way from real files."""

from __future__ import annotations

import csv
import io
import re
import time
from pathlib import Path

import pytest
import requests
from browser_kit import DOCS_IMG, SHOTS
from hubclient import HubUser
from playwright.sync_api import expect
from security.people import log_in_admin, make_user

from gpulab_hub import gpus, hubsettings
from gpulab_hub.db import engine as db_engine
from gpulab_hub.db import migrate, tables
from gpulab_hub.gpus import allocator, usage
from gpulab_hub.home import facts
from gpulab_hub.usagepage import report

HOUR = 3600.0
ALICE, BOB, CAROL = "usealice", "usebob", "usecarol"  # carol holds no GPU, ever
H100 = "GPU 0 (NVIDIA H100 80GB HBM3)"
UUID0 = "GPU-0000aaaa-1111-2222-3333-444455556666"
UUID1 = "GPU-1111bbbb-1111-2222-3333-444455556666"
FORMULA_LABEL = "+SUM(A1)"  # a label the ledger keeps, which a spreadsheet would run
FORMULA_OWNER = "=HYPERLINK(evil)"  # a name the ledger refuses: the line is skipped


# --- the words, on real files (no hub) ---


def settings(tmp_path: Path, budgets: dict | None = None) -> hubsettings.Layout:
    (tmp_path / "hub").mkdir(exist_ok=True)
    where = hubsettings.Layout(
        records_dir=tmp_path / "hub",
        projects_root=tmp_path / "projects",
        data_root=tmp_path / "data",
        state_root=tmp_path / "hub" / "projects",
        allocations_file=tmp_path / "hub" / "gpu-allocations.json",
        image_repo="gpulab/project",
        base_image="gpulab/base:latest",
        allowed_base_images=("gpulab/base:latest",),
        prefix="gpulab",
        network="gpulab-net",
        budget_hours=tuple(sorted((budgets or {}).items())),
    )
    migrate.upgrade(where.db_url)  # the hub's database, as a start leaves it
    return where


def test_home_words_count_the_week_the_budget_and_the_holding_under_way(tmp_path, monkeypatch):
    w = settings(tmp_path, {"*": 40.0, "group:students": 20.0, "dana": 100.0})
    now = time.time()
    usage.of_layout(w).append(
        [
            usage.Record("erin", "train", UUID0, H100, now - 5 * HOUR, now - 3 * HOUR, 80.0),
            usage.Record("erin", "old", UUID0, H100, now - 9 * 24 * HOUR, now - 8 * 24 * HOUR),
        ]
    )
    # erin's other project holds GPU 1 since 90 minutes ago, still running
    device = gpus.Device(index="1", uuid=UUID1, name="NVIDIA H100 80GB HBM3",
                         memory_total=80 << 30, capability="9.0")  # fmt: skip
    store = allocator.AllocationStore(w.allocations_file, clock=lambda: now - 1.5 * HOUR)
    store.allocate([device], allocator.Request("erin", "eval", count=1), allocator.Policy())
    monkeypatch.setattr(facts, "_device_names", lambda: {UUID1: "GPU 1 (NVIDIA H100)"})

    assert facts.gpu_use(w, "erin", ["students"]) == "GPU this week: 3.5 h of 20 h"
    assert facts.gpu_use(w, "erin", []) == "GPU this week: 3.5 h of 40 h"
    assert facts.gpu_use(w, "dana", ["students"]) == "GPU this week: 0.0 h of 100 h"
    assert facts.gpu_use(settings(tmp_path), "erin", []) == "GPU this week: 3.5 h"


def test_a_cpu_only_host_says_nothing_to_who_never_held_a_gpu(tmp_path, monkeypatch):
    w = settings(tmp_path, {"*": 40.0})
    now = time.time()
    old = now - 20 * 24 * HOUR
    record = usage.Record("erin", "p", UUID0, H100, old, old + HOUR)
    usage.of_layout(w).append([record])
    monkeypatch.setattr(facts, "_device_names", dict)
    assert facts.gpu_use(w, "frank", []) == ""
    assert facts.gpu_use(w, "erin", []) == "GPU this week: 0.0 h of 40 h"  # has a record
    monkeypatch.setattr(facts, "_device_names", lambda: {UUID0: H100})
    assert facts.gpu_use(w, "frank", []) == "GPU this week: 0.0 h of 40 h"  # a GPU host


def test_the_report_counts_holdings_under_way_by_user_project_and_gpu(tmp_path):
    w = settings(tmp_path, {ALICE: 2.0})
    now = time.time()
    usage.of_layout(w).append(
        [usage.Record(ALICE, "train", UUID0, H100, now - 3 * HOUR, now - HOUR, 50.0)]
    )
    device = gpus.Device(index="0", uuid=UUID0, name="NVIDIA H100 80GB HBM3",
                         memory_total=80 << 30, capability="9.0")  # fmt: skip
    store = allocator.AllocationStore(w.allocations_file, clock=lambda: now - HOUR)
    store.allocate([device], allocator.Request(BOB, "sweep", count=1), allocator.Policy())
    r = report.build(w, "24h", {}, labels=lambda: {UUID0: H100}, now=now)
    assert [(u.key, round(u.hours, 3), u.under_way, u.over) for u in r.users] == [
        ((ALICE,), 2.0, 0, True),
        ((BOB,), 1.0, 1, False),
    ]
    assert [(p.key, p.under_way) for p in r.projects] == [
        ((ALICE, "train"), 0),
        ((BOB, "sweep"), 1),
    ]
    [gpu] = r.gpus
    assert (gpu.key, round(gpu.hours, 3), gpu.holdings, gpu.under_way) == ((H100, UUID0), 3.0, 1, 1)
    assert gpu.avg_util == "50 %"  # the holding under way has no measure yet


# --- the real hub ---


@pytest.fixture(scope="module")
def people(hub):
    admin = log_in_admin(hub)
    return {"admin": admin, **{n: make_user(hub, admin, n) for n in (ALICE, BOB, CAROL)}}


@pytest.fixture(scope="module")
def ledger(hub) -> str:
    """Holdings appended to the hub's own ledger, as the spawner appends them at a stop:
    alice 3 h + 1.5 h this week, bob 2 h ten days ago on a GPU labelled like a formula;
    and a line naming an owner gpulab refuses (a spreadsheet formula)."""
    url = f"sqlite:///{hub.home / 'hub' / 'jupyterhub.sqlite'}"  # the hub's database
    end = time.time() - HOUR
    ten_days = time.time() - 10 * 24 * HOUR
    usage.UsageLedger(url).append(
        [
            usage.Record(ALICE, "train", UUID0, H100, end - 3 * HOUR, end, 40.0),
            usage.Record(ALICE, "eval", UUID1, "GPU 1 (NVIDIA H100)", end - 1.5 * HOUR, end),
            usage.Record(BOB, "sweep", UUID1, FORMULA_LABEL, ten_days - 2 * HOUR, ten_days),
        ]
    )
    bad = {"owner": FORMULA_OWNER, "project": "x", "uuid": UUID0, "label": "",
           "started": end - HOUR, "ended": end, "util": None}  # fmt: skip
    with db_engine.begin(url) as conn:  # a row written by hand, past gpulab's checks
        conn.execute(tables.usage.insert(), bad)
    return url


def get(who: HubUser | None, hub, path: str) -> requests.Response:
    http = who.http if who is not None else requests
    return http.get(f"{hub.url}/hub/gpulab/{path}", allow_redirects=False, timeout=30)


def row_text(html: str, css_class: str, attr: str) -> str:
    m = re.search(rf'<tr class="{css_class}" {attr}>(.*?)</tr>', html, re.S)
    assert m, f"no row {css_class} {attr}"
    return " ".join(re.sub(r"<[^>]+>", " ", m.group(1)).split())


@pytest.mark.docker
@pytest.mark.usefixtures("show_logs_on_failure")
def test_only_admins_see_the_page_and_its_csv(hub, people, ledger):
    for path in ("usage", "usage?window=30d", "usage.csv?window=7d"):
        anonymous = get(None, hub, path)
        assert anonymous.status_code == 302, path
        assert "/hub/login" in anonymous.headers["Location"]
        refused = get(people[CAROL], hub, path)
        assert refused.status_code == 403, path
        assert ALICE not in refused.text and "train" not in refused.text
        assert get(people["admin"], hub, path).status_code == 200, path
    home_of_carol = people[CAROL].http.get(f"{hub.url}/hub/home", timeout=30).text
    assert "gpulab/usage" not in home_of_carol
    home_of_admin = people["admin"].http.get(f"{hub.url}/hub/home", timeout=30).text
    assert 'href="/hub/gpulab/usage" data-gpulab="nav-usage">GPU usage</a>' in home_of_admin


@pytest.mark.docker
@pytest.mark.usefixtures("show_logs_on_failure")
def test_a_window_off_the_list_is_refused(hub, people):
    for window in ("1y", "7d%0A", "../7d", "7D", ""):
        for path in ("usage", "usage.csv"):
            r = get(people["admin"], hub, f"{path}?window={window}")
            assert r.status_code == 400, (path, window)
            assert "Choose a window of 24h, 7d, 30d" in r.text


@pytest.mark.docker
@pytest.mark.usefixtures("show_logs_on_failure")
def test_the_table_by_user_project_and_gpu(hub, people, ledger):
    week = get(people["admin"], hub, "usage?window=7d")
    assert week.status_code == 200
    html = week.text
    assert "the last 7 days" in html
    assert row_text(html, "usage-user", f'data-user="{ALICE}"').startswith(f"{ALICE} 4.5 h 2")
    assert f'data-user="{BOB}"' not in html  # ten days ago
    assert row_text(html, "usage-project", f'data-owner="{ALICE}" data-project="train"') == (
        f"{ALICE} train 3.0 h 1"
    )
    assert row_text(html, "usage-project", f'data-owner="{ALICE}" data-project="eval"') == (
        f"{ALICE} eval 1.5 h 1"
    )
    gpu0 = row_text(html, "usage-gpu", f'data-uuid="{UUID0}"')
    assert gpu0.startswith(f"{H100} {UUID0} 3.0 h 1") and gpu0.endswith("40 %"), gpu0
    assert "are no GPU usage record and were skipped" in html  # the refused owner's row
    assert "HYPERLINK" not in html
    assert 'href="/hub/gpulab/usage.csv?window=7d"' in html

    month = get(people["admin"], hub, "usage?window=30d").text
    assert row_text(month, "usage-user", f'data-user="{BOB}"').startswith(f"{BOB} 2.0 h 1")
    assert row_text(month, "usage-gpu", f'data-uuid="{UUID1}"').startswith(
        f"GPU 1 (NVIDIA H100) {UUID1} 3.5 h 2"
    )  # the GPU's latest words name it
    assert 'href="/hub/gpulab/usage.csv?window=30d"' in month


@pytest.mark.docker
@pytest.mark.usefixtures("show_logs_on_failure")
def test_the_csv_is_a_download_no_spreadsheet_runs(hub, people, ledger):
    r = get(people["admin"], hub, "usage.csv?window=30d")
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/csv")
    assert re.fullmatch(
        r'attachment; filename="gpulab-gpu-usage-30d-\d{8}\.csv"', r.headers["Content-Disposition"]
    )
    rows = list(csv.reader(io.StringIO(r.text)))
    assert rows[0] == ["user", "project", "gpu", "gpu_uuid", "from", "to", "gpu_hours", "avg_util"]
    mine = {(row[0], row[1]): row for row in rows[1:] if row[0] in (ALICE, BOB)}
    assert mine[(ALICE, "train")][2:4] == [H100, UUID0]
    assert mine[(ALICE, "train")][6:] == ["3.000", "40.0"]
    assert mine[(BOB, "sweep")][2] == "'" + FORMULA_LABEL  # text, not a formula
    assert "HYPERLINK" not in r.text  # the ledger refused that owner's line
    assert not [c for row in rows for c in row if c[:1] in ("=", "+", "-", "@")]
    week = list(csv.reader(io.StringIO(get(people["admin"], hub, "usage.csv?window=7d").text)))
    assert BOB not in {row[0] for row in week}


@pytest.mark.docker
@pytest.mark.usefixtures("show_logs_on_failure")
def test_each_user_sees_their_own_use_on_the_home_page(hub, people, ledger):
    def line(who: str) -> str | None:
        html = people[who].http.get(f"{hub.url}/hub/home", timeout=30).text
        m = re.search(r'<p class="text-body-secondary" id="gpu-use">([^<]*)</p>', html)
        return m.group(1) if m else None

    assert line(ALICE) == "GPU this week: 4.5 h"  # the session hub sets no budget
    assert line(BOB) == "GPU this week: 0.0 h"  # a record, but not this week
    gpu_host = bool(gpus.inventory().devices)
    assert line(CAROL) == ("GPU this week: 0.0 h" if gpu_host else None)


@pytest.mark.docker
@pytest.mark.browser
@pytest.mark.usefixtures("show_logs_on_failure")
def test_the_admin_opens_the_page_from_the_nav_bar(hub, people, ledger, browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(20_000)
    page = context.new_page()
    try:
        page.goto(f"{hub.url}/hub/login")
        page.get_by_label("Username").fill("admin")
        page.get_by_label("Password").fill(hub.admin_password)
        page.get_by_role("button", name="Sign In").click()
        expect(page).to_have_url(re.compile(r".*/hub/(home|admin).*"))
        page.locator('[data-gpulab="nav-usage"]').click()
        expect(page).to_have_url(f"{hub.url}/hub/gpulab/usage")
        page.get_by_role("link", name="the last 30 days").click()
        expect(page).to_have_url(f"{hub.url}/hub/gpulab/usage?window=30d")
        expect(page.locator(f'tr.usage-user[data-user="{BOB}"]')).to_contain_text("2.0 h")
        page.screenshot(path=SHOTS / "usage-page.png", full_page=True)
        with page.expect_download() as download:
            page.locator("#usage-csv").click()
        assert download.value.suggested_filename.startswith("gpulab-gpu-usage-30d-")
    finally:
        context.close()
    assert (SHOTS / "usage-page.png").stat().st_size > 10_000
    assert DOCS_IMG.is_dir()  # docs/img/usage-page.png is copied from a passing run
