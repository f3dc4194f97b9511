"""The Airflow UI in a real headless Chromium, against the real local stack.

Logs in, opens the digits DAG, triggers it through the trigger form with a
changed parameter, waits for the run to succeed, then opens the tideflow page
(inside Airflow's navigation and on its own). The stack runs as ``make demo``
runs it: the lab cluster of two teams and the broker DAG on a compressed
diurnal load; the demo's teams story (the broker lends, vision borrows, the
broker reclaims with a checkpoint) runs through the broker DAG, and the page
must show it. Screenshots go to ``out/browser/`` (or
``$TIDEFLOW_TEST_OUTPUT/browser``).

Needs Debian's ``chromium`` and ``chromium-driver`` (``make browser`` installs
them). Without them the test is skipped, unless ``TIDEFLOW_REQUIRE_BROWSER=1``
(set by CI), where their absence is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tideflow.stack.airflow_api import AirflowApi

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
CHANGED_EPOCHS = 4


def _browser_missing() -> str | None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package")
    return ", ".join(missing) or None


@pytest.fixture(scope="module")
def shots(repo: Path) -> Path:
    root = Path(os.environ.get("TIDEFLOW_TEST_OUTPUT", repo / "out"))
    directory = root / "browser"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = _browser_missing()
    if missing:
        if os.environ.get("TIDEFLOW_REQUIRE_BROWSER") == "1":
            pytest.fail(f"browser test required but missing: {missing} (run `make browser`)")
        pytest.skip(f"needs {missing}; `make browser` installs them")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="tideflow-chromium-")
    for flag in (
        "--headless=new",
        "--no-sandbox",  # runs as root in CI containers
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1440,1000",
        f"--user-data-dir={profile}",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _wait(driver: Any, condition: Any, timeout_s: float = 30) -> Any:
    """Wait for ``condition`` to be truthy; React re-renders make found elements go stale,
    and a lookup made while the app redirects (to its login page, say) is aborted."""
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
        WebDriverException,
    )
    from selenium.webdriver.support.ui import WebDriverWait

    def settled(d: Any) -> Any:
        try:
            return condition(d)
        except WebDriverException as exc:
            if "aborted by navigation" in str(exc):
                return False  # the page was replaced under the lookup: look again
            raise

    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(driver, timeout_s, ignored_exceptions=ignored).until(settled)


def _click(driver: Any, find: Any, timeout_s: float = 30) -> None:
    """Find and click in one retried step, so a re-render between the two does no harm."""

    def found_and_clicked(d: Any) -> bool:
        element = find(d)
        if not element:
            return False
        element.click()
        return True

    _wait(driver, found_and_clicked, timeout_s)


def _button(driver: Any, text: str, within: Any = None) -> Any:
    from selenium.webdriver.common.by import By

    scope = within or driver
    found = [b for b in scope.find_elements(By.TAG_NAME, "button") if b.text.strip() == text]
    return found[-1] if found else False


def _tab(driver: Any, text: str) -> Any:
    from selenium.webdriver.common.by import By

    found = [
        e
        for e in driver.find_elements(By.CSS_SELECTOR, "a, button, [role=tab]")
        if e.text.strip() == text
    ]
    return found[0] if found else False


def _set_input(driver: Any, name: str, value: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    field = _wait(driver, lambda d: d.find_element(By.NAME, name))
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.BACKSPACE)
    field.send_keys(value)


def _log_in(browser: Any, base: str, user: str, password: str, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{base}/")
    _wait(browser, lambda d: d.find_element(By.NAME, "username")).send_keys(user)
    browser.find_element(By.NAME, "password").send_keys(password)
    browser.save_screenshot(str(shots / "01-login.png"))
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    _wait(browser, lambda d: "/auth/login" not in d.current_url)


def _trigger_through_the_form(browser: Any, base: str, api: AirflowApi, shots: Path) -> Any:
    """Trigger digits from its trigger form with a changed epochs field; the new run's record."""
    from selenium.webdriver.common.by import By

    browser.get(f"{base}/dags/digits")
    trigger = "button[aria-label='Trigger Dag']"
    _click(browser, lambda d: d.find_element(By.CSS_SELECTOR, trigger))
    _set_input(browser, "element_epochs", str(CHANGED_EPOCHS))
    dialog = _wait(
        browser, lambda d: d.find_element(By.CSS_SELECTOR, "[role=dialog]:not([hidden])")
    )
    browser.save_screenshot(str(shots / "02-trigger-form.png"))
    before = {run["dag_run_id"] for run in api.dag_runs("digits")}
    _click(browser, lambda d: _button(d, "Trigger", dialog))
    deadline = time.monotonic() + 60
    new: list[dict[str, Any]] = []
    while not new and time.monotonic() < deadline:
        new = [r for r in api.dag_runs("digits") if r["dag_run_id"] not in before]
        time.sleep(1)
    assert len(new) == 1, "the trigger form created no run"
    return new[0]


def _step_away(browser: Any) -> None:
    """Leave the open page while the test waits minutes for the stack: Airflow's pages
    poll the API server and re-render, a third of a core or more between the renderer and
    the server, taken from the run waited for on a small machine."""
    browser.get("about:blank")


def _show_mlflow_metrics(browser: Any) -> None:
    """Cosmetic, for the screenshot: close MLflow's assistant panel, scroll to the metrics."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    try:
        for button in browser.find_elements(By.CSS_SELECTOR, "button[aria-label*='lose']"):
            if button.is_displayed():
                button.click()
        heading = browser.find_elements(By.XPATH, "//*[normalize-space()='Metrics']")
        if heading:
            browser.execute_script("arguments[0].scrollIntoView({block: 'start'})", heading[0])
        time.sleep(1)
    except WebDriverException:
        pass


def test_trigger_digits_from_the_ui_and_open_the_tideflow_page(
    browser: Any, stack: Any, shots: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from selenium.webdriver.common.by import By

    base = stack.services["airflow"].url
    api = AirflowApi(base, stack.airflow_user, stack.airflow_password)
    api.wait_for_dag("digits", timeout_s=180)
    api.unpause("digits")

    # 1. Log in through Airflow's login page.
    _log_in(browser, base, stack.airflow_user, stack.airflow_password, shots)

    # 2. Trigger digits through its form with a changed parameter; wait for success.
    run = _trigger_through_the_form(browser, base, api, shots)
    assert run["conf"]["epochs"] == CHANGED_EPOCHS, json.dumps(run["conf"])
    _step_away(browser)
    assert api.wait_for_run("digits", run["dag_run_id"], timeout_s=600) == "success"
    quoted = urllib.parse.quote(run["dag_run_id"], safe="")
    browser.get(f"{base}/dags/digits/runs/{quoted}")
    _wait(browser, lambda d: "success" in d.find_element(By.TAG_NAME, "body").text.lower())
    browser.save_screenshot(str(shots / "03-run-succeeded.png"))

    # 3. The train task's "MLflow run" extra link leads to its MLflow run.
    browser.get(f"{base}/dags/digits/runs/{quoted}/tasks/train")
    _click(browser, lambda d: _tab(d, "Details"))
    link = _wait(browser, lambda d: d.find_element(By.XPATH, "//a[normalize-space()='MLflow run']"))
    href = link.get_attribute("href")
    assert href == api.extra_links("digits", run["dag_run_id"], "train")["MLflow run"]
    assert href.startswith(stack.services["mlflow"].url + "/#/experiments/")
    browser.save_screenshot(str(shots / "04-task-extra-link.png"))
    browser.get(href)
    _wait(browser, lambda d: "final_val_accuracy" in d.find_element(By.TAG_NAME, "body").text, 60)
    _show_mlflow_metrics(browser)
    browser.save_screenshot(str(shots / "05-mlflow-run.png"))

    # 4. The demo's teams story through the broker DAG: the broker lends, vision's
    #    gang borrows inference's idle GPU, the load climbs, the ledger reclaims it.
    from tideflow.stack.__main__ import team_demo
    from tideflow.stack.team_story import BROKER_ENV

    for name, value in BROKER_ENV.items():  # as `make demo` tells the story
        monkeypatch.setenv(name, value)
    _step_away(browser)
    assert team_demo(stack, api), "the broker reclaimed nothing within the demo's time"

    # 5. The tideflow page inside Airflow's navigation (an iframe of /tideflow/).
    browser.get(f"{base}/plugin/tideflow")
    frame = _wait(browser, lambda d: d.find_element(By.TAG_NAME, "iframe"))
    browser.switch_to.frame(frame)
    _wait(browser, lambda d: d.find_element(By.ID, "pipelines"))
    text = browser.find_element(By.TAG_NAME, "body").text
    assert run["dag_run_id"] in text and "digits-classifier" in text
    browser.switch_to.default_content()
    browser.save_screenshot(str(shots / "06-tideflow-in-airflow.png"))

    # 6. And on its own, with the session cookie of the login above.
    browser.get(f"{base}/tideflow/")
    _wait(browser, lambda d: d.find_element(By.ID, "champions"))
    assert "digits-classifier" in browser.find_element(By.ID, "champions").text
    broker = browser.find_element(By.ID, "broker")
    assert broker.find_elements(By.TAG_NAME, "svg") and "grow" in broker.text
    assert "broker/inference/" in browser.find_element(By.ID, "leases").text
    teams = browser.find_element(By.ID, "teams").text
    assert "inference" in teams and "vision" in teams
    journal = browser.find_element(By.ID, "preemptions").text
    assert "digits/team-story/train" in journal and "reclaimed by its lender inference" in journal
    assert browser.find_element(By.ID, "queue").is_displayed()
    browser.save_screenshot(str(shots / "07-tideflow-page.png"))
